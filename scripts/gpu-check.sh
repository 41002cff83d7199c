#!/usr/bin/env bash
# GPU check of kvcm: the CUDA backend, the GPU codecs, the core suite on the
# cuda backend, the C ABI with a C++ CUDA codec, the demo and the migration
# benchmark, in one run on the GPU machine.
#
#   scripts/gpu-check.sh build [DIR]   on a machine with Go and no GPU: build
#                                      the test binaries (CGO_ENABLED=1), the
#                                      kvcm binary and libkvcm.so (make lib)
#                                      into DIR (build/gpu), and pack DIR into
#                                      DIR.txz (what travels to the GPU
#                                      machine: the binaries are too large
#                                      unpacked; xz packs them to 2/3 of
#                                      gzip's, room for more in the carry)
#   scripts/gpu-check.sh run [DIR]     on the GPU machine (no Go needed): run
#                                      everything built in DIR (unpacking
#                                      DIR.txz first when DIR is missing)
#   scripts/gpu-check.sh [DIR]         both, on a machine with Go and a GPU
#
# The run part:
#   1. regenerates the PTX with this machine's nvcc into $LOGS/ptx and
#      compares it with kernels/*.ptx;
#   2. runs in parallel, each with its own log and time limit:
#      - every test of the cuda backend (also under -race), the backend
#        selection, the GPU codecs, the benchmark package and the PTX check;
#      - the core suite (also under -race), the fake-engine tests, the C ABI
#        tests (capi/abitest) and the cmd/kvcm tests with KVCM_DEVICE=cuda;
#      - compute-sanitizer memcheck over the codec tests (gpucodec), the cuda
#        copy tests and the core suite's codec tests on cuda;
#      - `kvcm demo --device cuda` with the auto codec, the staged codec and
#        the default codec (a step passes only if it ends with "0 mismatches");
#      - the C++ binding tests (GoogleTest) with KVCM_TEST_DEVICE=cuda;
#      - the C++ CUDA codec test (bindings/cpp/tests/cuda), built here with
#        nvcc against DIR/lib/libkvcm.so (skipped where there is no nvcc);
#   3. runs `kvcm bench migrate` alone (BENCH_ARGS, default a short run),
#      then its duplex mode alone (DUPLEX_ARGS, default a short run);
#   4. prints the benchmark table and then a summary, one line a step, last.
#
# Logs go to GPU_CHECK_LOGS (default DIR/logs); when OUT is set (the device
# tool's output folder) they are also packed into $OUT/gpu-check-logs.tar.gz.
# Exit status is non-zero when any step failed. Environment: BENCH_ARGS
# (default: 256 MiB, 3 runs, chunks 4 KiB to 1 MiB), STEP_TIMEOUT (seconds
# per parallel step, default 240), BENCH_TIMEOUT (seconds, default 180; also
# for the duplex run), DUPLEX_ARGS (default: 256 MiB each way, 3 runs, chunks
# 4 KiB to 1 MiB).
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

# Test binaries and the directory each runs in (tests read files relative to
# their package).
pkgs=(
	"cuda:core/device/cuda"
	"backend:core/device/backend"
	"gpucodec:core/codec/gpucodec"
	"migrate:internal/bench/migrate"
	"kernels:kernels"
	"core:core"
	"fakeengine:internal/testkit/fakeengine"
	"abitest:capi/abitest"
	"cmd:cmd/kvcm"
)
race_pkgs=(
	"cuda-race:core/device/cuda"
	"core-race:core"
)

build() {
	rm -rf "$dir" "$dir.txz"
	mkdir -p "$dir/lib" "$dir/include/kvcm"
	export CGO_ENABLED=1
	set -e
	for p in "${pkgs[@]}"; do
		go test -c -ldflags=-s -o "$dir/${p%%:*}.test" "./${p#*:}"
	done
	for p in "${race_pkgs[@]}"; do
		go test -c -race -ldflags=-s -o "$dir/${p%%:*}.test" "./${p#*:}"
	done
	go build -ldflags=-s -o "$dir/kvcm" ./cmd/kvcm
	make -s lib
	cp build/libkvcm.so "$dir/lib/"
	# The C++ binding tests (GoogleTest, linked statically), built by CMake.
	make -s cpp-build >/dev/null
	cp build/cmake/bindings/cpp/tests/kvcm_cpp_tests "$dir/"
	cp build/include/kvcm/kvcm.h "$dir/include/kvcm/"
	XZ_OPT=-T0 tar cJf "$dir.txz" -C "$(dirname "$dir")" "$(basename "$dir")"
	set +e
	echo "built into $dir, packed into $dir.txz ($(du -h "$dir.txz" | cut -f1)):"
	ls -l "$dir" "$dir/lib"
}

run() {
	if [[ ! -d $dir && -f $dir.txz ]]; then
		tar xJf "$dir.txz" -C "$(dirname "$dir")"
	fi
	local logs=${GPU_CHECK_LOGS:-$dir/logs}
	local t=${STEP_TIMEOUT:-240}
	local tb=${BENCH_TIMEOUT:-180}
	mkdir -p "$logs"
	rm -f "$logs"/*.rc "$logs"/*.time
	local order=() failed=0 extra=()

	# start NAME WORKDIR TIMEOUT COMMAND...: runs the step in the background.
	start() {
		local name=$1 wd=$2 limit=$3
		shift 3
		order+=("$name")
		(
			s=$SECONDS
			cd "$root/$wd" && timeout -k 10 "$limit" "$@" >"$logs/$name.log" 2>&1
			echo $? >"$logs/$name.rc"
			echo $((SECONDS - s)) >"$logs/$name.time"
		) &
	}
	# skip NAME WHY
	skip() {
		order+=("$1")
		echo "$2" >"$logs/$1.log"
		echo skip >"$logs/$1.rc"
		echo 0 >"$logs/$1.time"
	}

	export PATH=$PATH:/usr/local/cuda/bin
	echo "== machine"
	nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv 2>&1 | tee "$logs/machine.txt"
	nvcc --version 2>&1 | tail -2 | tee -a "$logs/machine.txt"
	nproc | sed 's/^/cpus: /' | tee -a "$logs/machine.txt"

	echo "== PTX from this machine's nvcc"
	if command -v nvcc >/dev/null; then
		mkdir -p "$logs/ptx"
		if NVCC=nvcc bash kernels/build_ptx.sh -o "$logs/ptx" >"$logs/ptx.log" 2>&1; then
			for f in kernels/*.ptx; do
				if cmp -s <(tail -n +3 "$f") <(tail -n +3 "$logs/ptx/$(basename "$f")"); then
					extra+=("$(printf '%-22s %-16s' "ptx $(basename "$f")" "same as committed")")
				else
					extra+=("$(printf '%-22s %-16s' "ptx $(basename "$f")" "DIFFERS: see $logs/ptx")")
				fi
			done
		else
			extra+=("$(printf '%-22s %-16s' ptx "nvcc FAILED")")
			failed=1
			cat "$logs/ptx.log"
		fi
	else
		extra+=("$(printf '%-22s %-16s' ptx "skipped: no nvcc")")
	fi

	echo "== tests, memcheck, demo and the C++ CUDA codec, in parallel (up to ${t}s each)"
	local v=(-test.count=1 -test.v -test.timeout=$((t - 15))s)
	for p in cuda backend gpucodec migrate kernels; do
		local wd
		for q in "${pkgs[@]}"; do [[ ${q%%:*} == "$p" ]] && wd=${q#*:}; done
		start "test-$p" "$wd" "$t" "$dir/$p.test" "${v[@]}"
	done
	start test-cuda-race core/device/cuda "$t" "$dir/cuda-race.test" "${v[@]}"
	start core-cuda core "$t" env KVCM_DEVICE=cuda "$dir/core.test" "${v[@]}"
	start core-race-cuda core "$t" env KVCM_DEVICE=cuda "$dir/core-race.test" "${v[@]}"
	start fakeengine-cuda internal/testkit/fakeengine "$t" env KVCM_DEVICE=cuda "$dir/fakeengine.test" "${v[@]}"
	# TestLayoutsMatchTheDescription loads gen/abi with the go command: a
	# source check with nothing of the device in it, and no Go on the GPU
	# machine.
	start abitest-cuda capi/abitest "$t" env KVCM_DEVICE=cuda "$dir/abitest.test" "${v[@]}" -test.skip '^TestLayoutsMatchTheDescription$'
	start cmd-cuda cmd/kvcm "$t" env KVCM_DEVICE=cuda "$dir/cmd.test" "${v[@]}"
	if command -v compute-sanitizer >/dev/null; then
		local cs=(compute-sanitizer --tool memcheck --error-exitcode 99)
		start memcheck-gpucodec core/codec/gpucodec "$t" "${cs[@]}" "$dir/gpucodec.test" "${v[@]}"
		start memcheck-cuda core/device/cuda "$t" "${cs[@]}" "$dir/cuda.test" -test.count=1 -test.run 'Copy|Batch|Reserve|Memset|HostFunc' -test.timeout=$((t - 15))s
		start memcheck-core-cuda core "$t" env KVCM_DEVICE=cuda "${cs[@]}" "$dir/core.test" -test.count=1 -test.run '^Test(AutoCodec|CompressingCodec|AsyncCodec|SyncCodec|ColdTier|StagedCodec|DuplexMigrations)' -test.timeout=$((t - 15))s
	else
		skip memcheck "compute-sanitizer not found"
		failed=1
	fi
	start demo-cuda . "$t" "$dir/kvcm" demo --device cuda --codec auto
	start demo-cuda-default . "$t" "$dir/kvcm" demo --device cuda --codec default
	start demo-cuda-gather . "$t" "$dir/kvcm" demo --device cuda --codec gather
	start cpp-tests-cuda . "$t" env LD_LIBRARY_PATH="$dir/lib" KVCM_TEST_DEVICE=cuda \
		KVCM_CONFORMANCE_DIR="$root/tests/conformance" "$dir/kvcm_cpp_tests"
	if command -v nvcc >/dev/null; then
		start cpp-cuda-codec . "$t" bash -c "set -e; nvcc -std=c++17 -O2 -arch=sm_90 -I bindings/cpp/include -I '$dir/include' \
			-o '$dir/cuda_codec_test' bindings/cpp/tests/cuda/cuda_codec_test.cu -L '$dir/lib' -lkvcm -Xlinker -rpath,'$dir/lib'; \
			'$dir/cuda_codec_test'"
	else
		skip cpp-cuda-codec "no nvcc: the C++ CUDA codec test is not built"
	fi
	wait

	echo "== benchmark (alone)"
	# shellcheck disable=SC2086
	start bench . "$tb" "$dir/kvcm" bench migrate ${BENCH_ARGS:--total 256MiB -runs 3 -chunks 4KiB,16KiB,64KiB,256KiB,1MiB} -json "$logs/bench.json"
	wait
	echo "== benchmark, duplex mode (alone)"
	# shellcheck disable=SC2086
	start bench-duplex . "$tb" "$dir/kvcm" bench migrate -duplex ${DUPLEX_ARGS:--total 256MiB -runs 3 -chunks 4KiB,16KiB,64KiB,256KiB,1MiB} -json "$logs/bench-duplex.json"
	wait

	local summary=("${extra[@]}")
	for name in "${order[@]}"; do
		local rc verdict line
		rc=$(cat "$logs/$name.rc" 2>/dev/null || echo lost)
		line=$(grep -E '^(ok|PASS|FAIL|--- FAIL|=+ ERROR SUMMARY|integrity:|cuda codec test:|\[  PASSED  \]|\[  FAILED  \])' "$logs/$name.log" | tail -1)
		if [[ $rc == skip ]]; then
			verdict="skipped"
			line=$(head -1 "$logs/$name.log")
		elif [[ $rc == 0 ]]; then
			verdict=ok
			if [[ $name == demo-* ]] && ! tail -1 "$logs/$name.log" | grep -qE '^integrity: [1-9][0-9]* pages verified, 0 mismatches$'; then
				verdict="FAILED (no 0 mismatches)"
			fi
		elif [[ $rc == 124 || $rc == 137 ]]; then
			verdict="FAILED (timeout)"
		else
			verdict="FAILED (exit $rc)"
		fi
		if [[ $name == test-* || $name == core* || $name == fakeengine* || $name == abitest* || $name == cmd* ]]; then
			local np ns nf
			np=$(grep -c -- '^--- PASS' "$logs/$name.log")
			ns=$(grep -c -- '^--- SKIP' "$logs/$name.log")
			nf=$(grep -c -- '^--- FAIL' "$logs/$name.log")
			line="$np passed, $nf failed, $ns skipped (top level); $line"
		fi
		if [[ $verdict != ok && $verdict != skipped ]]; then
			failed=1
			echo "---- $name: $verdict; last lines of $logs/$name.log:"
			tail -25 "$logs/$name.log"
		fi
		summary+=("$(printf '%-22s %-24s %4ss  %s' "$name" "$verdict" "$(cat "$logs/$name.time" 2>/dev/null)" "$line")")
	done
	printf '%s\n' "${summary[@]}" >"$logs/summary.txt"
	if [[ -n ${OUT:-} ]]; then
		tar czf "$OUT/gpu-check-logs.tar.gz" -C "$logs" .
	fi
	echo
	sed -n '/^kvcm bench migrate:/,$p' "$logs/bench.log"
	echo
	sed -n '/^kvcm bench migrate -duplex:/,$p' "$logs/bench-duplex.log"
	echo
	echo "== summary (logs in $logs)"
	cat "$logs/summary.txt"
	return $failed
}

case $mode in
build) build ;;
run) run ;;
all) build && run ;;
esac
