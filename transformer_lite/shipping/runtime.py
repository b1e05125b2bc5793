"""Decode with the exported graphs in ONNX Runtime (chapter 12).

:class:`OnnxTransformer` runs the three ONNX files of
:func:`~transformer_lite.shipping.export.export_onnx` and answers the
calls that decoding makes of a model (``encode``, a cached ``decode``,
``generator``, ``new_cache``, ``config``). So the package's own loops,
:func:`~transformer_lite.decoding.greedy_decode` with ``use_cache=True``
and :func:`~transformer_lite.decoding.beam_search`, run unchanged over
the graphs: the tokens can differ from PyTorch's only where the two
runtimes' rounding differs.
"""

import copy
import os
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from transformer_lite.cache import DecoderCache
from transformer_lite.checks import check_int
from transformer_lite.extras import require
from transformer_lite.model import Transformer, TransformerConfig
from transformer_lite.shipping.export import (
    GRAPHS,
    CrossGraph,
    DecoderStep,
    EncoderGraph,
    export_programs,
    onnx_paths,
)

__all__ = [
    "CompiledTransformer",
    "GraphTransformer",
    "OnnxTransformer",
    "onnx_session",
]


def onnx_session(path: str | os.PathLike, *, threads: int | None = None):
    """An ONNX Runtime session on the CPU for the file at ``path``
    (``threads``: its intra-op threads; None: the runtime's choice)."""
    ort = require("onnxruntime", "ship")
    if not Path(path).is_file():
        raise ValueError(f"no ONNX file at {path}; export the model first")
    if threads is not None:
        check_int("threads", threads, low=1)
    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    return ort.InferenceSession(
        str(path), options, providers=["CPUExecutionProvider"]
    )


def _numpy(x: Tensor) -> np.ndarray:
    return x.detach().cpu().contiguous().numpy()


class GraphTransformer(nn.Module):
    """The three graphs of :mod:`~transformer_lite.shipping.export`
    (encoder, cross-attention keys and values, one decoder step), seen
    by decoding as a :class:`~transformer_lite.model.Transformer`.
    Subclasses say how a graph runs (:meth:`run_graph`).

    ``decode`` needs a cache (``new_cache()``): the exported decoder
    computes one step. Its step ends with the output projection, so
    ``decode`` returns logits and ``generator`` is the identity.

    Shape:
        encode: (B, S) -> (B, S, C); decode: token (B, 1) -> (B, 1, V).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.generator = nn.Identity()
        self.eval()

    def run_graph(self, graph: str, feeds: dict[str, Tensor]) -> list[Tensor]:
        """Run ``graph`` (one of ``GRAPHS``) on named inputs; its
        outputs in order (the names of ``export_onnx``)."""
        raise NotImplementedError

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Source ids (B, S) -> memory (B, S, C). The graph builds the
        padding mask itself; another ``src_mask`` is refused."""
        (memory,) = self.run_graph("encoder", {"src": src})
        if src_mask is not None:
            padding = (src != self.config.pad_id).unsqueeze(1)  # (B, 1, S)
            if not torch.equal(src_mask.cpu(), padding.cpu()):
                raise ValueError(
                    "the exported encoder masks padding only: src_mask "
                    "must be the padding mask of src"
                )
        return memory  # (B, S, C)

    def new_cache(self) -> DecoderCache:
        return DecoderCache.empty(self.config.n_layers)

    def decode(
        self,
        memory: Tensor,
        src_mask: Tensor | None,
        tgt: Tensor,
        tgt_mask: Tensor | None = None,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """One cached step: the newest token ``tgt`` (B, 1) -> logits
        (B, 1, V); the cache grows by one position."""
        if cache is None or tgt.size(1) != 1:
            raise ValueError(
                "the exported decoder runs one cached step: pass the "
                "newest token (B, 1) and cache=model.new_cache() (in "
                "greedy_decode, use_cache=True)"
            )
        cache.bind(memory)
        B, L = tgt.size(0), cache.length + 1
        if tgt_mask is None:
            tgt_mask = torch.ones(B, 1, L, dtype=torch.bool)
        if src_mask is None:
            src_mask = torch.ones(B, 1, memory.size(1), dtype=torch.bool)
        layers = cache.layers
        if layers[0].cross_attn.key is None:  # first step: K, V of memory
            cross = self.run_graph("cross", {"memory": memory})
            for i, layer in enumerate(layers):
                layer.cross_attn.key, layer.cross_attn.value = cross[
                    2 * i : 2 * i + 2
                ]
        c = self.config
        empty = torch.zeros(B, c.n_heads, 0, c.d_model // c.n_heads)
        feeds = {"token": tgt, "tgt_mask": tgt_mask, "src_mask": src_mask}
        for i, layer in enumerate(layers):
            past, cross = layer.self_attn, layer.cross_attn
            feeds[f"past_key_{i}"] = empty if past.key is None else past.key
            feeds[f"past_value_{i}"] = (
                empty if past.value is None else past.value
            )
            feeds[f"cross_key_{i}"] = cross.key
            feeds[f"cross_value_{i}"] = cross.value
        logits, *present = self.run_graph("step", feeds)
        for i, layer in enumerate(layers):
            layer.self_attn.key, layer.self_attn.value = present[
                2 * i : 2 * i + 2
            ]
        cache.length += 1
        return logits.unsqueeze(1)  # (B, 1, V)


class OnnxTransformer(GraphTransformer):
    """The graphs as ONNX files, run in ONNX Runtime on the CPU.

    Args:
        directory: where the ONNX files are.
        config: the exported model's configuration.
        stem: the files' common name (see ``onnx_paths``).
        threads: intra-op threads of each session (None: the runtime's).
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        config: TransformerConfig,
        *,
        stem: str = "model",
        threads: int | None = None,
    ) -> None:
        super().__init__(config)
        paths = onnx_paths(directory, stem)
        self.sessions = {
            name: onnx_session(paths[name], threads=threads) for name in GRAPHS
        }

    def run_graph(self, graph: str, feeds: dict[str, Tensor]) -> list[Tensor]:
        arrays = {name: _numpy(x) for name, x in feeds.items()}
        outputs = self.sessions[graph].run(None, arrays)
        return [torch.from_numpy(x) for x in outputs]


class CompiledTransformer(GraphTransformer):
    """The same graphs as PyTorch modules, the decoder step compiled by
    inductor, ``torch.compile``'s compiler, ahead of time (AOTInductor)
    from its exported program: one compilation serves every batch size
    and length in the export's ranges. (``torch.compile`` just in time
    specialises sizes 0 and 1, so the first two positions of a decoding
    would each compile the step again.) The encoder and cross graphs,
    run once per batch, stay eager.

    Args:
        model: a :class:`~transformer_lite.model.Transformer`; an
            eval-mode copy of it is what runs.
        compile: False runs the step eagerly too (for comparison).
        programs: those of ``export_programs(model)``, if already made.
    """

    def __init__(
        self,
        model: Transformer,
        *,
        compile: bool = True,
        programs: dict | None = None,
    ) -> None:
        super().__init__(model.config)
        # An eval-mode copy: no dropout, whatever mode ``model`` is in,
        # and no change when ``model`` trains on.
        model = copy.deepcopy(model).eval()
        step = DecoderStep(model)
        if compile:
            from torch._inductor import (
                aoti_compile_and_package,
                aoti_load_package,
            )

            program = (programs or export_programs(model))["step"]
            with warnings.catch_warnings():
                # torch's own pytree code warns about its own deprecated
                # LeafSpec while packaging; nothing a caller can change.
                warnings.filterwarnings("ignore", message=".*LeafSpec")
                step = aoti_load_package(aoti_compile_and_package(program))
        self.graphs = {
            "encoder": EncoderGraph(model),
            "cross": CrossGraph(model),
            "step": step,
        }

    def run_graph(self, graph: str, feeds: dict[str, Tensor]) -> list[Tensor]:
        n = self.config.n_layers
        # A compiled graph reads its inputs with the strides it was
        # compiled for: views (a slice, transposed heads) are copied.
        feeds = {name: x.contiguous() for name, x in feeds.items()}
        with torch.no_grad():
            if graph != "step":
                (x,) = feeds.values()
                out = self.graphs[graph](x)
                return list(out) if isinstance(out, tuple) else [out]
            kv = [f"{kind}_{i}" for i in range(n) for kind in ("key", "value")]
            past = tuple(feeds[f"past_{x}"] for x in kv)
            cross = tuple(feeds[f"cross_{x}"] for x in kv)
            out = self.graphs["step"](
                feeds["token"], feeds["tgt_mask"], feeds["src_mask"],
                past, cross,
            )  # fmt: skip
        return list(out)
