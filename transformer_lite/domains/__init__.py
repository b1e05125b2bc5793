"""Domains tier (chapter 14): a table as feature tokens (the
FT-Transformer), a time series as patches (PatchTST) on RevIN's
normalised windows, the baselines practitioners use, and splits that
keep the future out of training.

Built on the core only; nothing in the core imports this package.
"""

from transformer_lite.domains.baselines import (
    DLinear,
    LastValue,
    SeasonalLastValue,
    last_value,
    moving_average,
    seasonal_last_value,
)
from transformer_lite.domains.series import (
    Moments,
    PatchForecaster,
    RevIN,
    check_window,
    n_patches,
    to_patches,
)
from transformer_lite.domains.splits import (
    Fold,
    PastScaler,
    Standardiser,
    make_windows,
    walk_forward,
    window_origins,
)
from transformer_lite.domains.tabular import (
    FeatureTokenizer,
    FTTransformer,
    check_table,
)

__all__ = [
    "DLinear",
    "FTTransformer",
    "FeatureTokenizer",
    "Fold",
    "LastValue",
    "Moments",
    "PastScaler",
    "PatchForecaster",
    "RevIN",
    "SeasonalLastValue",
    "Standardiser",
    "check_table",
    "check_window",
    "last_value",
    "make_windows",
    "moving_average",
    "n_patches",
    "seasonal_last_value",
    "to_patches",
    "walk_forward",
    "window_origins",
]
