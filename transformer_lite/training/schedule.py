"""The Noam learning-rate schedule (chapter 6): warm up, then decay."""

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from transformer_lite.checks import check_int, check_real

__all__ = ["NoamLambda", "noam_lr", "noam_scheduler"]


def noam_lr(
    step: int, d_model: int, warmup: int, factor: float = 1.0
) -> float:
    """factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).

    Linear warm-up for ``warmup`` steps, then decay as 1/sqrt(step)
    (Vaswani et al., 2017, eq. 3); the peak, at step == warmup, is
    factor / sqrt(d_model * warmup). Step 0 counts as step 1.
    """
    check_int("step", step, low=0)
    check_int("d_model", d_model, low=1)
    check_int("warmup", warmup, low=1)
    if not check_real("factor", factor, low=0.0) > 0:
        raise ValueError(f"factor must be positive, got {factor!r}")
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


class NoamLambda:
    """LambdaLR's multiplier: noam_lr(steps taken + 1) / base_lr.

    A callable object rather than a lambda, so that the scheduler's
    ``state_dict`` stores these settings as plain numbers.
    """

    def __init__(
        self, d_model: int, warmup: int, factor: float, base_lr: float
    ) -> None:
        noam_lr(1, d_model, warmup, factor)  # validates the arguments
        if not base_lr > 0:
            raise ValueError(f"the optimizer's lr must be > 0, got {base_lr}")
        self.d_model, self.warmup = d_model, warmup
        self.factor, self.base_lr = factor, base_lr

    def __call__(self, steps_taken: int) -> float:
        lr = noam_lr(steps_taken + 1, self.d_model, self.warmup, self.factor)
        return lr / self.base_lr


def noam_scheduler(
    optimizer: Optimizer, d_model: int, warmup: int, factor: float = 1.0
) -> LambdaLR:
    """A ``LambdaLR`` that makes the learning rate of optimizer step k
    (k = 1, 2, ...) exactly ``noam_lr(k, d_model, warmup, factor)``.

    The schedule *is* the learning rate: the lr the optimizer was built
    with is divided out, so any positive value will do. Call
    ``scheduler.step()`` once per optimizer step (``train_epoch`` does).
    """
    multipliers = [
        NoamLambda(d_model, warmup, factor, g.get("initial_lr", g["lr"]))
        for g in optimizer.param_groups
    ]
    return LambdaLR(optimizer, multipliers)
