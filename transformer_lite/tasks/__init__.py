"""Tasks tier (chapters 6 and 7): the copy task, number words, corpora,
the tokenizer, metrics and the translator with its trainer and command
line. Built on the training tier and the core.

The modules are imported one by one: the translation ones need the
``[translate]`` extra (``pip install transformer-lite[translate]``), the
copy task only the core.
"""
