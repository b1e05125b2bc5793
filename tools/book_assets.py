"""Fetch the JavaScript the HTML book serves itself, so it works offline.

The book must not load anything from a CDN. Three libraries are needed:

* MathJax 3, from the npm package ``mathjax`` (its ``es5/`` folder, fonts
  included). ``npm pack`` fetches the tarball once into ``.cache/``; its
  checksum is pinned below.
* vega, vega-lite and vega-embed for altair's charts, as the one bundle that
  ``vl-convert-python`` ships. The bundle declares top-level names, so it is
  wrapped in a function to keep them out of Sphinx's global scope, and it
  tells altair's chart code that the libraries are already loaded.
* reveal.js, from its npm package (the ``dist/`` folder, themes and fonts
  included), for the chapters' slides (``tools/slides.py``); checksum
  pinned as MathJax's.

All land in ``.cache/book_static/`` (git-ignored), which the Sphinx
extension ``tools/book_extension.py`` serves as ``_static`` files. A second
run finds them in place and returns at once.

Run: ``.venv/bin/python tools/book_assets.py`` (``make book`` does).
"""

import base64
import hashlib
import json
import shutil
import subprocess
import tarfile
import tempfile
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"
STATIC = CACHE / "book_static"  # tools/book_extension.py reads it

MATHJAX_VERSION = "3.2.2"
MATHJAX_SHA512 = (  # the npm registry's "integrity" of mathjax-3.2.2.tgz
    "Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZG"
    "JvtRZM1vO+geW0OhGw=="
)
MATHJAX_DIR = STATIC / "mathjax"
REVEAL_VERSION = "5.2.1"
REVEAL_SHA512 = (  # the npm registry's "integrity" of reveal.js-5.2.1.tgz
    "r7//6mIM5p34hFiDMvYfXgyjXqGRta+/psd9YtytsgRlrpRzFv4RbH76TXd2qD+7ZPZE"
    "bpBDhdRhJaFgfQ7zNQ=="
)
REVEAL_DIR = STATIC / "reveal"
VEGA_FILE = STATIC / "vega" / "vega-altair.js"


def sha512_base64(path: Path) -> str:
    """The checksum npm calls "integrity" (without the ``sha512-``)."""
    digest = hashlib.sha512(path.read_bytes()).digest()
    return base64.b64encode(digest).decode()


def unpack_npm(
    name: str, version: str, sha512: str, folder: str, dest: Path
) -> None:
    """Unpack ``package/<folder>/`` of the npm tarball ``name@version``
    (its checksum pinned) into ``dest``, with the package's LICENSE and a
    VERSION stamp; nothing to do if ``dest`` holds that version."""
    stamp = dest / "VERSION"
    if stamp.is_file() and stamp.read_text().strip() == version:
        return
    tarball = CACHE / f"{name}-{version}.tgz"
    if not tarball.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "pack", f"{name}@{version}", "--silent"],
            cwd=CACHE,
            check=True,
            stdout=subprocess.DEVNULL,
        )
    if sha512_base64(tarball) != sha512:
        raise SystemExit(f"{tarball}: checksum differs from the pinned one")
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        with tarfile.open(tarball) as tar:
            wanted = [
                m
                for m in tar.getmembers()
                if m.name.startswith(f"package/{folder}/")
                or m.name == "package/LICENSE"
            ]
            tar.extractall(tmp, members=wanted, filter="data")
        unpacked = Path(tmp) / "package"
        shutil.move(unpacked / "LICENSE", unpacked / folder / "LICENSE")
        (unpacked / folder / "VERSION").write_text(version + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(unpacked / folder, dest)
    print(f"{name} {version} -> {dest.relative_to(ROOT)}")


def fetch_mathjax() -> None:
    """Unpack MathJax's ``es5/`` folder into ``.cache/book_static/mathjax``."""
    unpack_npm("mathjax", MATHJAX_VERSION, MATHJAX_SHA512, "es5", MATHJAX_DIR)


def fetch_reveal() -> None:
    """Unpack reveal.js's ``dist/`` folder (the slides' library, its
    themes and their fonts) into ``.cache/book_static/reveal``."""
    unpack_npm("reveal.js", REVEAL_VERSION, REVEAL_SHA512, "dist", REVEAL_DIR)


def major_minor(version: str) -> str:
    """``"6.4.1"`` -> ``"6.4"``."""
    return ".".join(version.split(".")[:2])


def write_vega_bundle() -> None:
    """Write vega + vega-lite + vega-embed as one script for the page head.

    altair's chart HTML loads each library from a CDN unless the global
    ``VEGA_DEBUG`` says that version is loaded already; the versions it
    asks for are altair's own, so the bundle must match them.
    """
    # Cheap to check: the package versions the file was made from.
    header = (
        f"/* made by tools/book_assets.py from vl-convert-python "
        f"{version('vl-convert-python')} for altair {version('altair')} */\n"
    )
    if VEGA_FILE.is_file():
        with VEGA_FILE.open() as f:
            if f.readline() == header:
                return

    import altair as alt
    import vl_convert as vlc

    wanted = {  # the keys altair's chart code looks up
        "vega_version": alt.VEGA_VERSION,
        "vegalite_version": alt.VEGALITE_VERSION,
        "vegaembed_version": alt.VEGAEMBED_VERSION,
    }
    vega_lite = major_minor(alt.VEGALITE_VERSION)
    available = vlc.get_vegalite_versions()
    if vega_lite not in available:
        raise SystemExit(
            f"altair {alt.__version__} needs vega-lite {vega_lite}; "
            f"vl-convert-python {vlc.__version__} has {available}"
        )
    for name, have, need in [
        ("vega", vlc.get_vega_version(), alt.VEGA_VERSION),
        ("vega-embed", vlc.get_vega_embed_version(), alt.VEGAEMBED_VERSION),
    ]:
        if have.split(".")[0] != need.split(".")[0]:
            raise SystemExit(f"altair needs {name} {need}; bundle has {have}")

    libraries = (
        f"/* vega {vlc.get_vega_version()}, vega-lite {alt.VEGALITE_VERSION},"
        f" vega-embed {vlc.get_vega_embed_version()} */\n"
    )
    bundle = vlc.javascript_bundle(vl_version=vega_lite)
    script = (
        f"{header}{libraries}(function () {{\n{bundle}\n}})();\n"
        "window.VEGA_DEBUG = Object.assign(window.VEGA_DEBUG || {}, "
        f"{json.dumps(wanted)});\n"
    )
    VEGA_FILE.parent.mkdir(parents=True, exist_ok=True)
    VEGA_FILE.write_text(script)
    print(f"{libraries.strip()} -> {VEGA_FILE.relative_to(ROOT)}")


if __name__ == "__main__":
    fetch_mathjax()
    fetch_reveal()
    write_vega_bundle()
