"""The library itself: loading, layouts against the header, poisoning."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from conftest import HERE

import kvcm
from kvcm._native import ffi


def run_python(code: str, plain: bool = False, **env: str) -> subprocess.CompletedProcess:
    e = dict(os.environ)
    e.update(env)
    if plain:
        e.pop("GLIBC_TUNABLES", None)  # as a user's process starts
    paths = [str(HERE)] if os.environ.get("KVCM_TEST_INSTALLED") == "1" else [str(HERE.parent), str(HERE)]
    e["PYTHONPATH"] = os.pathsep.join(paths)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True,
                          text=True, timeout=120)


def test_library_loads_in_a_plain_process():
    # A Go c-shared library whose static TLS block is larger than glibc's
    # surplus for dlopen fails to load in Python ("cannot allocate memory in
    # static TLS block") unless the user sets GLIBC_TUNABLES.
    r = run_python("import kvcm; print(kvcm.version())", plain=True)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == kvcm.version()


def test_struct_layouts_match_the_header():
    assert ffi.check_layouts() == []


def test_enum_values_match_the_error_classes():
    for code in ffi.StatusCode:
        if code == ffi.StatusCode.OK:
            continue
        e = kvcm.errors.error_for_code(int(code), "x")
        name = type(e).__name__.upper().replace("ERROR", "")
        assert name.replace("MANAGERCLOSED", "CLOSED").replace("STORAGEIO", "IO") == \
            code.name.replace("_", ""), (code, type(e))


def test_panic_becomes_internal_error_and_poisons():
    r = run_python(
        """
        import kvcm
        from conftest import small_config
        try:
            kvcm.library._debug_panic("boom from python")
        except kvcm.InternalError as e:
            print("internal:", "boom from python" in str(e))
        print("poisoned:", kvcm.is_poisoned())
        try:
            kvcm.KVCacheManager(small_config(), device="emu")
        except kvcm.PoisonedError as e:
            print("refused:", e.code)
        """,
        KVCM_ENABLE_DEBUG_PANIC="1",
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("\n")[:3] == ["internal: True", "poisoned: True", "refused: 14"], r.stdout


def test_debug_panic_is_off_by_default():
    r = run_python(
        """
        import kvcm
        try:
            kvcm.library._debug_panic()
        except kvcm.UnsupportedError:
            print("unsupported", kvcm.is_poisoned())
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "unsupported False"


def test_readme_example_runs():
    readme = (HERE.parent / "README.md").read_text()
    code = readme.split("```python\n", 1)[1].split("```", 1)[0]
    before = kvcm.live_handle_count()
    exec(compile(code, "README.md", "exec"), {})
    assert kvcm.live_handle_count() == before
