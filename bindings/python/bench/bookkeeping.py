"""The bookkeeping trace from Python: what the binding costs over the C calls.

The trace (issue 11): prompts of 1k, 8k and 32k tokens at 32 tokens a
block, every other request sharing half its prompt with the one before; per
request: create with prefix lookup -> resume -> resize for the uncached
tokens -> commit them -> 128 one-token decode steps (resize +1, commit 1) ->
close. Each figure is process CPU time per request over interleaved rounds,
each round on a fresh manager: the minimum (``--stat median`` for the
median).

Five ways to run the same cycle, measured in the same run:

* ``binding``: the kvcm package (``create_kv_cache``, ``resume``,
  ``resize``, ``commit``, ``close``), prompts as lists;
* ``array``: the same with prompts as ``array('i')`` (taken without a
  copy);
* ``ctypes``: the same C functions called through ctypes directly, with
  prebuilt argument objects and no Python-level wrapper: what any ctypes
  binding costs at least;
* ``compiled``: the decode step's calls (and the prompt's commit) through
  ``cext.c``, a CPython extension prototype compiled at run time with the
  binding's rules (checked integers, tokens from a list or an int32 buffer,
  GIL released, status raised); create, resume and close through the
  binding. It shows what the compiled binding issue 11 allows would cost;
  it is not part of the package;
* ``C``: the cycle in C (``cycle.c``, compiled at run time against the same
  libkvcm.so), no Python in the loop: the Go cycle plus one C call per
  call, the reference of the ratios.

It also prints, per scalar call, the binding's cost over the C call and over
the raw ctypes call (best of rounds), and the cost of a token list becoming
a C array (the binding's conversion against the former
``(c_int32 * n)(*tokens)`` and ``array('i', list)``).

``--go`` adds the Go cycle as measured by ``kvcm bench bookkeeping`` (run
as the given command, which must print ``<prompt> <µs per request>`` lines),
when that command exists.

Usage: python3 bindings/python/bench/bookkeeping.py [--rounds 5] [--quick] (``make bench-python``)
"""

from __future__ import annotations

import argparse
import array
import ctypes
import os
import statistics
import importlib.util
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import kvcm  # noqa: E402
from kvcm import (  # noqa: E402
    AttentionLayerConfig,
    BufferConfig,
    GpuCacheTierConfig,
    KVCacheManager,
    KVCacheManagerConfig,
)
from kvcm import _ffi as ffi  # noqa: E402

TPB = 32
DECODE_STEPS = 128
PROMPTS = (1024, 8192, 32768)


def requests(prompt: int, n: int) -> list[list[int]]:
    """n prompts of prompt tokens; every odd one shares its first half with
    the one before."""
    out: list[list[int]] = []
    next_token = 1
    for i in range(n):
        if i % 2 == 1:
            half = out[-1][: prompt // 2]
            fresh = list(range(next_token, next_token + prompt - len(half)))
            out.append(half + fresh)
        else:
            fresh = list(range(next_token, next_token + prompt))
            out.append(fresh)
        next_token += prompt
    return out


def config(prompt: int) -> KVCacheManagerConfig:
    # Room for two requests' blocks (the shared pair), so nothing is evicted
    # within a pair; older blocks are evicted as the run goes on.
    blocks = 2 * ((prompt + DECODE_STEPS) // TPB + 2)
    page = 2 * 16
    return KVCacheManagerConfig(
        tokens_per_block=TPB,
        cache_tiers=[GpuCacheTierConfig(blocks * page)],
        layers=[AttentionLayerConfig(0, [BufferConfig("key", 16), BufferConfig("value", 16)])],
        max_util_for_resume=1.0,
    )


def binding_cycle(m: KVCacheManager, stream, prompts, decode) -> float:
    t0 = time.process_time()
    for p in prompts:
        c = m.create_kv_cache(input_tokens=p)
        c.resume(stream)
        n = len(p)
        c.resize(n, n)
        c.commit(p[c.num_committed_tokens:])
        for k in range(DECODE_STEPS):
            c.resize(n + k + 1, n + k + 1)
            c.commit(decode)
        c.close()
    return (time.process_time() - t0) / len(prompts)


class Raw:
    """The library's functions through ctypes, no wrapper: pointers as
    c_void_p, prebuilt argument objects."""

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        vp, i64, u64, sz = ctypes.c_void_p, ctypes.c_int64, ctypes.c_uint64, ctypes.c_size_t

        def fn(name, *argtypes):
            f = lib[name]
            f.restype, f.argtypes = vp, list(argtypes)
            return f

        self.create = fn("kvcm_kv_cache_create", u64, vp, vp)
        self.resume = fn("kvcm_kv_cache_resume", u64, u64)
        self.resize = fn("kvcm_kv_cache_resize", u64, i64, i64)
        self.commit = fn("kvcm_kv_cache_commit", u64, vp, sz, ctypes.c_bool)
        self.committed = fn("kvcm_kv_cache_get_num_committed_tokens", u64, vp)
        self.close = fn("kvcm_kv_cache_close", u64)


_BUILD = Path(tempfile.mkdtemp(prefix="kvcm-bench-"))


def _compile(source: str, out: Path, *flags: str) -> bool:
    lib = Path(str(kvcm.library_path())).resolve()
    include = HERE.parent.parent.parent / "include"
    cc = os.environ.get("CC", "cc")
    cmd = [cc, "-O2", "-shared", "-fPIC", f"-I{include}", *flags, str(HERE / source), str(lib),
           f"-Wl,-rpath,{lib.parent}", "-o", str(out)]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        print(f"({' '.join(cmd)} failed: {getattr(e, 'stderr', e)})")
        return False
    return True


def extension():
    """cext.c compiled as a CPython extension, or None."""
    out = _BUILD / ("kvcm_bench_ext" + sysconfig.get_config_var("EXT_SUFFIX"))
    if not _compile("cext.c", out, f"-I{sysconfig.get_paths()['include']}"):
        return None
    spec = importlib.util.spec_from_file_location("kvcm_bench_ext", out)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def ext_cycle(ext, m: KVCacheManager, stream, prompts, decode) -> float:
    """The cycle with the decode step's calls (and the prompt's commit)
    through the compiled prototype; create, resume and close through the
    binding (three calls a request)."""
    resize, commit, committed = ext.resize, ext.commit, ext.committed
    t0 = time.process_time()
    for p in prompts:
        c = m.create_kv_cache(input_tokens=p)
        c.resume(stream)
        h = c._native()
        n = len(p)
        resize(h, n, n)
        commit(h, p[committed(h):], False)
        for k in range(DECODE_STEPS):
            resize(h, n + k + 1, n + k + 1)
            commit(h, decode, False)
        c.close()
    return (time.process_time() - t0) / len(prompts)


def c_reference() -> ctypes.CDLL | None:
    """cycle.c compiled against the library in use, or None (no compiler)."""
    out = _BUILD / "cycle.so"
    if not _compile("cycle.c", out):
        return None
    c = ctypes.CDLL(str(out))
    c.kvcm_bench_cycle.restype = ctypes.c_double
    c.kvcm_bench_cycle.argtypes = [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t,
                                   ctypes.c_size_t, ctypes.c_int]
    c.kvcm_bench_resize_calls.restype = ctypes.c_double
    c.kvcm_bench_resize_calls.argtypes = [ctypes.c_uint64, ctypes.c_int64, ctypes.c_int]
    c.kvcm_bench_getter_calls.restype = ctypes.c_double
    c.kvcm_bench_getter_calls.argtypes = [ctypes.c_uint64, ctypes.c_int]
    return c


def c_cycle(cref: ctypes.CDLL, mgr: int, stream: int, prompts) -> float:
    flat = array.array("i", [t for p in prompts for t in p])
    t = cref.kvcm_bench_cycle(mgr, stream, flat.buffer_info()[0], len(prompts[0]), len(prompts), DECODE_STEPS)
    if t < 0:
        raise RuntimeError("the C cycle failed")
    return t


def raw_cycle(raw: Raw, mgr: int, stream: int, prompts, decode_addr: int) -> float:
    # Argument objects built outside the timed loop, as a hand-tuned caller would.
    prepared = []
    for p in prompts:
        a = array.array("i", p)
        opts = ffi.kvcm_kv_cache_options()
        opts.struct_size = ctypes.sizeof(opts)
        opts.abi_version = ffi.KVCM_ABI_VERSION
        opts.input_tokens = ctypes.cast(a.buffer_info()[0], ctypes.POINTER(ffi.kvcm_token))
        opts.num_input_tokens = len(a)
        prepared.append((a, a.buffer_info()[0], len(a), ctypes.byref(opts), opts))
    out = ctypes.c_uint64()
    got = ctypes.c_int64()
    out_ref, got_ref = ctypes.byref(out), ctypes.byref(got)
    create, resume, resize, commit, committed, close = (
        raw.create, raw.resume, raw.resize, raw.commit, raw.committed, raw.close)
    t0 = time.process_time()
    for _a, addr, n, opts_ref, _opts in prepared:
        if create(mgr, opts_ref, out_ref):
            raise RuntimeError("create failed")
        c = out.value
        if resume(c, stream) or resize(c, n, n) or committed(c, got_ref):
            raise RuntimeError("resume/resize failed")
        done = got.value
        if commit(c, addr + 4 * done, n - done, False):
            raise RuntimeError("commit failed")
        for k in range(DECODE_STEPS):
            if resize(c, n + k + 1, n + k + 1) or commit(c, decode_addr, 1, False):
                raise RuntimeError("decode step failed")
        if close(c):
            raise RuntimeError("close failed")
    return (time.process_time() - t0) / len(prompts)


def per_call(rounds: int, cref: ctypes.CDLL | None, ext) -> list[tuple[str, float, float, float | None, float | None]]:
    """(call, binding ns, raw ctypes ns, C ns or None, compiled prototype ns
    or None) for scalar calls on an ACTIVE cache, the best of rounds."""
    raw = Raw(str(kvcm.library_path()))
    m = KVCacheManager(config(1024), device="emu")
    s = m.create_stream()
    c = m.create_kv_cache(input_tokens=list(range(64)))
    c.resume(s)
    c.resize(64, 64)
    h, out = c._native(), ctypes.c_int64()
    ref = ctypes.byref(out)
    n = 2000
    rows = []

    def best(f) -> float:
        times = []
        for _ in range(20 * rounds):
            t0 = time.process_time()
            f()
            times.append((time.process_time() - t0) / n * 1e9)
        return min(times)  # the least disturbed round: these are floors

    def b_resize():
        for _ in range(n):
            c.resize(64, 64)

    def r_resize():
        f = raw.resize
        for _ in range(n):
            f(h, 64, 64)

    def b_get():
        for _ in range(n):
            c.num_committed_tokens

    def r_get():
        f = raw.committed
        for _ in range(n):
            f(h, ref)

    def b_commit0():
        for _ in range(n):
            c.commit(())

    def r_commit0():
        f = raw.commit
        for _ in range(n):
            f(h, None, 0, False)

    def e_resize():
        f = ext.resize
        for _ in range(n):
            f(h, 64, 64)

    def e_get():
        f = ext.committed
        for _ in range(n):
            f(h)

    def e_commit0():
        f, none = ext.commit, []
        for _ in range(n):
            f(h, none, False)

    c_resize = c_get = None
    if cref is not None:
        c_resize = min(cref.kvcm_bench_resize_calls(h, 64, n) for _ in range(20 * rounds)) * 1e9
        c_get = min(cref.kvcm_bench_getter_calls(h, n) for _ in range(20 * rounds)) * 1e9
    for name, b, r, cn, e in (("resize(capacity, history)", b_resize, r_resize, c_resize, e_resize),
                              ("num_committed_tokens", b_get, r_get, c_get, e_get),
                              ("commit(no tokens)", b_commit0, r_commit0, None, e_commit0)):
        rows.append((name, best(b), best(r), cn, best(e) if ext is not None else None))
    c.close()
    m.close()
    return rows


def token_conversion(rounds: int) -> tuple[float, float, float]:
    """ns per token, best of rounds: (c_int32*n)(*list), array('i', list),
    and the binding's list conversion (kvcm._convert.tokens)."""
    from kvcm import _convert

    toks = list(range(32768))
    n = 5

    def med(f) -> float:
        res = []
        for _ in range(4 * rounds):
            t0 = time.process_time()
            for _ in range(n):
                f()
            res.append((time.process_time() - t0) / n / len(toks) * 1e9)
        return min(res)

    old = med(lambda: (ctypes.c_int32 * len(toks))(*toks))
    arr = med(lambda: array.array("i", toks))
    new = med(lambda: _convert.tokens(toks))
    return old, arr, new


def go_cycle(cmd: str) -> dict[int, float]:
    """µs per request by prompt from the Go benchmark command, if it exists."""
    try:
        res = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    out: dict[int, float] = {}
    for line in res.stdout.splitlines():
        f = line.split()
        if len(f) >= 2 and f[0].isdigit():
            try:
                out[int(f[0])] = float(f[1])
            except ValueError:
                pass
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds")
    ap.add_argument("--stat", choices=("min", "median"), default="min",
                    help="per-request figure over the rounds: the least disturbed round (default: on a shared "
                         "machine the minimum is the stable estimate) or the median")
    ap.add_argument("--quick", action="store_true", help="fewer requests per round")
    ap.add_argument("--go", default="", help="command printing the Go cycle's '<prompt> <us>' lines")
    args = ap.parse_args()

    raw = Raw(str(kvcm.library_path()))
    cref = c_reference()
    ext = extension()
    decode = [7]
    decode_arr = array.array("i", decode)
    decode_addr = decode_arr.buffer_info()[0]
    print(f"kvcm {kvcm.version()}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f}; CPU µs per request, {args.stat} of {args.rounds} interleaved rounds")
    kinds = (["binding", "array", "ctypes"] + (["compiled"] if ext is not None else [])
             + (["C"] if cref is not None else []))
    ref_kind = "C" if cref is not None else "ctypes"
    print(f"{'prompt':>7} " + " ".join(f"{k:>9}" for k in kinds) + "   "
          + " ".join(f"{k + '/' + ref_kind:>13}" for k in kinds if k != ref_kind))
    results = {}
    for prompt in PROMPTS:
        nreq = {1024: 32, 8192: 8, 32768: 4}[prompt]
        if args.quick:
            nreq = max(2, nreq // 4)
        lists = requests(prompt, nreq)
        arrays = [array.array("i", p) for p in lists]
        times: dict[str, list[float]] = {k: [] for k in kinds}
        for _ in range(args.rounds):
            for kind in kinds:
                with KVCacheManager(config(prompt), device="emu") as m:
                    s = m.create_stream()
                    if kind == "C":
                        t = c_cycle(cref, m._native(), s.handle, lists)
                    elif kind == "compiled":
                        t = ext_cycle(ext, m, s, lists, decode)
                    elif kind == "ctypes":
                        t = raw_cycle(raw, m._native(), s.handle, lists, decode_addr)
                    else:
                        t = binding_cycle(m, s, lists if kind == "binding" else arrays, decode)
                    times[kind].append(t * 1e6)
        stat = min if args.stat == "min" else statistics.median
        med = {k: stat(v) for k, v in times.items()}
        results[prompt] = med
        print(f"{prompt:>7} " + " ".join(f"{med[k]:>9.1f}" for k in kinds) + "   "
              + " ".join(f"{med[k] / med[ref_kind]:>12.2f}x" for k in kinds if k != ref_kind))

    print("\nscalar calls, ns per call, best of rounds")
    for name, b, r, cn, e in per_call(args.rounds, cref, ext):
        over_c = f", {b - cn:>5.0f} over the C call" if cn is not None else ""
        c_txt = f"  C {cn:>6.0f}" if cn is not None else ""
        e_txt = f"  compiled {e:>6.0f}" if e is not None else ""
        print(f"  {name:<26} binding {b:>6.0f}  ctypes {r:>6.0f}{e_txt}{c_txt}  binding: {b - r:>5.0f} over ctypes"
              + over_c)
    old, arr, new = token_conversion(args.rounds)
    print(f"\ntoken list -> int32 array, ns per token: (c_int32*n)(*list) {old:.1f}, "
          f"array('i', list) {arr:.1f}, binding {new:.1f} ({old / new:.1f}x faster than (c_int32*n)(*list))")

    if args.go:
        go = go_cycle(args.go)
        if go:
            print("\nagainst the Go cycle (same run)")
            for prompt, med in results.items():
                if prompt in go:
                    print(f"  {prompt:>7}: Go {go[prompt]:.1f} µs, binding {med['binding'] / go[prompt]:.2f}x, "
                          f"array('i') {med['array'] / go[prompt]:.2f}x")
        else:
            print(f"\n(no Go figures from {args.go!r})")


if __name__ == "__main__":
    main()
