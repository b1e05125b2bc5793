"""Adaptation tier (chapter 13): take a model that was trained already
and make it serve something new. LoRA adds a small trainable update to
chosen linear layers of a frozen model (:mod:`transformer_lite.adapt.lora`,
its checks and adapter files in :mod:`transformer_lite.adapt.lora_checks`);
the interop functions load the weights of Hugging Face's GPT-2 into the
book's own language model (:mod:`transformer_lite.adapt.gpt2`) and those
of its BERT into the book's encoder-only model
(:mod:`transformer_lite.adapt.bert`); both check the weights they copy
in :mod:`transformer_lite.adapt.hf_weights`.

Built on the core, the language models and the training tier's
checkpoint code. The modules are imported one by one: the interop needs
the ``[hf]`` extra (``transformers``), LoRA needs nothing more.
"""
