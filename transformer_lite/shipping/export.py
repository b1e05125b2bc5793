"""Export a trained encoder-decoder to graphs (chapter 12).

Decoding is a Python loop around the model, and a loop whose length
depends on the tokens produced is not a graph. So the model leaves
Python as three graphs, each a plain function of tensors:

* ``encoder``: source ids -> memory;
* ``cross``: memory -> the cross-attention keys and values of every
  decoder layer (computed once per source, as the cache does);
* ``step``: one cached decoder step, the newest token, the target mask,
  the source mask and the keys and values so far -> next-token logits
  and the keys and values grown by one position.

The key/value cache is the ``step`` graph's inputs and outputs, so a
loop over the graphs does the work of ``use_cache=True`` and gives the
same tokens (:mod:`transformer_lite.shipping.runtime`). Batch, source
length and target length are dynamic (up to the model's ``max_len``).
"""

import contextlib
import functools
import hashlib
import json
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.export import Dim, ExportedProgram

from transformer_lite.cache import DecoderCache
from transformer_lite.extras import require
from transformer_lite.model import Transformer, TransformerConfig
from transformer_lite.schemes import POSITIONS, check_widths, scheme
from transformer_lite.tokens import BOS_ID
from transformer_lite.training.checkpoint import write_atomically

__all__ = [
    "GRAPHS",
    "MANIFEST_FORMAT",
    "CrossGraph",
    "DecoderStep",
    "EncoderGraph",
    "export_onnx",
    "export_programs",
    "graph_inputs",
    "graph_names",
    "manifest_path",
    "onnx_paths",
    "weights_fingerprint",
]

GRAPHS = ("encoder", "cross", "step")  # one file each, in this order
# The manifest beside the graphs: what they were exported from.
MANIFEST_FORMAT = "transformer-lite onnx 1"


def _check_model(model: nn.Module) -> Transformer:
    if not isinstance(model, Transformer):
        raise ValueError(
            f"model must be a Transformer, got {type(model).__name__}"
        )
    c = model.config
    if not scheme(c.position).exportable:
        takes = ", ".join(p for p in POSITIONS if scheme(p).exportable)
        raise ValueError(
            f"export supports absolute positions ({takes}), got "
            f"position={c.position!r}"
        )
    check_widths(c.d_model, c.n_heads, c.position)
    return model


class EncoderGraph(nn.Module):
    """Source ids -> memory; the source mask is built from padding.

    Shape:
        src: (B, S); output: (B, S, C).
    """

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = _check_model(model)

    def forward(self, src: Tensor) -> Tensor:
        return self.model.encode(src)  # (B, S, C)


class CrossGraph(nn.Module):
    """Memory -> each decoder layer's cross-attention keys and values,
    split into heads: ``k_0, v_0, k_1, v_1, ...``.

    Shape:
        memory: (B, S, C); each output: (B, H, S, D).
    """

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = _check_model(model)

    def forward(self, memory: Tensor) -> tuple[Tensor, ...]:
        out = []
        for layer in self.model.decoder.layers:
            attn = layer.cross_attn
            out.append(attn.split_heads(attn.w_k(memory)))  # (B, H, S, D)
            out.append(attn.split_heads(attn.w_v(memory)))
        return tuple(out)


class DecoderStep(nn.Module):
    """One cached decoder step and the output projection.

    ``past`` holds each layer's self-attention keys and values of the
    T - 1 earlier positions, ``cross`` their cross-attention ones (from
    :class:`CrossGraph`), both as ``k_0, v_0, k_1, v_1, ...``. The step
    returns the next-token logits and the self-attention keys and values
    of all T positions, the newest appended.

    Shape:
        token: (B, 1); tgt_mask: (B, 1, T), True at the positions the
        new token may attend (not padding); src_mask: (B, 1, S);
        past: (B, H, T - 1, D) each; cross: (B, H, S, D) each;
        output: logits (B, V) and (B, H, T, D) each.
    """

    def __init__(self, model: Transformer) -> None:
        super().__init__()
        self.model = _check_model(model)

    def forward(
        self,
        token: Tensor,
        tgt_mask: Tensor,
        src_mask: Tensor,
        past: tuple[Tensor, ...],
        cross: tuple[Tensor, ...],
    ) -> tuple[Tensor, ...]:
        model = self.model
        cache = DecoderCache.empty(model.config.n_layers)
        for i, layer in enumerate(cache.layers):
            layer.self_attn.key, layer.self_attn.value = past[
                2 * i : 2 * i + 2
            ]
            layer.cross_attn.key = cross[2 * i]
            layer.cross_attn.value = cross[2 * i + 1]
        cache.length = tgt_mask.size(-1) - 1  # the new token's position
        # The cross-attention keys and values are in the cache: the
        # memory itself is never read, an empty (B, 0, C) stands for it.
        B, C = token.size(0), model.config.d_model
        memory = cross[0].new_zeros(B, 0, C)
        hidden = model.decode(memory, src_mask, token, tgt_mask, cache)
        logits = model.logits(hidden[:, -1])  # (B, V)
        grown = []
        for layer in cache.layers:  # (B, H, T, D) each
            grown += [layer.self_attn.key, layer.self_attn.value]
        return (logits, *grown)


MIN_EXPORT_LEN = 3  # a cached step's past must be at least 2 long


def graph_inputs(
    model: Transformer, *, batch: int = 2, src_len: int = 5, tgt_len: int = 3
) -> dict[str, tuple]:
    """Example inputs of each graph (for tracing): real shapes and ids,
    padding in none.

    Shape: see :class:`EncoderGraph`, :class:`CrossGraph` and
    :class:`DecoderStep`.
    """
    c = model.config
    device = model.device
    H, D = c.n_heads, c.d_model // c.n_heads
    src = torch.full((batch, src_len), BOS_ID, device=device)
    memory = torch.zeros(batch, src_len, c.d_model, device=device)
    cross = tuple(
        torch.zeros(batch, H, src_len, D, device=device)
        for _ in range(2 * c.n_layers)
    )
    past = tuple(
        torch.zeros(batch, H, tgt_len - 1, D, device=device)
        for _ in range(2 * c.n_layers)
    )
    token = torch.full((batch, 1), BOS_ID, device=device)
    tgt_mask = torch.ones(batch, 1, tgt_len, dtype=torch.bool, device=device)
    src_mask = torch.ones(batch, 1, src_len, dtype=torch.bool, device=device)
    return {
        "encoder": (src,),
        "cross": (memory,),
        "step": (token, tgt_mask, src_mask, past, cross),
    }


def _dynamic_shapes(model: Transformer) -> dict[str, tuple]:
    """Batch B, source length S and target length T of each graph."""
    n, longest = 2 * model.config.n_layers, model.config.max_len
    B = Dim("B", max=4096)
    S = Dim("S", max=longest)
    T = Dim("T", min=1, max=longest)  # the step's total length
    src, cached = {0: B, 1: S}, {0: B, 2: S}
    past = tuple({0: B, 2: T - 1} for _ in range(n))
    return {
        "encoder": (src,),
        "cross": ({0: B, 1: S},),
        "step": (
            {0: B},
            {0: B, 2: T},
            {0: B, 2: S},
            past,
            tuple(cached for _ in range(n)),
        ),
    }


def _graphs(model: Transformer) -> dict[str, nn.Module]:
    return {
        "encoder": EncoderGraph(model),
        "cross": CrossGraph(model),
        "step": DecoderStep(model),
    }


def export_programs(model: Transformer) -> dict[str, ExportedProgram]:
    """``torch.export`` the three graphs of an eval-mode ``model``, with
    dynamic batch and lengths. Returns ``{"encoder": ..., "cross": ...,
    "step": ...}``."""
    _check_model(model)
    if model.training:
        raise ValueError("export an eval-mode model: call model.eval()")
    longest = model.config.max_len
    if longest < MIN_EXPORT_LEN:
        raise ValueError(
            f"export needs max_len >= {MIN_EXPORT_LEN} (its example "
            "lengths must exceed 1, which torch.export would fix as "
            f"constants), got max_len={longest}"
        )
    # Example lengths within the model's range: 5 and 3 where they fit.
    inputs = graph_inputs(model, src_len=min(5, longest),
                          tgt_len=min(3, longest))  # fmt: skip
    shapes = _dynamic_shapes(model)
    with torch.no_grad():
        return {
            name: torch.export.export(
                graph, inputs[name], dynamic_shapes=shapes[name]
            )
            for name, graph in _graphs(model).items()
        }


def graph_names(
    config: TransformerConfig,
) -> dict[str, tuple[list[str], list[str]]]:
    """Input and output names of each graph in the ONNX files."""
    n = config.n_layers
    kv = [f"{kind}_{i}" for i in range(n) for kind in ("key", "value")]
    past, cross = [f"past_{x}" for x in kv], [f"cross_{x}" for x in kv]
    return {
        "encoder": (["src"], ["memory"]),
        "cross": (["memory"], cross),
        "step": (
            ["token", "tgt_mask", "src_mask", *past, *cross],
            ["logits", *[f"present_{x}" for x in kv]],
        ),
    }


def weights_fingerprint(model: nn.Module) -> str:
    """A SHA-256 of every parameter and buffer (name, dtype, shape and
    bytes, in ``state_dict`` order): which weights a graph was made of."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def onnx_paths(directory: str | os.PathLike, stem: str) -> dict[str, Path]:
    """Where :func:`export_onnx` writes each graph:
    ``directory/stem.encoder.onnx`` and so on."""
    return {name: Path(directory) / f"{stem}.{name}.onnx" for name in GRAPHS}


def manifest_path(directory: str | os.PathLike, stem: str) -> Path:
    """Where :func:`export_onnx` records what the graphs were made from:
    ``directory/stem.onnx.json``."""
    return Path(directory) / f"{stem}.onnx.json"


def export_onnx(
    model: Transformer,
    directory: str | os.PathLike,
    *,
    stem: str = "model",
    programs: dict[str, ExportedProgram] | None = None,
) -> dict[str, Path]:
    """Export the three graphs to ONNX with the dynamo exporter
    (``torch.onnx.export(..., dynamo=True)``: ``torch.export`` first,
    then a translation of its operators). Each file holds its weights.
    ``programs``: those of :func:`export_programs` for this ``model``,
    if already made. Returns the paths, as :func:`onnx_paths`."""
    require("onnxscript", "ship")  # the dynamo exporter's operators
    if programs is None:
        programs = export_programs(model)
    paths = onnx_paths(directory, stem)
    Path(directory).mkdir(parents=True, exist_ok=True)
    names = graph_names(model.config)
    blobs = {}
    for name, program in programs.items():
        inputs, outputs = names[name]
        with _quiet():
            onnx_program = torch.onnx.export(
                program,
                input_names=inputs,
                output_names=outputs,
                dynamo=True,
                optimize=True,
                verbose=False,
            )
        blobs[name] = onnx_program.model_proto.SerializeToString()
    files = {}
    for name, blob in blobs.items():  # each file whole, or not at all
        write_atomically(paths[name], functools.partial(_write, blob))
        files[name] = {
            "file": paths[name].name,
            "bytes": len(blob),
            "sha256": hashlib.sha256(blob).hexdigest(),
        }
    manifest = {
        "format": MANIFEST_FORMAT,
        "config": model.config.to_dict(),
        "weights": weights_fingerprint(model),
        "graphs": files,
    }
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    # Last: a manifest vouches only for graphs already in place.
    write_atomically(manifest_path(directory, stem),
                     functools.partial(_write, text))  # fmt: skip
    return paths


def _write(data: bytes, file) -> None:
    file.write(data)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The exporter logs a warning for each torchvision operator it
    cannot register (torchvision is not installed) and warns of
    deprecations inside itself: none of them concerns our graphs."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            yield
    finally:
        logger.setLevel(level)
