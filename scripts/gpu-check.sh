#!/usr/bin/env bash
# GPU check of the CUDA backend (issue 7), about 2–3 minutes on an H200
# (5 at most): every kernel against the CPU code (gpu_kernels_test.go:
# dequant_q, embed, per-head rmsnorm, add_bias, kv_append with attn_split
# and attn_merge, moe_route and moe_combine), synthetic Qwen2, Qwen3,
# Llama-with-biases and Mistral (sliding window) models, stories260K (fp16 and
# oscar2 KV, RTN-quantized weights kept packed: TestGPUStories260KQuant;
# 1-bit and act-order ones: TestGPUStories260KQuantLowBit; every weight
# 8-bit: TestGPUStories260KQuant8), the device KV kinds int8, int4, q8_0,
# q4_0 and fp8 (append and attention against runtime/kvcache:
# TestGPUAttentionKVKinds; a synthetic Llama against the CPU backend with
# each: TestGPUKVKindsModel),
# an oscar2 artifact opened through the engine with --device cuda
# (TestGPUArtifactOscar2), the MoE variant, its wquant-quantized form with
# mixed expert widths kept packed (TestGPUMoEQuant) and a synthetic
# Qwen2-MoE with shared experts (TestGPUQwenMoEShared) against the CPU
# backend, then the benchmarks: device copy bandwidth, the INT2 decode
# attention in GB/s against it, and decode tokens/s with fp16 and oscar2
# KV at 4k/16k/32k context, batch 1 and 16, and with each device KV kind
# at 16k (BenchmarkDecodeKVKinds). Exits 2 at once on a machine
# with no NVIDIA GPU; where one is seen, every test must run on it
# (the script sets LMPACK_REQUIRE_GPU=1: a test that cannot reach the GPU
# fails instead of skipping).
#
# Usage: scripts/gpu-check.sh            (or: make gpu-check)
# On a machine without Go or ../shared (the lent device machine): run
# scripts/gpu-bundle.sh first where Go is, carry .gpucheck/ along, and
# this script uses .gpucheck/cuda.test and .gpucheck/data.
# Environment:
#   GPU_CHECK_BIN       a test binary built beforehand with
#                       `CGO_ENABLED=0 go test -c -o FILE ./runtime/cuda`
#                       (for a machine without Go); default: build it now.
#   LMPACK_SHARED_DATA  the shared data folder (default ../shared/data).
#   LMPACK_NVRTC        the NVRTC library, if not found by the search order.
#                       Unset and the machine without an NVRTC of its own
#                       (see have_nvrtc), the bundle's NVRTC 11.8
#                       (.gpucheck/nvrtc, from scripts/gpu-bundle.sh) is
#                       unpacked and used; GPU_CHECK_NVRTC=bundled uses it
#                       even then.
#   GPU_CHECK_LOG       the log file (default: $OUT/gpu-check.log when $OUT
#                       is set, else /tmp/gpu-check.log).
#   BENCHTIME           go test -benchtime for every benchmark (default:
#                       10x copy bandwidth, 200x INT2 attention, 30x decode,
#                       10x decode per KV kind).
#   GPU_CHECK_FORCE     set: run even where no GPU is seen (to try the
#                       script itself: every GPU test then fails).
#   GPU_CHECK_JOBS      parity test processes run at once (default 4).
#   GPU_CHECK_SECONDS   the whole run's deadline in seconds (default 300);
#                       the parity tests stop early enough to leave
#                       GPU_CHECK_BENCH_SECONDS (default 115) to the
#                       benchmarks, and a test not run in time fails.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
log=${GPU_CHECK_LOG:-${OUT:-/tmp}/gpu-check.log}
: >"$log"
say() { echo "$@" | tee -a "$log"; }
deadline=$((SECONDS + ${GPU_CHECK_SECONDS:-300}))
bench_reserve=${GPU_CHECK_BENCH_SECONDS:-115}
ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)

# No GPU, no check: one line and exit 2 before anything runs.
if [ -z "${GPU_CHECK_FORCE:-}" ] && ! ls /dev/nvidia[0-9]* >/dev/null 2>&1 && ! "$ldconfig" -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
	say "gpu-check: no NVIDIA GPU on this machine (no /dev/nvidia0.., no libcuda.so.1 in the loader cache): nothing to check"
	exit 2
fi

# The bundle's binary must be built from these sources.
src_hash() {
	find . \( -path ./.git -o -path ./.gpucheck \) -prune -o -type f \( -name '*.go' -o -name '*.cu' -o -name '*.cuh' -o -name go.mod -o -name go.sum \) -print |
		LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1
}

bin=${GPU_CHECK_BIN:-}
if [ -z "$bin" ] && ! command -v "${GO:-go}" >/dev/null && [ -x .gpucheck/cuda.test ]; then
	bin=.gpucheck/cuda.test # made by scripts/gpu-bundle.sh
fi
if [ -z "$bin" ]; then
	bin=$(mktemp -d)/cuda.test
	${GO:-go} test -c -o "$bin" ./runtime/cuda
fi
case "$bin" in /*) ;; *) bin="$root/$bin" ;; esac
if [ "$bin" = "$root/.gpucheck/cuda.test" ] && [ -f .gpucheck/sources.sha256 ]; then
	if [ "$(cat .gpucheck/sources.sha256)" != "$(src_hash)" ]; then
		say "gpu-check: FAILED: .gpucheck/cuda.test was built from other sources than this tree (rerun scripts/gpu-bundle.sh)"
		exit 1
	fi
fi
export LMPACK_REQUIRE_GPU=1
export LMPACK_REQUIRE_NVRTC=1 # the NVRTC compile tests fail instead of skipping
if [ -z "${LMPACK_SHARED_DATA:-}" ]; then
	if [ -d "$root/../shared/data" ]; then
		LMPACK_SHARED_DATA=$(cd "$root/../shared/data" && pwd)
	else
		LMPACK_SHARED_DATA=$root/.gpucheck/data # made by scripts/gpu-bundle.sh
	fi
fi
export LMPACK_SHARED_DATA

# have_nvrtc: an NVRTC the backend's search (runtime/cuda NVRTCCandidates)
# would find without LMPACK_NVRTC.
have_nvrtc() {
	local f
	if "$ldconfig" -p 2>/dev/null | grep -Eq 'libnvrtc\.so\.(13|12|11\.2) '; then
		return 0
	fi
	for f in ${CUDA_HOME:+"$CUDA_HOME"/lib64/libnvrtc.so.*} /usr/local/cuda/lib64/libnvrtc.so.* \
		${VIRTUAL_ENV:+"$VIRTUAL_ENV"/lib/python3*/site-packages/nvidia/*/lib/libnvrtc.so.*} \
		"${HOME:-/root}"/.local/lib/python3*/site-packages/nvidia/*/lib/libnvrtc.so.* \
		/usr/local/lib/python3*/*-packages/nvidia/*/lib/libnvrtc.so.* /usr/lib/python3*/*-packages/nvidia/*/lib/libnvrtc.so.* \
		/opt/conda/lib/python3*/site-packages/nvidia/*/lib/libnvrtc.so.* /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib/libnvrtc.so.*; do
		[ -e "$f" ] && return 0
	done
	return 1
}
# The bundled NVRTC 11.8 (scripts/gpu-bundle.sh) is unpacked whenever it is
# there and put on LD_LIBRARY_PATH: the backend's soname search then finds
# the machine's own libnvrtc.so.13 / .12 first and the bundle's .so.11.2
# after them, so the bundle is the fallback when those fail (the backend
# moves on to the next NVRTC when one cannot build an image the driver
# loads). GPU_CHECK_NVRTC=bundled uses the bundle only (LMPACK_NVRTC).
if [ -z "${LMPACK_NVRTC:-}" ] && [ -f .gpucheck/nvrtc/libnvrtc.so.11.2.gz ]; then
	nvdir=$(mktemp -d)
	for f in .gpucheck/nvrtc/*.gz; do
		gzip -dc "$f" >"$nvdir/$(basename "$f" .gz)"
	done
	# NVRTC dlopens libnvrtc-builtins.so.11.8 by name.
	export LD_LIBRARY_PATH=$nvdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
	if [ "${GPU_CHECK_NVRTC:-}" = bundled ]; then
		export LMPACK_NVRTC=$nvdir/libnvrtc.so.11.2
		say "using the bundled NVRTC 11.8 only: $LMPACK_NVRTC"
	elif have_nvrtc; then
		say "this machine's NVRTC first, the bundled NVRTC 11.8 ($nvdir) as the fallback"
	else
		say "using the bundled NVRTC 11.8 ($nvdir): this machine has none"
	fi
elif [ -z "${LMPACK_NVRTC:-}" ] && ! have_nvrtc; then
	say "gpu-check: no NVRTC found on this machine and none bundled (run scripts/gpu-bundle.sh, or set LMPACK_NVRTC)"
fi

if command -v nvidia-smi >/dev/null; then
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee -a "$log" || true
fi

# One process per test and benchmark: a kernel fault poisons the CUDA
# context of its process only. The PTX cache is shared between them.
# Tests that open models through the engine use the backend's default
# cache, os.UserCacheDir()/lmpack/cuda: point it at the same directory.
export XDG_CACHE_HOME=$(mktemp -d)
export LMPACK_CUDA_CACHE=$XDG_CACHE_HOME/lmpack/cuda
mkdir -p "$LMPACK_CUDA_CACHE"
status=0
# The test binary runs in the package directory, as go test does.

say "== parity tests"
# The tests the binary holds must be the ones the sources define (a stale
# or broken binary listing none would otherwise pass with zero tests), and
# every one must pass (a skip is a failure here). The count covers the
# external package cuda_test too (gpu_artifact_test.go), which go test -c
# builds into the same binary.
pattern='^(TestCompileKernels|TestGPU[A-Za-z0-9_]*)$'
want=$(cat runtime/cuda/*_test.go | grep -Ec '^func (TestCompileKernels|TestGPU[A-Za-z0-9_]*)\(') || true
if ! list=$(cd runtime/cuda && "$bin" -test.list "$pattern"); then
	say "gpu-check: $bin -test.list failed"
	exit 1
fi
tests=$(printf '%s\n' "$list" | grep -E "$pattern" || true)
n=$(printf '%s' "$tests" | grep -c . || true)
say "$n parity tests listed, $want defined in runtime/cuda/*_test.go"
if [ "$n" -eq 0 ] || [ "$n" -lt "$want" ]; then
	say "gpu-check: FAILED: the test binary lists $n parity tests, want $want (rebuild it: scripts/gpu-bundle.sh)"
	exit 1
fi
# One process per test, GPU_CHECK_JOBS (default 4) at a time after the
# first, which runs alone and fills the kernel cache the others load from.
outdir=$(mktemp -d)
run_test() {
	local t=$1 left lim
	left=$((deadline - bench_reserve - SECONDS))
	if [ "$left" -lt 5 ]; then
		echo "gpu-check: $t not run: out of time (GPU_CHECK_SECONDS)" >"$outdir/$t.out"
		return 0
	fi
	lim=$((left < 60 ? left : 60))
	# Go's own timeout fires 5 s before the kill, so a hung test prints
	# its goroutine dump.
	timeout -k 5 "$lim" bash -c 'cd runtime/cuda && exec "$0" "$@"' "$bin" -test.run "^$t\$" -test.count=1 -test.v -test.timeout="$((lim > 8 ? lim - 5 : lim))s" >"$outdir/$t.out" 2>&1 || true
	echo "gpu-check: $t ran with a ${lim}s limit" >>"$outdir/$t.out"
}
first=1
for t in $tests; do
	if [ "$first" = 1 ]; then
		run_test "$t"
		first=0
		continue
	fi
	while [ "$(jobs -rp | wc -l)" -ge "${GPU_CHECK_JOBS:-4}" ]; do
		wait -n || true
	done
	run_test "$t" &
done
wait || true
for t in $tests; do
	tee -a "$log" <"$outdir/$t.out"
	if ! grep -q "^--- PASS: $t " "$outdir/$t.out"; then
		say "gpu-check: $t did not pass"
		status=1
	fi
done

say "== benchmarks"
bench=$(mktemp)
for spec in BenchmarkCopyBandwidth:10x BenchmarkAttnINT2:200x BenchmarkDecode:30x BenchmarkDecodeKVKinds:10x; do
	b=${spec%%:*}
	left=$((deadline - SECONDS))
	if [ "$left" -lt 5 ]; then
		say "gpu-check: $b not run: out of time (GPU_CHECK_SECONDS)"
		status=1
		continue
	fi
	timeout -k 5 "$left" bash -c 'cd runtime/cuda && exec "$0" "$@"' "$bin" -test.run '^$' -test.bench "^$b\$" -test.benchtime="${BENCHTIME:-${spec#*:}}" -test.timeout="$((left > 8 ? left - 5 : left))s" 2>&1 | tee -a "$log" | tee -a "$bench" || status=1
done

say "== summary"
# The attention kernel against the copy bandwidth (goal ≥ 80%).
awk '/^BenchmarkAttnINT2\// { for (i = 2; i <= NF; i++) { if ($i == "GB/s") gb = $(i-1); if ($i == "%copy") pc = $(i-1); if ($i == "copyGB/s") cp = $(i-1) }
	printf "INT2 decode attention %s: %s GB/s = %s%% of the %s GB/s copy bandwidth (goal >= 80)\n", $1, gb, pc, cp }' "$bench" | tee -a "$log"
# oscar2 over fp16 decode speed at each context and batch (goal ≥ 3 at 32k).
awk '/^BenchmarkDecode\// {
	split($1, p, "/"); key = p[2] "/" p[3]; kv = p[4]; sub(/-[0-9]+$/, "", kv)
	for (i = 1; i <= NF; i++) if ($i == "tokens/s") v = $(i-1)
	tps[key, kv] = v; keys[key] = 1 }
	END { for (k in keys) if (tps[k, "kv=fp16"] > 0) printf "decode %s: fp16 %.1f tokens/s, oscar2 %.1f tokens/s, speedup %.2fx%s\n", k, tps[k, "kv=fp16"], tps[k, "kv=oscar2"], tps[k, "kv=oscar2"] / tps[k, "kv=fp16"], (k ~ /ctx=32768/ ? " (goal >= 3)" : "") }' "$bench" | sort | tee -a "$log"
# Each device KV kind over fp16 at 16k context (BenchmarkDecodeKVKinds).
awk '/^BenchmarkDecodeKVKinds\// {
	split($1, p, "/"); key = p[2] "/" p[3]; kv = p[4]; sub(/-[0-9]+$/, "", kv); sub(/^kv=/, "", kv)
	for (i = 1; i <= NF; i++) if ($i == "tokens/s") v = $(i-1)
	tps[key, kv] = v; keys[key] = 1; kinds[kv] = 1 }
	END { for (k in keys) for (kv in kinds) if (kv != "fp16" && tps[k, "fp16"] > 0) printf "decode %s: %s %.1f tokens/s = %.2fx fp16 (%.1f)\n", k, kv, tps[k, kv], tps[k, kv] / tps[k, "fp16"], tps[k, "fp16"] }' "$bench" | sort | tee -a "$log"
{ grep -E '^--- (PASS|FAIL|SKIP)' "$log" || true; } | awk '{ n[$2]++ } END { for (k in n) printf "%s %d  ", k, n[k]; print "" }' | tee -a "$log"
if [ "$status" -ne 0 ]; then
	say "gpu-check: FAILED (log: $log)"
	exit 1
fi
say "gpu-check: passed (log: $log)"
