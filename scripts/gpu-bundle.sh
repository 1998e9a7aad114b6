#!/usr/bin/env bash
# Prepares .gpucheck/ for scripts/gpu-check.sh on a machine without Go or
# ../shared/data (the lent device machine):
#   cuda.test   the test binary of runtime/cuda (CGO_ENABLED=0,
#               linux/amd64; purego links it dynamically against the
#               system's libc and libdl, present on any glibc machine);
#   sources.sha256  a hash of the Go and CUDA sources it was built from,
#               which gpu-check.sh compares with its tree (stale bundle);
#   data/       the shared models the parity tests read (stories260K and
#               its MoE variant, about 5 MB) and tinystories-valid/calib.txt
#               (0.4 MB, TestGPUMoEQuant's calibration text);
#   nvrtc/      gzip'd NVRTC 11.8 (libnvrtc.so.11.2 and
#               libnvrtc-builtins.so.11.8, about 23 MB) from $NVRTC_DIR
#               (default /usr/lib/x86_64-linux-gnu, Debian's libnvrtc11.2),
#               which gpu-check.sh uses when the GPU machine has no NVRTC
#               of its own; NVRTC_DIR=none leaves them out.
# .gpucheck/ is git-ignored through .git/info/exclude (added when
# missing). The device tool carries at most 64 MiB of working tree in
# all, so the bundle fails above GPU_BUNDLE_MAX_MB (default 56).
set -euo pipefail
cd "$(dirname "$0")/.."
data=${LMPACK_SHARED_DATA:-../shared/data}
nvrtc_dir=${NVRTC_DIR:-/usr/lib/x86_64-linux-gnu}
# The device machine gets tracked and untracked-but-not-ignored files
# only; an ignored source here would make the hash below differ there.
if ign=$(git ls-files -oi --exclude-standard -- '*.go' '*.cu' '*.cuh' 2>/dev/null) && [ -n "$ign" ]; then
	echo "gpu-bundle: git-ignored sources would not reach the GPU machine: $ign" >&2
	exit 1
fi
rm -rf .gpucheck
mkdir -p .gpucheck/data
CGO_ENABLED=0 GOOS=linux GOARCH=amd64 ${GO:-go} test -c -o .gpucheck/cuda.test ./runtime/cuda
# The same hash as gpu-check.sh's src_hash.
find . \( -path ./.git -o -path ./.gpucheck \) -prune -o -type f \( -name '*.go' -o -name '*.cu' -o -name '*.cuh' -o -name go.mod -o -name go.sum \) -print |
	LC_ALL=C sort | xargs sha256sum | sha256sum | cut -d' ' -f1 >.gpucheck/sources.sha256
cp -r "$data/stories260K-hf" "$data/stories260K-moe-hf" .gpucheck/data/
# TestGPUMoEQuant calibrates and quantizes the MoE model on the spot.
mkdir -p .gpucheck/data/tinystories-valid
cp "$data/tinystories-valid/calib.txt" .gpucheck/data/tinystories-valid/
if [ "$nvrtc_dir" != none ]; then
	mkdir -p .gpucheck/nvrtc
	for lib in libnvrtc.so.11.2 libnvrtc-builtins.so.11.8; do
		if [ ! -e "$nvrtc_dir/$lib" ]; then
			echo "gpu-bundle: $nvrtc_dir/$lib is missing (install Debian's libnvrtc11.2 and libnvrtc-builtins11.8, set NVRTC_DIR to a folder holding both, or NVRTC_DIR=none)" >&2
			exit 1
		fi
		gzip -9c <"$nvrtc_dir/$lib" >".gpucheck/nvrtc/$lib.gz"
	done
fi
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpucheck/' "$exclude" 2>/dev/null || echo '/.gpucheck/' >>"$exclude"
du -sh .gpucheck/*
du -sh .gpucheck
kb=$(du -sk .gpucheck | cut -f1)
max=${GPU_BUNDLE_MAX_MB:-56}
if [ "$kb" -gt $((max * 1024)) ]; then
	echo "gpu-bundle: .gpucheck is $((kb / 1024)) MiB, over $max MiB (the device tool carries 64 MiB with the working tree)" >&2
	exit 1
fi
