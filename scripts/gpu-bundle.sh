#!/usr/bin/env bash
# Prepares .gpucheck/ for scripts/gpu-check.sh on a machine without Go or
# ../shared/data: a static test binary of runtime/cuda (CGO_ENABLED=0,
# linux/amd64) and the shared models the parity tests read (stories260K
# and its MoE variant, about 5 MB). .gpucheck/ is git-ignored through
# .git/info/exclude (added when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
data=${LMPACK_SHARED_DATA:-../shared/data}
rm -rf .gpucheck
mkdir -p .gpucheck/data
CGO_ENABLED=0 GOOS=linux GOARCH=amd64 ${GO:-go} test -c -o .gpucheck/cuda.test ./runtime/cuda
cp -r "$data/stories260K-hf" "$data/stories260K-moe-hf" .gpucheck/data/
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpucheck/' "$exclude" 2>/dev/null || echo '/.gpucheck/' >>"$exclude"
du -sh .gpucheck
