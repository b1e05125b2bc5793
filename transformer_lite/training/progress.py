"""Progress bars where a person watches them (chapters 6 and 7)."""

import sys
import warnings

from tqdm import TqdmWarning

with warnings.catch_warnings():  # without ipywidgets: text bars, quietly
    warnings.simplefilter("ignore", TqdmWarning)
    from tqdm.auto import tqdm

__all__ = ["progress_bar", "watched"]


def watched() -> bool:
    """True in a Jupyter notebook or when stderr is a terminal; False
    when output goes to a file or a pipe, where a bar's carriage returns
    would fill a log with half-drawn lines."""
    shell = sys.modules.get("IPython")
    if shell is not None:
        ipython = shell.get_ipython()
        if type(ipython).__name__ == "ZMQInteractiveShell":
            return True
    stream = sys.stderr
    return stream is not None and hasattr(stream, "isatty") and stream.isatty()


def progress_bar(total: int | None, desc: str, show: bool = True) -> tqdm:
    """A ``tqdm`` bar that disappears when done (``leave=False``), shown
    only if ``show`` and someone watches (:func:`watched`). It redraws at
    most once a second, not tqdm's ten: in a notebook every redraw is a
    message from the kernel, and a reader needs no more than one a
    second, even in chapter 7's four-minute training cell."""
    return tqdm(
        total=total,
        desc=desc,
        disable=not (show and watched()),
        leave=False,
        mininterval=1.0,
    )
