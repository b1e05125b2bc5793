"""Special token ids and the checks on tensors of token ids (chapters 5-7).

Every task in the package shares one convention for its special tokens, so
that a model, a batch, a decoder and a tokenizer agree without being told:

====  ==  ==============================================================
PAD   0   padding: masked out of attention and ignored by the loss
BOS   1   begin-of-sequence, the first token of every target and output
EOS   2   end-of-sequence, where decoding stops
UNK   3   a symbol the tokenizer never saw in training
====  ==  ==============================================================

Two checks, kept apart on purpose. :func:`check_token_tensor` looks only at
the shape and dtype, which the host knows without asking the device: the
model calls it on every forward pass. :func:`check_token_ids` also reads
the values (are the ids inside the vocabulary?); reading a value from a GPU
tensor makes the CPU wait for the GPU, and a compiled graph cannot contain
it. So the models read them where it costs nothing (:func:`check_ids_here`):
on the CPU, outside a compiled or exported graph, on every call; on a GPU
only when asked (``model.check_ids = True``, a debugging aid). Batches
check theirs where they are built, on the CPU.
"""

import torch
from torch import Tensor

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "check_ids_here",
    "check_token_ids",
    "check_token_tensor",
]

# The integer dtypes an embedding looks up; uint8 and the short ints are
# refused at the door rather than by nn.Embedding's own RuntimeError.
TOKEN_DTYPES = (torch.int64, torch.int32)

PAD_ID = 0  # padding: masked out of attention and ignored by the loss
BOS_ID = 1  # begin-of-sequence: the first token of targets and outputs
EOS_ID = 2  # end-of-sequence: where decoding stops
UNK_ID = 3  # unknown: a symbol the tokenizer never saw in training


def check_token_tensor(tokens: Tensor, name: str) -> None:
    """Raise a ``ValueError`` unless ``tokens`` is a (B, L) tensor of
    integers. Reads no values: no device synchronisation."""
    if not isinstance(tokens, Tensor):
        raise ValueError(
            f"{name} must be a (B, L) tensor of token ids, got "
            f"{type(tokens).__name__}"
        )
    if tokens.dim() != 2:
        raise ValueError(
            f"{name} must be a (B, L) tensor of token ids, got shape "
            f"{tuple(tokens.shape)}"
        )
    if tokens.dtype not in TOKEN_DTYPES:
        raise ValueError(
            f"{name} must hold integer token ids (torch.int64 or "
            f"torch.int32, what nn.Embedding takes), got dtype {tokens.dtype}"
        )


def check_token_ids(tokens: Tensor, vocab_size: int, name: str) -> None:
    """:func:`check_token_tensor`, then every id in [0, ``vocab_size``).

    Reads the smallest and largest id: on a GPU tensor this waits for the
    device (a sync point), so call it where batches are built.
    """
    check_token_tensor(tokens, name)
    if tokens.numel() == 0:
        return
    low, high = int(tokens.min()), int(tokens.max())  # a sync point on GPU
    if low < 0 or high >= vocab_size:
        bad = high if high >= vocab_size else low
        raise ValueError(
            f"{name} holds token ids in [{low}, {high}], outside the "
            f"vocabulary [0, {vocab_size - 1}]: id {bad} is not one of its "
            f"{vocab_size} tokens"
        )


def check_ids_here(
    tokens: Tensor, vocab_size: int, name: str, always: bool = False
) -> None:
    """:func:`check_token_ids` wherever reading the ids costs nothing: a
    CPU tensor outside a graph being compiled or exported (there the
    check would break the graph). A GPU tensor only with ``always`` (its
    two values cost a sync point), which also asks for it in a graph."""
    free = tokens.device.type == "cpu" and not torch.compiler.is_compiling()
    if always or free:
        check_token_ids(tokens, vocab_size, name)
