"""Benchmark tier (chapter 8): ``python -m transformer_lite.bench``.

:mod:`~transformer_lite.bench.fixtures` holds what is compared,
:mod:`~transformer_lite.bench.cases` the measurements (and
:mod:`~transformer_lite.bench.generation` the language model's, and
:mod:`~transformer_lite.bench.rivals` it against Hugging Face's GPT-2
and PyTorch's layers),
:mod:`~transformer_lite.bench.memory` the peak-memory meter and
:mod:`~transformer_lite.bench.report` the tables and the command line.
"""
