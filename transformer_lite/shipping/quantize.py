"""int8 dynamic quantisation of the linear layers (chapter 12).

Each weight matrix is stored as int8 with one float scale per output row
(per channel); each input is quantised to int8 on the fly, row by row,
from its own range (dynamic: no calibration data). The product runs on
integers and is scaled back to float. Weights take a quarter of the
bytes; embeddings, LayerNorms and biases stay float32.

``torchao`` holds PyTorch's quantisation now (``quantize_`` with
``Int8DynamicActivationInt8WeightConfig``); ``torch.ao.quantization``
is deprecated.
"""

import copy
import io
import logging
import os
from pathlib import Path

import torch
from torch import nn

from transformer_lite.extras import require

__all__ = ["quantize_int8", "size_on_disk"]


def _torchao():
    """Import torchao quietly: it logs a warning for each optional
    CUDA kernel library that a CPU machine cannot load, and torch one
    for a deprecated registration inside torchao."""
    loggers = [logging.getLogger(n) for n in ("torchao", "torch.utils")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        quantization = require("torchao.quantization", "ship")
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
    return quantization


def quantize_int8(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose ``nn.Linear`` weights are int8, with
    int8 dynamic quantisation of their inputs (torchao); ``model`` is
    unchanged. For inference: the copy is in eval mode."""
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"model must be an nn.Module, got {type(model).__name__}"
        )
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("model has no nn.Linear layer to quantise")
    for linear in linears:
        weight = linear.weight
        if type(weight) not in (torch.Tensor, nn.Parameter):
            raise ValueError(
                "model is already quantised: its linear weights are "
                f"{type(weight).__name__}; quantise the float model once"
            )
        if weight.dtype != torch.float32:
            raise ValueError(
                f"int8 quantisation takes a float32 model (torchao's "
                f"dynamic int8 path), got linear weights of {weight.dtype}"
                ": call model.float() first"
            )
    q = _torchao()
    quantized = copy.deepcopy(model).eval()
    q.quantize_(quantized, q.Int8DynamicActivationInt8WeightConfig())
    return quantized


def size_on_disk(model: nn.Module | str | os.PathLike) -> int:
    """Bytes of ``torch.save(model.state_dict())`` (shared tensors once),
    or of the file(s) at a path (several: a list of paths)."""
    if isinstance(model, nn.Module):
        buffer = io.BytesIO()
        torch.save(model.state_dict(), buffer)
        return buffer.getbuffer().nbytes
    paths = model if isinstance(model, list | tuple) else [model]
    return sum(Path(p).stat().st_size for p in paths)
