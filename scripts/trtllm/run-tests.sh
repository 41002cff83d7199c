#!/usr/bin/env bash
# Runs TensorRT-LLM's own tests of tensorrt_llm.runtime.kv_cache_manager_v2
# against kvcm, as a user would: `import tensorrt_llm.runtime.kv_cache_manager_v2`
# resolves to the shim in scripts/trtllm/shim, which is kvcm's package under
# KVCacheManagerV2's module names (docs/trtllm.md, "TensorRT-LLM's tests").
#
# usage: scripts/trtllm/run-tests.sh TESTS_DIR [pytest arguments...]
#
# TESTS_DIR is a copy of TensorRT-LLM's tests/unittest/kv_cache_manager_v2_tests
# (from a TensorRT-LLM checkout; nothing is fetched): at least
# test_kv_cache_manager_v2.py and fake_engine.py. The files are copied to a
# temporary directory; its kernels.py (CUDA kernels through cuda-python) is
# replaced by scripts/trtllm/emu_kernels.py, which writes and checks page
# values through kvcm's device helpers, on the emulated device and on CUDA
# alike; KVCM_TRTLLM_KERNELS=trtllm keeps TensorRT-LLM's own kernels.py.
# Needs pytest and parameterized (pip install pytest parameterized) and
# libkvcm.so (make lib; KVCM_LIBRARY overrides the path). Prints pytest's
# summary, then the results grouped by cause (scripts/trtllm/report.py);
# KVCM_TRTLLM_JUNIT=FILE writes the JUnit XML file there (kept).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
src=${1:?usage: scripts/trtllm/run-tests.sh TESTS_DIR [pytest arguments...]}
shift
[ -f "$src/test_kv_cache_manager_v2.py" ] || { echo "run-tests.sh: $src has no test_kv_cache_manager_v2.py" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$src"/*.py "$work"/
if [ "${KVCM_TRTLLM_KERNELS:-kvcm}" != trtllm ]; then
	cp "$root/scripts/trtllm/emu_kernels.py" "$work/kernels.py"
fi
export KVCM_LIBRARY=${KVCM_LIBRARY:-$root/build/libkvcm.so}
export PYTHONPATH="$root/scripts/trtllm/shim:$root/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
rc=0
junit=${KVCM_TRTLLM_JUNIT:-$work/junit.xml}
(cd "$work" && python3 -m pytest -p no:cacheprovider -q -o addopts= --junitxml="$junit" \
	-W ignore::pytest.PytestUnknownMarkWarning "$@" .) || rc=$?
python3 "$root/scripts/trtllm/report.py" "$junit"
# pytest exits 1 when a test failed: expected here, the report is the result.
[ "$rc" -le 1 ] || exit "$rc"
