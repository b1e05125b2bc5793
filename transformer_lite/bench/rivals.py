"""The language model against what a reader would use instead (chapter
13): Hugging Face's ``GPT2LMHeadModel`` and ``nn.TransformerEncoder``
under a causal mask, the same sizes, side by side in one run.

Ours is built by :func:`~transformer_lite.adapt.gpt2.from_hf_gpt2` from
the very GPT-2 it is timed against, so the two compute the same
function: the training rows time the same arithmetic written two ways,
and greedy generation must give the same tokens. The timed steps train
the two apart (each its own dropout draws and updates), so ours is
copied from Hugging Face's again before they generate. The PyTorch rival is
the same decoder-only model made of PyTorch's own layers (pre-LN, GELU,
learned positions, tied output layer).

Each training contender runs the same step: forward, the mean
cross-entropy of the next token, backward, an AdamW step. Needs the
``[hf]`` extra; without it the measurement is skipped, with the reason.
"""

from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_lite.bench.cases import (
    DECODING_REPEATS,
    _paired_ratio,
    _summary,
    alternate,
)
from transformer_lite.bench.fixtures import Sizes
from transformer_lite.bench.generation import PROMPT_LEN
from transformer_lite.device import seed_everything
from transformer_lite.extras import require
from transformer_lite.lm.generate import generate
from transformer_lite.masks import causal_mask

__all__ = ["TorchDecoderOnly", "bench_rivals", "hf_gpt2"]


def hf_gpt2(s: Sizes, max_len: int) -> nn.Module:
    """Hugging Face's GPT-2 at the benchmark's sizes, random weights
    (built from a config: nothing is downloaded), PyTorch's fused
    attention (``attn_implementation="sdpa"``)."""
    transformers = require("transformers", "hf")
    config = transformers.GPT2Config(
        vocab_size=s.vocab,
        n_positions=max_len,
        n_embd=s.d_model,
        n_layer=s.n_layers,
        n_head=s.n_heads,
        n_inner=s.d_ff,
        resid_pdrop=s.dropout,
        embd_pdrop=s.dropout,
        attn_pdrop=s.dropout,
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation="sdpa",
    )
    return transformers.GPT2LMHeadModel(config)


class TorchDecoderOnly(nn.Module):
    """GPT-2's layout from PyTorch's layers: token and learned position
    embeddings, ``nn.TransformerEncoder`` (pre-LN, GELU's tanh form, no
    dropout inside the feed-forward network) under a causal mask, a
    final LayerNorm, the output layer tied to the token embedding.

    Shape:
        tokens: (B, L); output: (B, L, V).
    """

    def __init__(self, s: Sizes, max_len: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(s.vocab, s.d_model)
        self.positions = nn.Embedding(max_len, s.d_model)
        self.dropout = nn.Dropout(s.dropout)
        layer = nn.TransformerEncoderLayer(
            s.d_model,
            s.n_heads,
            s.d_ff,
            s.dropout,
            activation=nn.GELU(approximate="tanh"),
            batch_first=True,
            norm_first=True,
        )
        # GPT-2 drops nothing inside its MLP, and neither does ours
        # loaded from it: PyTorch's layer drops there unless told not to.
        layer.dropout = nn.Identity()
        self.blocks = nn.TransformerEncoder(
            layer, s.n_layers, enable_nested_tensor=False
        )
        self.norm = nn.LayerNorm(s.d_model)
        self.generator = nn.Linear(s.d_model, s.vocab, bias=False)
        self.generator.weight = self.embed.weight

    def forward(self, tokens: Tensor) -> Tensor:
        L = tokens.size(1)
        where = torch.arange(L, device=tokens.device)  # (L,)
        x = self.dropout(self.embed(tokens) + self.positions(where))
        # PyTorch's mask says True = masked out: the opposite of ours
        masked = ~causal_mask(L, tokens.device)[0]  # (L, L)
        x = self.blocks(x, mask=masked, is_causal=True)  # (B, L, C)
        return self.generator(self.norm(x))  # (B, L, V)


def _step(
    logits_of, optimizer: torch.optim.Optimizer, tokens: Tensor
) -> float:
    """One step on next-token prediction: the same for every contender."""
    logits = logits_of(tokens[:, :-1])  # (B, L - 1, V)
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


def bench_rivals(s: Sizes, device: torch.device, repeats: int) -> dict:
    """The training step of ours, Hugging Face's GPT-2 and the PyTorch
    decoder-only model, and greedy generation with the cache, ours
    against Hugging Face's ``generate``; paired ratios to ours."""
    try:
        from transformer_lite.adapt.gpt2 import from_hf_gpt2
    except ImportError as err:
        return {"skipped": str(err)}
    new_tokens = max(s.decode_tokens)
    max_len = max(s.length + 1, PROMPT_LEN + new_tokens)
    seed_everything(0)
    hf = hf_gpt2(s, max_len).to(device).train()
    ours = from_hf_gpt2(hf, kernel="fused").train()
    torch_lm = TorchDecoderOnly(s, max_len).to(device).train()
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, s.vocab, (s.batch, s.length + 1), generator=g)
    tokens = tokens.to(device)  # (B, L + 1)
    logits_of = {
        "ours": ours,
        "Hugging Face GPT-2": lambda x: hf(input_ids=x).logits,
        "nn.TransformerEncoder": torch_lm,
    }
    models = {"ours": ours, "Hugging Face GPT-2": hf,
              "nn.TransformerEncoder": torch_lm}  # fmt: skip
    contenders = {}
    for name, model in models.items():
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        contenders[name] = partial(_step, logits_of[name], optimizer, tokens)
        contenders[name]()  # warm up
    times = alternate(contenders, repeats, device, "language model step")
    training = {name: _summary(t) for name, t in times.items()}
    for name in ("Hugging Face GPT-2", "nn.TransformerEncoder"):
        training[name]["paired_ratio"] = _paired_ratio(
            times["ours"], times[name]
        )
    training["parameters"] = ours.count_parameters()
    hf_parameters = sum(p.numel() for p in hf.parameters())
    torch_parameters = sum(p.numel() for p in torch_lm.parameters())
    training["same_parameter_count"] = (
        training["parameters"] == hf_parameters == torch_parameters
    )
    # The steps trained ours and Hugging Face's apart (each its own
    # dropout draws and updates): copy HF's weights again to generate.
    ours = from_hf_gpt2(hf, kernel="fused")
    return {
        "training": training,
        "generation": _generation(s, device, ours, hf, new_tokens),
    }


def _generation(
    s: Sizes, device: torch.device, ours: nn.Module, hf: nn.Module, n: int
) -> dict:
    """Greedy generation with the key/value cache: ours and Hugging
    Face's ``generate``, same prompt, same weights."""
    ours.eval()
    hf.eval()
    g = torch.Generator().manual_seed(2)
    prompt = torch.randint(
        0, s.vocab, (s.decode_batch, PROMPT_LEN), generator=g
    )
    prompt = prompt.to(device)  # (B, L)

    def hf_generate() -> Tensor:
        with torch.no_grad():
            return hf.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                use_cache=True,
                pad_token_id=0,
            )

    contenders = {
        "ours": partial(generate, ours, prompt, n, temperature=0),
        "Hugging Face GPT-2": hf_generate,
    }
    for run in contenders.values():
        run()  # warm up
    outputs = {}
    repeats = DECODING_REPEATS
    times = alternate(contenders, repeats, device, "generating", outputs)
    row = {name: _summary(t) for name, t in times.items()}
    row.update(batch=s.decode_batch, prompt=PROMPT_LEN, new_tokens=n)
    row["paired_ratio"] = _paired_ratio(
        times["ours"], times["Hugging Face GPT-2"]
    )
    row["same_tokens"] = torch.equal(
        outputs["ours"], outputs["Hugging Face GPT-2"]
    )
    return row
