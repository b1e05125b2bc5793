"""Tasks tier (chapters 6, 7 and 10): the copy task, number words,
corpora, the tokenizer, metrics, the translator with its trainer and
command line, and the language-model corpus. Built on the training and
language-model tiers and the core.

The modules are imported one by one: the translation ones need the
``[translate]`` extra (``pip install transformer-lite[translate]``), the
copy task only the core.
"""
