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
import hashlib
import json
import os
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from transformer_lite.cache import DecoderCache
from transformer_lite.checks import check_int
from transformer_lite.extras import require
from transformer_lite.masks import padding_mask
from transformer_lite.model import Transformer, TransformerConfig
from transformer_lite.shipping.export import (
    GRAPHS,
    MANIFEST_FORMAT,
    CrossGraph,
    DecoderStep,
    EncoderGraph,
    export_programs,
    graph_names,
    manifest_path,
    onnx_paths,
)
from transformer_lite.tokens import check_token_ids

__all__ = [
    "CompiledTransformer",
    "GraphTransformer",
    "OnnxTransformer",
    "onnx_session",
    "read_manifest",
]

QUIET = 4  # ONNX Runtime's severity for "fatal only": it prints nothing
MAX_MANIFEST_BYTES = 1 << 20  # a manifest is a few KB; refuse a huge one


def onnx_session(path: str | os.PathLike, *, threads: int | None = None):
    """An ONNX Runtime session on the CPU for the file at ``path``
    (``threads``: its intra-op threads; None: the runtime's choice)."""
    ort = require("onnxruntime", "ship")
    if not Path(path).is_file():
        raise ValueError(f"no ONNX file at {path}; export the model first")
    if threads is not None:
        check_int("threads", threads, low=1)
    ort.set_default_logger_severity(QUIET)  # its own red log lines
    options = ort.SessionOptions()
    options.log_severity_level = QUIET
    if threads is not None:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(
            str(path), options, providers=["CPUExecutionProvider"]
        )
    except Exception as error:  # noqa: BLE001 - InvalidProtobuf and kin
        first = str(error).strip().splitlines()[0][:200] if str(error) else ""
        raise ValueError(
            f"{path} is not a graph ONNX Runtime can read "
            f"({type(error).__name__}: {first}); export the model again"
        ) from None


def read_manifest(
    directory: str | os.PathLike, stem: str, config: TransformerConfig
) -> dict:
    """The manifest :func:`~transformer_lite.shipping.export.export_onnx`
    wrote beside the graphs, checked as untrusted input: its format, the
    config it records against ``config``, and every graph file's size
    and SHA-256 against what it records. Raises a ``ValueError`` naming
    the file that is wrong."""
    path = manifest_path(directory, stem)
    if not path.is_file():
        raise ValueError(
            f"no manifest at {path}: the graphs were not written by this "
            "version's export; export the model again"
        )
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise ValueError(f"{path} is too large to be a manifest")
    try:
        manifest = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a manifest: {error}") from None
    keys = {"format", "config", "weights", "graphs"}
    if not isinstance(manifest, dict) or set(manifest) != keys:
        raise ValueError(f"{path} is not a manifest of {MANIFEST_FORMAT!r}")
    if manifest["format"] != MANIFEST_FORMAT:
        raise ValueError(
            f"{path} has format {manifest['format']!r}; expected "
            f"{MANIFEST_FORMAT!r}: export the model again"
        )
    stored, expected = manifest["config"], config.to_dict()
    if stored != expected:
        differ = sorted(
            k for k in set(expected) | set(stored if isinstance(stored,
                                                                dict) else {})
            if not isinstance(stored, dict) or stored.get(k) != expected.get(k)
        )  # fmt: skip
        raise ValueError(
            f"the graphs at {path.parent} were exported from another "
            f"configuration (differs in {', '.join(differ)}): export the "
            "model again"
        )
    graphs = manifest["graphs"]
    for name, file in onnx_paths(directory, stem).items():
        record = graphs.get(name) if isinstance(graphs, dict) else None
        if not isinstance(record, dict) or record.get("file") != file.name:
            raise ValueError(f"{path} does not describe {file.name}")
        if not file.is_file():
            raise ValueError(f"no ONNX file at {file}; export the model first")
        data = file.read_bytes() if file.stat().st_size == record.get(
            "bytes") else None  # fmt: skip
        if data is None or hashlib.sha256(data).hexdigest() != record.get(
            "sha256"
        ):
            raise ValueError(
                f"{file} is not the file that was exported (its size or "
                "its SHA-256 differs from the manifest's): export the "
                "model again"
            )
    return manifest


def _numpy(x: Tensor) -> np.ndarray:
    return x.detach().cpu().contiguous().numpy()


class GraphTransformer(nn.Module):
    """The three graphs of :mod:`~transformer_lite.shipping.export`
    (encoder, cross-attention keys and values, one decoder step), seen
    by decoding as a :class:`~transformer_lite.model.Transformer`.
    Subclasses say how a graph runs (:meth:`run_graph`).

    ``decode`` needs a cache (``new_cache()``): the exported decoder
    computes one step. Its step ends with the output projection, so
    ``decode`` returns logits and :meth:`logits` passes them on.

    Shape:
        encode: (B, S) -> (B, S, C); decode: token (B, 1) -> (B, 1, V).
    """

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        self.eval()

    def run_graph(self, graph: str, feeds: dict[str, Tensor]) -> list[Tensor]:
        """Run ``graph`` (one of ``GRAPHS``) on named inputs; its
        outputs in order (the names of ``export_onnx``)."""
        raise NotImplementedError

    def _check_tokens(self, tokens: Tensor, vocab: int, name: str) -> Tensor:
        """The torch model's checks, made before a graph runs: a (B, L)
        tensor of int64 or int32 ids in the vocabulary (read on the CPU,
        where the graphs run), no longer than ``max_len``; as int64."""
        check_token_ids(tokens, vocab, name)
        if tokens.numel() == 0:
            raise ValueError(f"{name} is empty: shape {tuple(tokens.shape)}")
        return tokens.long()

    def source_mask(self, src: Tensor) -> Tensor:
        """The padding of ``src`` (B, S), checked: (B, 1, S), as the
        exported encoder masks it."""
        src = self._check_tokens(src, self.config.src_vocab, "src")
        return padding_mask(src, self.config.pad_id)  # (B, 1, S)

    def logits(self, hidden: Tensor) -> Tensor:
        """The decoder step's output is already the logits."""
        return hidden

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Source ids (B, S) -> memory (B, S, C). The graph builds the
        padding mask itself; another ``src_mask`` is refused."""
        src = self._check_tokens(src, self.config.src_vocab, "src")
        if src.size(1) > self.config.max_len:
            raise ValueError(
                f"src has {src.size(1)} positions; max_len is "
                f"{self.config.max_len}"
            )
        (memory,) = self.run_graph("encoder", {"src": src})
        if src_mask is not None:
            padding = padding_mask(src, self.config.pad_id)  # (B, 1, S)
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
        tgt = self._check_tokens(tgt, self.config.tgt_vocab, "tgt")
        if cache.length + 1 > self.config.max_len:
            raise ValueError(
                f"the step would be position {cache.length + 1}; max_len "
                f"is {self.config.max_len}"
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
        weights: str | None = None,
    ) -> None:
        super().__init__(config)
        paths = onnx_paths(directory, stem)
        missing = [p for p in paths.values() if not p.is_file()]
        if missing:
            raise ValueError(
                f"no ONNX file at {missing[0]}; export the model first"
            )
        manifest = read_manifest(directory, stem, config)
        if weights is not None and manifest["weights"] != weights:
            raise ValueError(
                f"the graphs at {Path(directory)} were exported from other "
                "weights than this model's (a retrained checkpoint?): "
                "export the model again"
            )
        self.sessions = {
            name: onnx_session(paths[name], threads=threads) for name in GRAPHS
        }
        self._run_options = require("onnxruntime", "ship").RunOptions()
        self._run_options.log_severity_level = QUIET
        for name, session in self.sessions.items():
            self._check_signature(name, session, paths[name])

    def _check_signature(self, name: str, session, path: Path) -> None:
        """The graph's input and output names, and the logits' width, are
        those the config implies."""
        inputs, outputs = graph_names(self.config)[name]
        got_in = [x.name for x in session.get_inputs()]
        got_out = [x.name for x in session.get_outputs()]
        if got_in != inputs or got_out != outputs:
            raise ValueError(
                f"{path} takes {got_in} and gives {got_out}; the config "
                f"implies {inputs} and {outputs}"
            )
        if name == "step":
            width = session.get_outputs()[0].shape[-1]
            if width != self.config.tgt_vocab:
                raise ValueError(
                    f"{path} gives logits over {width} tokens; the config "
                    f"has a target vocabulary of {self.config.tgt_vocab}"
                )

    def run_graph(self, graph: str, feeds: dict[str, Tensor]) -> list[Tensor]:
        arrays = {name: _numpy(x) for name, x in feeds.items()}
        outputs = self.sessions[graph].run(None, arrays, self._run_options)
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
