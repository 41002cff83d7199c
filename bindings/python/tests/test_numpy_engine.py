"""The example engine's CPU mode (bindings/python/examples/torch_engine,
--backend numpy): the same decoder in numpy on the emulated device, no torch.
With a shared prefix reused from the GPU tier, from host and from disk, with
the default and the auto codec, the logits and greedy tokens equal bit for
bit those computed without cache; the gather and FP8 codecs are refused on
the emulated device."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import HERE

CHECK = HERE.parent / "examples" / "torch_engine" / "check.py"


def test_reuse_from_every_tier_is_bitwise_exact_in_numpy():
    pytest.importorskip("numpy")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(CHECK), "--backend", "numpy", "--what", "exact",
                        "--codecs", "default,auto,gather,fp8"], env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "FAIL" not in r.stdout, out
    for codec in ("default", "auto"):
        for tier in ("gpu", "host", "disk"):
            assert f"ok   [{codec}] reuse from {tier}: first-token logits bitwise equal" in r.stdout, out
            assert f"ok   [{codec}] reuse from {tier}: the reused blocks were on {tier}" in r.stdout, out
    for codec in ("gather", "fp8"):
        assert f"ok   [{codec}] refused on the emulated device" in r.stdout, out
