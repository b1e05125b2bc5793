"""Training tier (chapters 6-8, and the training of 10 and 11): batches,
losses and objectives, the schedule, the one training step, the one
loop, checkpoints and data parallelism.

Built on the core (the model, masks and decoding); nothing in the core
imports this package.
"""

from transformer_lite.training.batch import Batch, Examples
from transformer_lite.training.checkpoint import (
    average_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from transformer_lite.training.loop import History, evaluate, fit, train_epoch
from transformer_lite.training.loss import LabelSmoothingLoss
from transformer_lite.training.objectives import seq2seq_loss, supervised_loss
from transformer_lite.training.schedule import noam_lr, noam_scheduler
from transformer_lite.training.step import (
    TrainOptions,
    autocast,
    check_amp,
    grad_scaler,
    train_step,
)

__all__ = [
    "Batch",
    "Examples",
    "History",
    "LabelSmoothingLoss",
    "TrainOptions",
    "autocast",
    "average_checkpoints",
    "check_amp",
    "evaluate",
    "fit",
    "grad_scaler",
    "load_checkpoint",
    "noam_lr",
    "noam_scheduler",
    "save_checkpoint",
    "seq2seq_loss",
    "supervised_loss",
    "train_epoch",
    "train_step",
]
