"""Tasks tier (chapters 6, 7, 10, 11 and 14): the copy task, number
words, corpora, the tokenizer, metrics, the translator with its trainer
and command line, the language-model corpus, handwritten numbers, and a
domain's data: medical tables and macroeconomic series. Built on the
training, language-model, vision and domains tiers and the core.

The modules are imported one by one: the translation ones need the
``[translate]`` extra (``pip install transformer-lite[translate]``), the
handwritten numbers also the ``[vision]`` extra, the tables and series
the ``[domains]`` extra, the copy task only the core.
"""
