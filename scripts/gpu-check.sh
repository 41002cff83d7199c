#!/usr/bin/env bash
# GPU check of kvcm's CUDA backend, GPU codecs and migration benchmark.
#
#   scripts/gpu-check.sh build [DIR]   on a machine with Go and no GPU: build
#                                      the test binaries (CGO_ENABLED=1) and
#                                      the benchmark into DIR (build/gpu)
#   scripts/gpu-check.sh run [DIR]     on the GPU machine (no Go needed): run
#                                      everything built in DIR
#   scripts/gpu-check.sh [DIR]         both, on a machine with Go and a GPU
#
# The run part: regenerates the PTX with this machine's nvcc into
# $LOGS/ptx and compares it with kernels/*.ptx; runs every test of the cuda
# backend (also under -race), of the backend selection, of the GPU codecs and
# of the benchmark package on the GPU; runs the codec tests under
# compute-sanitizer memcheck; runs the benchmark; and prints a short summary
# and the benchmark table last. Logs go to GPU_CHECK_LOGS (default DIR/logs);
# when OUT is set (the device tool's output folder) they are also packed into
# $OUT/gpu-check-logs.tar.gz. Exit status is non-zero when any step
# failed. Environment: BENCH_ARGS (default: the full 1 GiB benchmark),
# STEP_TIMEOUT (seconds per test step, default 150), BENCH_TIMEOUT (seconds,
# default 360).
set -uo pipefail

cd "$(dirname "$0")/.."
root=$(pwd)
mode=all
case ${1:-} in
build | run)
	mode=$1
	shift
	;;
esac
dir=${1:-build/gpu}
case $dir in
/*) ;;
*) dir=$root/$dir ;;
esac

# Test binaries and the directory each must run in (tests read files
# relative to their package).
pkgs=(
	"cuda:core/device/cuda"
	"backend:core/device/backend"
	"gpucodec:core/codec/gpucodec"
	"migrate:core/bench/migrate"
	"kernels:kernels"
)

build() {
	mkdir -p "$dir"
	export CGO_ENABLED=1
	set -e
	for p in "${pkgs[@]}"; do
		go test -c -ldflags=-s -o "$dir/${p%%:*}.test" "./${p#*:}"
	done
	go test -c -race -ldflags=-s -o "$dir/cuda-race.test" ./core/device/cuda
	go build -ldflags=-s -o "$dir/kvcm-bench-migrate" ./core/bench/cmd/kvcm-bench-migrate
	set +e
	echo "built into $dir:"
	ls -l "$dir"
}

run() {
	local logs=${GPU_CHECK_LOGS:-$dir/logs}
	local t=${STEP_TIMEOUT:-150}
	mkdir -p "$logs"
	local summary=()
	local failed=0
	step() { # name, dir, command...
		local name=$1 wd=$2 t=$t
		shift 2
		if [[ $name == bench ]]; then
			t=${BENCH_TIMEOUT:-360}
		fi
		local start=$SECONDS
		(cd "$root/$wd" && timeout "$t" "$@") >"$logs/$name.log" 2>&1
		local rc=$?
		local verdict=ok
		if ((rc != 0)); then
			verdict="FAILED (exit $rc)"
			failed=1
		fi
		summary+=("$(printf '%-22s %-16s %4ds  %s' "$name" "$verdict" $((SECONDS - start)) "$(grep -E '^(ok|PASS|FAIL|--- FAIL|=+ ERROR SUMMARY)' "$logs/$name.log" | tail -1)")")
		if ((rc != 0)); then
			echo "---- $name failed; last lines of $logs/$name.log:"
			tail -40 "$logs/$name.log"
		fi
	}

	export PATH=$PATH:/usr/local/cuda/bin
	echo "== machine"
	nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv 2>&1 | tee "$logs/machine.txt"
	nvcc --version 2>&1 | tail -2 | tee -a "$logs/machine.txt"

	echo "== PTX from this machine's nvcc"
	if command -v nvcc >/dev/null; then
		mkdir -p "$logs/ptx"
		if NVCC=nvcc bash kernels/build_ptx.sh -o "$logs/ptx" >"$logs/ptx.log" 2>&1; then
			for f in kernels/*.ptx; do
				if cmp -s <(tail -n +3 "$f") <(tail -n +3 "$logs/ptx/$(basename "$f")"); then
					summary+=("$(printf '%-22s %-16s' "ptx $(basename "$f")" "same as committed")")
				else
					summary+=("$(printf '%-22s %-16s' "ptx $(basename "$f")" "DIFFERS: see $logs/ptx")")
				fi
			done
		else
			summary+=("$(printf '%-22s %-16s' ptx "nvcc FAILED")")
			failed=1
			cat "$logs/ptx.log"
		fi
	fi

	echo "== tests"
	for p in "${pkgs[@]}"; do
		step "test-${p%%:*}" "${p#*:}" "$dir/${p%%:*}.test" -test.count=1 -test.v -test.timeout=$((t - 10))s
	done
	step test-cuda-race core/device/cuda "$dir/cuda-race.test" -test.count=1 -test.v -test.timeout=$((t - 10))s

	echo "== compute-sanitizer memcheck over the codec tests"
	if command -v compute-sanitizer >/dev/null; then
		step memcheck-gpucodec core/codec/gpucodec compute-sanitizer --tool memcheck --error-exitcode 99 \
			"$dir/gpucodec.test" -test.count=1 -test.v -test.timeout=$((t - 10))s
		step memcheck-cuda core/device/cuda compute-sanitizer --tool memcheck --error-exitcode 99 \
			"$dir/cuda.test" -test.count=1 -test.run 'Copy|Batch|Reserve|Memset|HostFunc' -test.timeout=$((t - 10))s
	else
		summary+=("memcheck               compute-sanitizer not found")
		failed=1
	fi

	echo "== benchmark"
	# shellcheck disable=SC2086
	step bench . "$dir/kvcm-bench-migrate" ${BENCH_ARGS:-} -json "$logs/bench.json"

	printf '%s\n' "${summary[@]}" >"$logs/summary.txt"
	if [[ -n ${OUT:-} ]]; then
		tar czf "$OUT/gpu-check-logs.tar.gz" -C "$logs" .
	fi
	echo
	echo "== summary (logs in $logs)"
	cat "$logs/summary.txt"
	echo
	sed -n '/^kvcm bench migrate:/,$p' "$logs/bench.log"
	return $failed
}

case $mode in
build) build ;;
run) run ;;
all) build && run ;;
esac
