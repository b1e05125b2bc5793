"""Domains tier (chapter 14): a table as feature tokens (the
FT-Transformer), a time series as patches (PatchTST) with the baselines
practitioners use, and splits that keep the future out of training.

Built on the core only; nothing in the core imports this package.
"""
