"""The example engine (bindings/python/examples/torch_engine) on CPU torch
over the emulated device: with a shared prefix reused from the GPU tier,
from host and from disk, logits and greedy tokens equal bit for bit those
computed without cache. Needs torch (skipped where it is not installed)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import HERE

CHECK = HERE.parent / "examples" / "torch_engine" / "check.py"


def test_reuse_from_every_tier_is_bitwise_exact_on_cpu():
    # check.py exits non-zero when any exactness check fails.
    pytest.importorskip("torch")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(CHECK), "--device", "cpu", "--what", "exact"], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAIL" not in r.stdout
