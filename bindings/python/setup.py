"""Build step of the kvcm Python package: bundle libkvcm.so into the wheel.

Everything declarative is in pyproject.toml; this file only adds the custom
step. Where the library comes from, in order:

1. ``KVCM_LIBRARY`` set at build time: that file is bundled as it is.
2. Inside the kvcm repository (``../../go.mod``): ``build/libkvcm.so``, built
   first with ``make lib`` (or ``go build -buildmode=c-shared`` of ``./capi/libkvcm``
   when the Makefile has no ``lib`` target) when it is missing or older than
   any Go, C or header source it is built from. Set ``KVCM_BUILD_LIB=always``
   to rebuild unconditionally, ``never`` to bundle what is there.
3. ``kvcm/libkvcm.so`` already in the package directory.

The wheel is tagged for this platform (``py3-none-<platform>``): it carries a
native library but no CPython extension, so one wheel serves every Python 3.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py as _build_py

try:  # setuptools >= 70.1 (pyproject.toml requires it)
    from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel
except ImportError:  # pragma: no cover - older setuptools with the wheel package
    from wheel.bdist_wheel import bdist_wheel as _bdist_wheel

HERE = Path(__file__).resolve().parent
LIBNAME = "libkvcm.so"
SOURCE_DIRS = ("capi", "core", "include", "gen")
SOURCE_SUFFIXES = (".go", ".c", ".h", ".s", ".S")


def _log(msg: str) -> None:
    print(f"kvcm build: {msg}", file=sys.stderr)


def _repo_root() -> Path | None:
    root = HERE.parent.parent
    gomod = root / "go.mod"
    try:
        if "module github.com/kvcm/kvcm" in gomod.read_text():
            return root
    except OSError:
        pass
    return None


def _newest_source(root: Path) -> float:
    newest = 0.0
    for files in [root.glob("go.mod"), root.glob("go.sum"), root.glob("Makefile")]:
        for f in files:
            newest = max(newest, f.stat().st_mtime)
    for d in SOURCE_DIRS:
        base = root / d
        if not base.is_dir():
            continue
        for dirpath, _, names in os.walk(base):
            for n in names:
                if n.endswith(SOURCE_SUFFIXES):
                    newest = max(newest, os.stat(os.path.join(dirpath, n)).st_mtime)
    return newest


def _has_make_target(root: Path, target: str) -> bool:
    try:
        text = (root / "Makefile").read_text()
    except OSError:
        return False
    return any(line.startswith(f"{target}:") for line in text.splitlines())


def _build_library(root: Path, out: Path) -> None:
    if _has_make_target(root, "lib") and shutil.which("make"):
        cmd = ["make", "-C", str(root), "lib"]
    else:
        go = shutil.which("go")
        if not go:
            raise RuntimeError(
                "kvcm build: libkvcm.so must be built, but neither `make lib` nor the Go toolchain "
                "is available. Install Go (https://go.dev/dl/) or set KVCM_LIBRARY to a built "
                "libkvcm.so."
            )
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [go, "build", "-buildmode=c-shared", "-o", str(out), "./capi/libkvcm"]
    _log("building the library: " + " ".join(cmd))
    env = dict(os.environ, CGO_ENABLED="1")
    subprocess.run(cmd, cwd=root, env=env, check=True)
    if not out.is_file():
        raise RuntimeError(f"kvcm build: {' '.join(cmd)} did not produce {out}")


def find_library() -> Path:
    env = os.environ.get("KVCM_LIBRARY")
    if env:
        p = Path(env)
        if not p.is_file():
            raise RuntimeError(f"kvcm build: KVCM_LIBRARY={env} is not a file")
        _log(f"bundling KVCM_LIBRARY={p}")
        return p
    root = _repo_root()
    if root is not None:
        lib = root / "build" / LIBNAME
        mode = os.environ.get("KVCM_BUILD_LIB", "auto")
        if mode not in ("auto", "always", "never"):
            raise RuntimeError(f"kvcm build: KVCM_BUILD_LIB must be auto, always or never, got {mode!r}")
        if mode == "always":
            stale, why = True, "KVCM_BUILD_LIB=always"
        elif not lib.is_file():
            stale, why = True, "it is missing"
        elif mode == "auto" and _newest_source(root) > lib.stat().st_mtime:
            stale, why = True, "sources are newer"
        else:
            stale, why = False, ""
        if stale and mode != "never":
            _log(f"{lib} needs building ({why})")
            _build_library(root, lib)
        if lib.is_file():
            _log(f"bundling {lib}")
            return lib
    bundled = HERE / "kvcm" / LIBNAME
    if bundled.is_file():
        _log(f"bundling {bundled}")
        return bundled
    raise RuntimeError(
        "kvcm build: no libkvcm.so to bundle. Build from a kvcm checkout (bindings/python), or "
        "set KVCM_LIBRARY to a built libkvcm.so."
    )


class build_py(_build_py):
    """build_py that also copies libkvcm.so into the built package."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:
            # An editable install imports the source tree, which finds the
            # library through KVCM_LIBRARY or the repository's build/.
            return
        lib = find_library()
        dst = Path(self.build_lib) / "kvcm" / LIBNAME
        dst.parent.mkdir(parents=True, exist_ok=True)
        if lib.resolve() != dst.resolve():
            shutil.copyfile(lib, dst)
        os.chmod(dst, 0o755)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outs = list(super().get_outputs(include_bytecode))
        lib = str(Path(self.build_lib) / "kvcm" / LIBNAME)
        if not self.editable_mode and lib not in outs:
            outs.append(lib)
        return outs


class bdist_wheel(_bdist_wheel):
    """A platform wheel that works with every Python 3 (no extension module)."""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self) -> tuple[str, str, str]:
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(cmdclass={"build_py": build_py, "bdist_wheel": bdist_wheel})
