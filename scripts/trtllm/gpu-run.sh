#!/usr/bin/env bash
# The KVCacheManagerV2 drop-in checks on CUDA, for the GPU machine (no Go,
# no network): the program written from KVCacheManagerV2's public API
# (bindings/python/tests/test_kvcm2_program.py, required to run on CUDA),
# then TensorRT-LLM's own test file through scripts/trtllm/run-tests.sh
# (docs/trtllm.md, "TensorRT-LLM's tests"), both against a prebuilt
# libkvcm.so.
#
# usage: scripts/trtllm/gpu-run.sh [TESTS_DIR] [WHEELS_DIR] [pytest arguments...]
#
#   TESTS_DIR   a copy of TensorRT-LLM's tests/unittest/kv_cache_manager_v2_tests
#               with test_kv_cache_manager_v2.py and fake_engine.py (its two
#               page-index lines patched as docs/trtllm.md says); default
#               build/trtllm-tests; "-" skips the TensorRT-LLM run
#   WHEELS_DIR  wheels pip installs from without an index when pytest or
#               parameterized is missing (pytest, pluggy, iniconfig,
#               packaging, pygments, parameterized); default build/wheels
#   pytest arguments go to run-tests.sh; without any, the selection of
#   docs/trtllm.md's run table (every test but test_naive_* and
#   test_cache_reuse_*) less test_inflight_batching_*, which takes as long
#   as the rest together on the emulated device: run it on its own with
#   -k test_inflight_batching (the device tool's limit is 10 minutes a
#   command).
#
# Environment: KVCM_LIBRARY (default build/gpu/lib/libkvcm.so, as
# scripts/gpu-check.sh builds it). When OUT is set (the device tool's
# output folder) the TensorRT-LLM run's JUnit file and both logs go there.
# Exit status: non-zero when the program failed or a run could not start
# (failed TensorRT-LLM tests are the report's rows, not an error).
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
tests=${1:-build/trtllm-tests}
wheels=${2:-build/wheels}
shift $(($# < 2 ? $# : 2))
export KVCM_LIBRARY=${KVCM_LIBRARY:-$root/build/gpu/lib/libkvcm.so}
[ -f "$KVCM_LIBRARY" ] || { echo "gpu-run.sh: no $KVCM_LIBRARY (scripts/gpu-check.sh build)" >&2; exit 2; }
logs=${OUT:-$(mktemp -d)}
mkdir -p "$logs"

if ! python3 -c 'import pytest, parameterized' 2>/dev/null; then
	[ -d "$wheels" ] || { echo "gpu-run.sh: pytest or parameterized missing and no $wheels" >&2; exit 2; }
	python3 -m pip install -q --no-index --find-links "$wheels" pytest parameterized || exit 2
fi
command -v nvidia-smi >/dev/null && nvidia-smi -L

rc=0
echo "== KVCacheManagerV2 program (--device cuda)"
PYTHONPATH="$root/bindings/python" python3 bindings/python/tests/test_kvcm2_program.py --device cuda \
	2>&1 | tee "$logs/kvcm2-program.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1

if [ "$tests" != - ]; then
	echo "== TensorRT-LLM's test_kv_cache_manager_v2.py on CUDA"
	PYTHONPATH="$root/bindings/python:$root/bindings/python/tests" python3 -c 'import kvcm, test_kvcm2_program as p
m = kvcm.KVCacheManager(p.make_config()); print("device of the run:", m.device_kind.name); m.shutdown()'
	[ $# -gt 0 ] || set -- -k "not test_naive and not test_cache_reuse_0 and not test_cache_reuse_1 and not test_cache_reuse_2 and not test_inflight_batching"
	KVCM_TRTLLM_JUNIT="$logs/trtllm-junit.xml" scripts/trtllm/run-tests.sh "$tests" "$@" \
		2>&1 | tee "$logs/trtllm-tests.log" | tail -40
	[ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
echo "logs: $logs"
exit $rc
