"""Hugging Face's BERT in the book's classes: every layer's output, the
pooled vector, the masked-LM and classifier logits and the gradients
equal BERT's in float64, with padding and token types, under both of
Hugging Face's attention implementations and both of our kernels; and
what we cannot compute exactly is refused. No download: small random
models with every bias and LayerNorm moved off its start."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import (  # noqa: E402
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertForSequenceClassification,
    BertModel,
)

from transformer_lite.adapt.bert import from_hf_bert  # noqa: E402
from transformer_lite.attention import MultiHeadAttention  # noqa: E402
from transformer_lite.lm import EncoderClassifier, EncoderModel  # noqa: E402

V, PAD, TYPES = 37, 1, 3  # a pad id that is not 0, three token types
ATTENTION = ["eager", "sdpa"]
OUR_KERNELS = ["plain", "fused"]


def bert_config(attention: str = "eager", **fields) -> BertConfig:
    sizes = dict(
        vocab_size=V,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=40,
        max_position_embeddings=24,
        type_vocab_size=TYPES,
        pad_token_id=PAD,
        layer_norm_eps=1e-7,  # not our default: it must be read
        attn_implementation=attention,
    )
    return BertConfig(**{**sizes, **fields})


def hf_model(kind=BertForMaskedLM, attention="eager", seed=0, **fields):
    """A random ``kind`` in float64 and eval mode, every 1-d parameter
    (biases, LayerNorm weights) moved off its start, so that a bias
    copied to the wrong place, or not at all, shows."""
    torch.manual_seed(seed)
    model = kind(bert_config(attention, **fields)).double().eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.3 * torch.randn(p.shape, generator=g).double())
    return model


def batch():
    """(3, 9) ids with two padded rows and token types of all three
    kinds; the attention mask BERT reads."""
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(2, V, (3, 9), generator=g)
    ids[0, 6:] = PAD
    ids[2, 4:] = PAD
    types = torch.randint(0, TYPES, (3, 9), generator=g)
    return ids, types, (ids != PAD).long()


def ours_from(model, kernel: str):
    ours = from_hf_bert(model, kernel=kernel)
    kernels = {m.kernel for m in ours.modules()
               if isinstance(m, MultiHeadAttention)}  # fmt: skip
    assert kernels == {kernel}
    return ours


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("kernel", OUR_KERNELS)
@pytest.mark.parametrize("act", ["gelu", "gelu_new", "relu"])
def test_every_layer_and_the_pooled_vector_equal_bert(attention, kernel, act):
    model = hf_model(BertModel, attention, hidden_act=act)
    ours = ours_from(model, kernel)
    assert isinstance(ours, EncoderModel) and ours.mlm_head is None
    ids, types, mask = batch()
    with torch.no_grad():
        theirs = model(ids, attention_mask=mask, token_type_ids=types,
                       output_hidden_states=True)  # fmt: skip
        layers = ours.layer_outputs(ids, types)
        assert len(layers) == len(theirs.hidden_states) == 3
        for mine, hf in zip(layers, theirs.hidden_states, strict=True):
            close(mine, hf)
        close(ours.hidden_states(ids, types), theirs.last_hidden_state)
        close(ours.pooled(ids, types), theirs.pooler_output)


@pytest.mark.parametrize("attention", ATTENTION)
def test_without_token_types_both_read_type_zero(attention):
    model = hf_model(BertModel, attention)
    ours = from_hf_bert(model)
    ids, _, mask = batch()
    with torch.no_grad():
        close(ours.hidden_states(ids), model(ids, mask).last_hidden_state)


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("kernel", OUR_KERNELS)
@pytest.mark.parametrize("tied", [True, False])
def test_masked_lm_logits_equal_bert(attention, kernel, tied):
    model = hf_model(attention=attention, tie_word_embeddings=tied)
    ours = ours_from(model, kernel)
    assert ours.pooler is None  # BertForMaskedLM has none
    assert ours.config.tie_embeddings == tied
    table = ours.embedding.token.weight
    assert (ours.mlm_head.output.weight is table) == tied
    ids, types, mask = batch()
    with torch.no_grad():
        expected = model(ids, attention_mask=mask, token_type_ids=types)
        close(ours(ids, types), expected.logits)


@pytest.mark.parametrize("attention", ATTENTION)
@pytest.mark.parametrize("kernel", OUR_KERNELS)
def test_classifier_logits_equal_bert(attention, kernel):
    model = hf_model(BertForSequenceClassification, attention, num_labels=4,
                     classifier_dropout=0.25)  # fmt: skip
    ours = ours_from(model, kernel)
    assert isinstance(ours, EncoderClassifier)
    assert ours.dropout.p == 0.25
    ids, types, mask = batch()
    with torch.no_grad():
        expected = model(ids, attention_mask=mask, token_type_ids=types)
        close(ours(ids, types), expected.logits)


@pytest.mark.parametrize("attention", ATTENTION)
def test_gradients_equal_bert(attention):
    model = hf_model(attention=attention)
    ours = from_hf_bert(model)
    ids, types, mask = batch()
    g = torch.Generator().manual_seed(3)
    weights = torch.randn(3, 9, V, dtype=torch.float64, generator=g)
    real = mask[..., None]  # the loss reads real positions only
    (model(ids, attention_mask=mask, token_type_ids=types).logits
     * weights * real).sum().backward()  # fmt: skip
    (ours(ids, types) * weights * real).sum().backward()
    hf_embed, hf_layers = model.bert.embeddings, model.bert.encoder.layer
    embed, layers = ours.embedding, ours.encoder.layers
    hf_head, head = model.cls.predictions, ours.mlm_head
    pairs = [
        (embed.token, hf_embed.word_embeddings),
        (embed.position, hf_embed.position_embeddings),
        (embed.token_type, hf_embed.token_type_embeddings),
        (layers[0].self_attn.w_q, hf_layers[0].attention.self.query),
        (layers[1].self_attn.w_v, hf_layers[1].attention.self.value),
        (layers[1].norm2, hf_layers[1].output.LayerNorm),
        (head.dense, hf_head.transform.dense),
    ]
    for mine, theirs in pairs:
        close(mine.weight.grad, theirs.weight.grad)
        if hasattr(mine, "bias"):
            close(mine.bias.grad, theirs.bias.grad)
    close(head.output.bias.grad, hf_head.decoder.bias.grad)


@pytest.mark.parametrize(
    "kind, fields",
    [
        (BertModel, {}),
        (BertForMaskedLM, {}),
        (BertForMaskedLM, dict(tie_word_embeddings=False)),
        (BertForSequenceClassification, dict(num_labels=3)),
    ],
)
def test_every_weight_is_copied_bit_for_bit(kind, fields):
    """Ours holds as many numbers as BERT, each of our tensors equal to
    one of BERT's, exactly (a copy through float32 would round)."""
    model = hf_model(kind, **fields)
    ours = from_hf_bert(model)
    theirs = list(model.parameters())  # each shared tensor once
    if kind is BertForMaskedLM:  # untied, predictions.bias is unused
        head = model.cls.predictions
        if head.bias is not head.decoder.bias:
            theirs = [q for q in theirs if q is not head.bias]
    assert ours.count_parameters() == sum(p.numel() for p in theirs)
    for name, p in ours.named_parameters():
        assert p.dtype == torch.float64, name
        assert any(p.shape == q.shape and torch.equal(p, q) for q in theirs), (
            name
        )


def test_the_copy_keeps_device_dtype_mode_and_the_random_stream():
    model = hf_model(BertModel).float().train()
    torch.manual_seed(11)
    expected = torch.rand(3)
    torch.manual_seed(11)
    ours = from_hf_bert(model)
    assert torch.equal(torch.rand(3), expected)  # no draw taken
    assert ours.training
    assert {p.dtype for p in ours.parameters()} == {torch.float32}
    assert ours.device == torch.device("cpu")
    assert from_hf_bert(model.eval()).training is False


def test_the_copy_is_made_on_the_models_device(device):
    model = hf_model().to(device)
    ours = from_hf_bert(model)
    assert ours.device == next(model.parameters()).device  # cuda:0, not cuda
    ids, types, mask = (t.to(device) for t in batch())
    with torch.no_grad():
        expected = model(ids, attention_mask=mask, token_type_ids=types)
        close(ours(ids, types), expected.logits)


def test_the_copy_is_independent_of_the_original():
    model = hf_model()
    ours = from_hf_bert(model)
    with torch.no_grad():
        model.bert.embeddings.word_embeddings.weight.add_(1.0)
    assert not torch.equal(
        ours.embedding.token.weight,
        model.bert.embeddings.word_embeddings.weight,
    )


def test_the_config_is_read():
    model = hf_model(BertModel)
    c = from_hf_bert(model).config
    assert (c.vocab, c.n_layers, c.d_model, c.d_ff, c.n_heads) == (
        V, 2, 16, 40, 4)  # fmt: skip
    assert (c.max_len, c.type_vocab, c.pad_id, c.norm_eps) == (
        24, TYPES, PAD, 1e-7)  # fmt: skip
    assert c.activation == "gelu"
    assert c.inner_dropout is False  # BERT's FFN drops nothing inside
    assert from_hf_bert(model, pad_id=5).config.pad_id == 5


def test_pad_id_is_needed_when_the_config_has_none():
    model = hf_model(BertModel, pad_token_id=None)
    with pytest.raises(ValueError, match="no pad_token_id: pass pad_id="):
        from_hf_bert(model)
    ours = from_hf_bert(model, pad_id=PAD)
    ids, types, mask = batch()
    with torch.no_grad():
        close(ours.hidden_states(ids, types),
              model(ids, mask, types).last_hidden_state)  # fmt: skip


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(is_decoder=True), "is_decoder=True"),
        (dict(is_decoder=True, add_cross_attention=True), "decoder"),
        (dict(position_embedding_type="relative_key"), "relative_key"),
        (dict(hidden_act="silu"), "hidden_act='silu'"),
        (dict(attention_probs_dropout_prob=0.2), "pass dropout="),
    ],
)
def test_what_we_cannot_compute_is_refused(fields, match):
    model = hf_model(BertModel, **fields)
    with pytest.raises(ValueError, match=match):
        from_hf_bert(model)


def test_dropout_is_chosen_when_the_two_rates_differ():
    model = hf_model(BertModel, attention_probs_dropout_prob=0.2)
    ours = from_hf_bert(model, dropout=0.2)
    assert ours.config.dropout == 0.2
    assert ours.encoder.layers[0].self_attn.dropout_p == 0.2
    with pytest.raises(ValueError, match="dropout must be"):
        from_hf_bert(model, dropout=1.5)


def test_other_classes_are_refused():
    with pytest.raises(ValueError, match="BertForMaskedLM"):
        from_hf_bert(hf_model(BertForPreTraining))
    with pytest.raises(ValueError, match="got Linear"):
        from_hf_bert(torch.nn.Linear(2, 2))


def test_mixed_dtypes_and_meta_weights_are_refused():
    model = hf_model(BertModel)
    model.pooler.float()
    with pytest.raises(ValueError, match="one device and one dtype"):
        from_hf_bert(model)
    with torch.device("meta"):
        empty = BertModel(bert_config())
    with pytest.raises(ValueError, match="meta device"):
        from_hf_bert(empty)
