"""Optional dependencies (all chapters): the core needs only torch and
tqdm; charts need the ``[book]`` extra, the translation task the
``[translate]`` extra, export, ONNX Runtime and int8 quantisation
the ``[ship]`` extra (chapter 12), and the tables and series of
chapter 14 the ``[domains]`` extra (scikit-learn, statsmodels).
:func:`require` imports one, or says which extra installs it.
"""

import importlib
from types import ModuleType

__all__ = ["require"]


def require(module: str, extra: str) -> ModuleType:
    """Import ``module``, or raise an ``ImportError`` that names the
    extra to install: ``pip install 'transformer-lite[extra]'``."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{module} is needed here and is not installed: "
            f"pip install 'transformer-lite[{extra}]'"
        ) from err
