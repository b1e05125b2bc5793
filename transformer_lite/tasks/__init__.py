"""Tasks tier (chapters 6, 7, 10 and 11): the copy task, number words,
corpora, the tokenizer, metrics, the translator with its trainer and
command line, the language-model corpus, and handwritten numbers. Built
on the training, language-model and vision tiers and the core.

The modules are imported one by one: the translation ones need the
``[translate]`` extra (``pip install transformer-lite[translate]``), the
handwritten numbers also the ``[vision]`` extra, the copy task only the
core.
"""
