"""Finding libkvcm.so.

Order: the ``KVCM_LIBRARY`` environment variable when set (an explicit
override, for development: it must name an existing file), else
``libkvcm.so`` next to this package (what ``pip install`` bundles), else, for
a source checkout, the repository's ``build/libkvcm.so`` (what ``make lib``
builds).
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import LibraryNotFoundError

LIBNAME = "libkvcm.so"
ENV = "KVCM_LIBRARY"


def candidates() -> list[tuple[str, Path]]:
    here = Path(__file__).resolve().parent
    out: list[tuple[str, Path]] = []
    env = os.environ.get(ENV)
    if env:
        out.append((f"${ENV}", Path(env)))
    out.append(("next to the package", here / LIBNAME))
    repo = here.parent.parent.parent  # <repo>/bindings/python/kvcm
    if (repo / "go.mod").is_file():
        out.append(("the source checkout's build/", repo / "build" / LIBNAME))
    return out


def find_library() -> Path:
    """The path of libkvcm.so, or raise LibraryNotFoundError."""
    env = os.environ.get(ENV)
    if env:
        p = Path(env)
        if not p.is_file():
            raise LibraryNotFoundError(f"kvcm: {ENV}={env} does not name a file")
        return p
    tried = []
    for what, p in candidates():
        if p.is_file():
            return p
        tried.append(f"{what} ({p})")
    raise LibraryNotFoundError(
        "kvcm: libkvcm.so not found; looked " + ", ".join(tried)
        + f". Install the package with pip (it bundles the library), or build it "
        f"(`make lib`) and set {ENV} to its path."
    )
