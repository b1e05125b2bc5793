"""Training (chapter 6): label smoothing, the Noam schedule, batches with
their masks, and a training loop with progress bars. Checkpoints are in
:mod:`transformer_lite.checkpoint`.
"""

import copy
import math
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR, LRScheduler
from tqdm import TqdmWarning

with warnings.catch_warnings():  # without ipywidgets: text bars, quietly
    warnings.simplefilter("ignore", TqdmWarning)
    from tqdm.auto import tqdm

from transformer_lite.masks import padding_mask, target_mask

__all__ = [
    "Batch",
    "History",
    "LabelSmoothingLoss",
    "evaluate",
    "fit",
    "noam_lr",
    "noam_scheduler",
    "train_epoch",
]

SPREADS = ("all", "others")  # where label smoothing puts its mass
REDUCTIONS = ("mean", "sum")

LossFn = Callable[[Tensor, Tensor], Tensor]
Batches = Iterable["Batch"] | Callable[[], Iterable["Batch"]]


class LabelSmoothingLoss(nn.Module):
    """Cross-entropy -sum_k q_k log p_k against a smoothed target q.

    q keeps 1 - eps on the true token and spreads eps = ``smoothing``:
    ``spread="all"`` (Szegedy et al., 2016; torch): eps / V on every token,
    the true one and padding included, so the loss equals
    ``nn.CrossEntropyLoss(label_smoothing=eps, ignore_index=pad_id)``;
    ``spread="others"`` (the Annotated Transformer): eps / (V - 2) on every
    token except the true one and padding. ``kl=True`` subtracts the
    entropy of q (the KL divergence, 0 at best; same gradients).

    Positions whose target is ``pad_id`` count for nothing. ``"mean"``
    divides by the number of non-pad targets (as torch), giving 0.0, not
    NaN, when there are none; ``"sum"`` does not divide. Computed from
    ``log_softmax`` in float32 or wider: finite logits give a finite loss.

    Args:
        vocab_size: V, the number of classes.
        pad_id: the padding id, in [0, V); its targets are ignored.
        smoothing: eps, in [0, 1); 0 gives plain cross-entropy.
        spread: ``"all"`` or ``"others"``, as above.
        kl: subtract the entropy of q, as above.
        reduction: ``"mean"`` or ``"sum"``, as above.

    Shape:
        logits: (B, T, V) or (N, V); targets: (B, T) or (N,); output: ().
    """

    def __init__(
        self,
        vocab_size: int,
        pad_id: int,
        smoothing: float = 0.1,
        spread: str = "all",
        kl: bool = False,
        reduction: str = "mean",
    ) -> None:
        super().__init__()
        if spread not in SPREADS or reduction not in REDUCTIONS:
            raise ValueError(
                f"spread must be one of {SPREADS} and reduction one of "
                f"{REDUCTIONS}, got {spread!r} and {reduction!r}"
            )
        smallest = 3 if spread == "others" else 2
        if not isinstance(vocab_size, int) or vocab_size < smallest:
            raise ValueError(
                f"vocab_size must be an int >= {smallest} for "
                f"spread={spread!r}, got {vocab_size!r}"
            )
        if not isinstance(pad_id, int) or not 0 <= pad_id < vocab_size:
            raise ValueError(
                f"pad_id must be an int in [0, {vocab_size}), got {pad_id!r}"
            )
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        self.vocab_size, self.pad_id = vocab_size, pad_id
        self.smoothing, self.spread = smoothing, spread
        self.kl, self.reduction = kl, reduction
        n_spread = vocab_size if spread == "all" else vocab_size - 2
        self.share = smoothing / n_spread  # q_k of a token that is not true
        # q of the true token, and the entropy of q (the loss's floor).
        self.confidence = 1.0 - smoothing + (spread == "all") * self.share
        wrong = n_spread - (spread == "all")  # tokens that get only share
        self.entropy = -_xlogx(self.confidence) - wrong * _xlogx(self.share)

    def smoothed_targets(
        self, targets: Tensor, dtype: torch.dtype = torch.float32
    ) -> Tensor:
        """The distribution q, one row per target; zero rows for padding.

        Shape:
            targets: (...); output: (..., V).
        """
        shape = (*targets.shape, self.vocab_size)
        q = torch.full(shape, self.share, dtype=dtype, device=targets.device)
        if self.spread == "others":
            q[..., self.pad_id] = 0.0
        q.scatter_(-1, targets.unsqueeze(-1), self.confidence)
        return q.masked_fill((targets == self.pad_id).unsqueeze(-1), 0.0)

    def _check(self, logits: Tensor, targets: Tensor) -> None:
        if logits.dim() not in (2, 3) or logits.size(-1) != self.vocab_size:
            raise ValueError(
                f"logits must be (B, T, V) or (N, V) with V = vocab_size = "
                f"{self.vocab_size}, got shape {tuple(logits.shape)}"
            )
        if targets.shape != logits.shape[:-1]:
            raise ValueError(
                f"targets must have shape {tuple(logits.shape[:-1])} to "
                f"match logits {tuple(logits.shape)}, got "
                f"{tuple(targets.shape)}"
            )
        if targets.dtype.is_floating_point or targets.dtype == torch.bool:
            raise ValueError(f"targets must be token ids, got {targets.dtype}")
        if targets.numel() and (
            targets.min() < 0 or targets.max() >= self.vocab_size
        ):
            raise ValueError(
                f"targets hold ids outside [0, {self.vocab_size})"
            )

    def forward(self, logits: Tensor, targets: Tensor) -> Tensor:
        self._check(logits, targets)
        dtype = torch.promote_types(logits.dtype, torch.float32)
        log_p = logits.to(dtype).log_softmax(dim=-1)  # (..., V)
        # -sum_k q_k log p_k without building q: the true token's term and
        # the sum over the tokens that share eps.
        log_p_true = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        log_p_shared = log_p.sum(dim=-1)  # (...)
        if self.spread == "others":
            log_p_shared = log_p_shared - log_p_true - log_p[..., self.pad_id]
        loss = -(1 - self.smoothing) * log_p_true - self.share * log_p_shared
        if self.kl:
            loss = loss - self.entropy
        real = targets != self.pad_id
        total = loss.masked_fill(~real, 0.0).sum()
        if self.reduction == "sum":
            return total
        return total / real.sum().clamp(min=1)


def _xlogx(x: float) -> float:
    return x * math.log(x) if x > 0 else 0.0


def noam_lr(
    step: int, d_model: int, warmup: int, factor: float = 1.0
) -> float:
    """factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).

    Linear warm-up for ``warmup`` steps, then decay as 1/sqrt(step)
    (Vaswani et al., 2017, eq. 3); the peak, at step == warmup, is
    factor / sqrt(d_model * warmup). Step 0 counts as step 1.
    """
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
    for name, value in (("d_model", d_model), ("warmup", warmup)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not factor > 0:
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


@dataclass(repr=False)
class Batch:
    """A source/target batch with shifted targets and masks (chapter 6).

    Built as ``Batch(src, tgt, pad_id)``. The decoder reads ``tgt_in``
    (all but the last token) and learns to predict ``tgt_out`` (all but
    the first): teacher forcing.

    Shape:
        src: (B, S); tgt: (B, T + 1); tgt_in, tgt_out: (B, T);
        src_mask: (B, 1, S); tgt_mask: (B, T, T). ``n_tokens``: the
        non-pad tokens of ``tgt_out``, the ones the loss counts.
    """

    src: Tensor
    tgt: Tensor
    pad_id: int
    tgt_in: Tensor = field(init=False)
    tgt_out: Tensor = field(init=False)
    src_mask: Tensor = field(init=False)
    tgt_mask: Tensor = field(init=False)
    n_tokens: int = field(init=False)

    def __post_init__(self) -> None:
        src, tgt = self.src, self.tgt
        if not isinstance(self.pad_id, int):
            raise ValueError(f"pad_id must be an int, got {self.pad_id!r}")
        self.src_mask = padding_mask(src, self.pad_id)  # (B, 1, S)
        padding_mask(tgt, self.pad_id)  # checks tgt is (B, L) of ids
        if src.numel() == 0 or tgt.size(0) == 0:
            raise ValueError(
                f"empty batch: src {tuple(src.shape)}, tgt {tuple(tgt.shape)}"
            )
        if src.size(0) != tgt.size(0) or src.device != tgt.device:
            raise ValueError(
                f"src {tuple(src.shape)} on {src.device} and tgt "
                f"{tuple(tgt.shape)} on {tgt.device} must share the batch "
                "size and the device"
            )
        if tgt.size(1) < 2:
            raise ValueError(
                f"tgt needs at least 2 tokens (an input and a next token), "
                f"got shape {tuple(tgt.shape)}"
            )
        self.tgt_in = tgt[:, :-1]  # (B, T)
        self.tgt_out = tgt[:, 1:]  # (B, T)
        self.tgt_mask = target_mask(self.tgt_in, self.pad_id)  # (B, T, T)
        self.n_tokens = int((self.tgt_out != self.pad_id).sum())

    def to(self, device: torch.device | str) -> "Batch":
        """The same batch with every tensor on ``device``."""
        moved = copy.copy(self)
        for name, value in vars(self).items():
            if isinstance(value, Tensor):
                setattr(moved, name, value.to(device))
        return moved

    def __repr__(self) -> str:
        (B, S), T = self.src.shape, self.tgt_in.size(1)
        return (
            f"Batch(B={B}, S={S}, T={T}, n_tokens={self.n_tokens}, "
            f"pad_id={self.pad_id})"
        )


@dataclass
class History:
    """What :func:`fit` measured; ``to_dict()`` gives plain data."""

    step_loss: list[float] = field(default_factory=list)  # per opt. step
    lr: list[float] = field(default_factory=list)  # lr of each opt. step
    train_loss: list[float] = field(default_factory=list)  # per epoch
    val_loss: list[float] = field(default_factory=list)  # per epoch
    best_epoch: int | None = None  # index of the lowest val_loss
    stopped_early: bool = False

    def to_dict(self) -> dict:
        return asdict(self)


def _fresh(batches: Batches) -> Iterable["Batch"]:
    return batches() if callable(batches) else batches


def _groups(batches: Iterable["Batch"], size: int) -> Iterator[list]:
    group = []
    for batch in batches:
        group.append(batch)
        if len(group) == size:
            yield group
            group = []
    if group:
        yield group


def _batch_loss(model: nn.Module, batch: Batch, loss_fn: LossFn) -> Tensor:
    """The mean loss per non-pad target token of one batch."""
    logits = model(batch.src, batch.tgt_in, batch.src_mask, batch.tgt_mask)
    return loss_fn(logits, batch.tgt_out)  # logits: (B, T, V)


def _progress_bar(total: int | None, desc: str, show: bool) -> tqdm:
    """One line that disappears when done (``leave=False``), so notebook
    outputs stay clean."""
    return tqdm(total=total, desc=desc, disable=not show, leave=False)


def _n_steps(batches: Iterable[Batch], accumulate: int) -> int | None:
    if not hasattr(batches, "__len__"):
        return None
    return math.ceil(len(batches) / accumulate)


def _check_loop_args(clip_norm: float | None, accumulate: int) -> None:
    if not isinstance(accumulate, int) or accumulate < 1:
        raise ValueError(f"accumulate must be an int >= 1, got {accumulate}")
    if clip_norm is not None and not clip_norm > 0:
        raise ValueError(f"clip_norm must be positive or None: {clip_norm}")


def _train_steps(
    model: nn.Module,
    batches: Iterable[Batch],
    loss_fn: LossFn,
    optimizer: Optimizer,
    scheduler: LRScheduler | None,
    clip_norm: float | None,
    accumulate: int,
    history: History | None,
    bar: tqdm,
) -> float:
    """The body of :func:`train_epoch`, reporting to a given bar."""
    device = next(model.parameters()).device
    model.train()
    total_loss, total_tokens = 0.0, 0
    for group in _groups(batches, accumulate):
        n_group = sum(batch.n_tokens for batch in group)
        if n_group == 0:
            continue
        optimizer.zero_grad(set_to_none=True)
        step_loss = torch.zeros((), device=device)
        for batch in group:
            if batch.n_tokens == 0:
                continue  # nothing to learn; torch's loss would be NaN
            weight = batch.n_tokens / n_group
            loss = _batch_loss(model, batch.to(device), loss_fn) * weight
            loss.backward()
            step_loss += loss.detach()
        step_loss = step_loss.item()
        if not math.isfinite(step_loss):
            raise FloatingPointError(
                f"training loss is {step_loss}; lower the learning rate"
            )
        if clip_norm is not None:
            nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        total_loss += step_loss * n_group
        total_tokens += n_group
        if history is not None:
            history.step_loss.append(step_loss)
            history.lr.append(lr)
        bar.set_postfix(loss=f"{step_loss:.3f}", lr=f"{lr:.2e}", refresh=False)
        bar.update()
    if total_tokens == 0:
        raise ValueError(
            "batches yielded no target tokens; for several epochs pass a "
            "list, or a callable returning a fresh iterable"
        )
    return total_loss / total_tokens


def train_epoch(
    model: nn.Module,
    batches: Batches,
    loss_fn: LossFn,
    optimizer: Optimizer,
    scheduler: LRScheduler | None = None,
    clip_norm: float | None = 1.0,
    accumulate: int = 1,
    progress: bool = True,
    history: History | None = None,
) -> float:
    """One pass over ``batches`` in training mode (chapter 6).

    Each optimizer step takes ``accumulate`` consecutive batches and
    weights batch i's loss by n_i / N, its share of the group's N non-pad
    target tokens (1 / accumulate when the batches hold equally many), so
    the step equals one step on a batch holding them all. ``loss_fn``
    must return the mean over non-pad tokens (``LabelSmoothingLoss``, or
    ``nn.CrossEntropyLoss(ignore_index=pad_id)``). Then the gradient norm
    is clipped to ``clip_norm`` (None: no clipping) and the optimizer and
    the scheduler step once. A last, shorter group also steps.

    Args:
        batches: an iterable of :class:`Batch`, or a callable returning
            one; each batch is moved to the model's device.
        progress: show a ``tqdm`` progress bar (removed when done).
        history: if given, gets each step's loss and learning rate (of
            the first parameter group).

    Returns:
        the mean training loss per non-pad target token.
    """
    _check_loop_args(clip_norm, accumulate)
    batches = _fresh(batches)
    steps = _n_steps(batches, accumulate)
    with _progress_bar(steps, "train", progress) as bar:
        return _train_steps(
            model,
            batches,
            loss_fn,
            optimizer,
            scheduler,
            clip_norm,
            accumulate,
            history,
            bar,
        )


def evaluate(model: nn.Module, batches: Batches, loss_fn: LossFn) -> float:
    """Mean loss per non-pad target token, under ``torch.no_grad()`` and in
    eval mode (the model's mode is restored afterwards)."""
    was_training = model.training
    device = next(model.parameters()).device
    total_loss, total_tokens = 0.0, 0
    model.eval()
    try:
        with torch.no_grad():
            for batch in _fresh(batches):
                loss = _batch_loss(model, batch.to(device), loss_fn)
                total_loss += loss.item() * batch.n_tokens
                total_tokens += batch.n_tokens
    finally:
        model.train(was_training)
    if total_tokens == 0:
        raise ValueError("validation batches yielded no target tokens")
    return total_loss / total_tokens


def fit(
    model: nn.Module,
    train_batches: Batches,
    loss_fn: LossFn,
    optimizer: Optimizer,
    scheduler: LRScheduler | None = None,
    epochs: int = 10,
    val_batches: Batches | None = None,
    patience: int | None = None,
    clip_norm: float | None = 1.0,
    accumulate: int = 1,
    progress: bool = True,
) -> History:
    """Train for ``epochs`` epochs (as :func:`train_epoch`), validating
    after each one when ``val_batches`` is given (:func:`evaluate`).

    Early stopping: with ``patience`` p, training stops after p epochs in a
    row without a lower validation loss, and the weights of the best epoch
    are loaded back at the end, whether or not it stopped early (the
    optimizer and scheduler keep their latest state). One progress bar
    counts the optimizer steps of all epochs.

    Returns:
        a :class:`History`; ``best_epoch`` indexes ``val_loss``.
    """
    _check_loop_args(clip_norm, accumulate)
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive int, got {epochs!r}")
    if patience is not None and (val_batches is None or patience < 1):
        raise ValueError("patience needs val_batches and must be >= 1")
    steps = (
        None
        if callable(train_batches)
        else _n_steps(train_batches, accumulate)
    )
    history = History()
    best_loss, best_state = math.inf, None
    with _progress_bar(steps and steps * epochs, "fit", progress) as bar:
        for epoch in range(epochs):
            bar.set_description(f"epoch {epoch + 1}/{epochs}")
            history.train_loss.append(
                _train_steps(
                    model,
                    _fresh(train_batches),
                    loss_fn,
                    optimizer,
                    scheduler,
                    clip_norm,
                    accumulate,
                    history,
                    bar,
                )
            )
            if val_batches is None:
                continue
            history.val_loss.append(evaluate(model, val_batches, loss_fn))
            if history.val_loss[-1] < best_loss:
                best_loss, history.best_epoch = history.val_loss[-1], epoch
                if patience is not None:
                    best_state = {
                        k: v.detach().clone()
                        for k, v in model.state_dict().items()
                    }
            elif patience and epoch - history.best_epoch >= patience:
                history.stopped_early = True
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    return history
