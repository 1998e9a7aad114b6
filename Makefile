# lmpack build, test, benchmark and lint targets.
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# Fuzz budgets are execution counts (Nx), not durations: go1.26's fuzz
# coordinator can fail a target with "context deadline exceeded" when a
# -fuzztime duration expires under load (golang/go#75804, fixed in 1.27).
# Each count is a few seconds of fuzzing on a quiet 2-core machine. FUZZTIME
# overrides them all (e.g. FUZZTIME=60s for a longer run).
FUZZ_SAFETENSORS_HEADER ?= 15000x
FUZZ_ARCH_PARSE ?= 80000x
FUZZ_TOKENIZER_PARSE ?= 30000x
FUZZ_TOKENIZER_ENCODE ?= 5000x
FUZZ_TOKENIZER_STREAM ?= 3000x
FUZZ_TOKENIZER_WORDS ?= 12000x
FUZZ_PACK_HEADER ?= 20000x
FUZZ_PACK_MANIFEST ?= 25000x
FUZZ_RECIPE ?= 15000x
FUZZ_GGUF_READ ?= 80000x
FUZZ_OSCAR_READFILE ?= 1000x
FUZZ_GGUF_DEQUANTIZE ?= 100000x

.PHONY: build test bench bench-compare lint cross fuzz ci gpu-check kernels load

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o bin/lmpack ./cmd/lmpack

# Unit, integration and acceptance tests (reads ../shared/data).
test: build
	$(GO) test -count=1 -timeout 40m ./...

# The load acceptance of lmpack serve (loopback only; stops by itself): 64
# streaming clients for 60 s on stories260K and on tiny1m, a quarter of the
# requests disconnecting mid-stream; logs errors, p50/p99 time to first
# token and inter-token latency, aggregate tokens/s and the KV metrics.
load:
	LMPACK_LOAD=1 $(GO) test -count=1 -timeout 20m -v -run '^TestServeLoad$$' ./cmd/lmpack/

# Benchmarks: decode/prefill tokens/s, matmul GFLOP/s, tokenizer MB/s.
bench:
	$(GO) test -run '^$$' -bench . -benchtime 2s ./runtime/... ./formats/...

# Decode GB/s per weight format against the copy bandwidth, on a 414M
# synthetic Llama larger than the last-level cache in every format
# (runtime BenchmarkDecodeBandwidthBig; minutes, up to 2.3 GB; not part of
# `make test` or `make bench`, which skip it without LMPACK_BIG_BENCH).
bench-bandwidth:
	LMPACK_BIG_BENCH=1 $(GO) test -run '^$$' -bench 'DecodeBandwidthBig' -benchtime 2s -timeout 60m ./runtime/

# lmpack against llama.cpp (node-llama-cpp 3.21.1 in test/llamacpp) on the
# same weights, interleaved A/B (internal/benchcmp); not part of `make test`.
REPS ?= 5
bench-compare:
	@if [ ! -f test/llamacpp/node_modules/node-llama-cpp/package.json ] || [ ! -f test/llamacpp/node_modules/@node-llama-cpp/linux-x64/package.json ]; then \
		echo "bench-compare needs llama.cpp: run \`npm ci\` in test/llamacpp (installs node-llama-cpp 3.21.1 and its prebuilt CPU binary)"; exit 1; fi
	$(GO) run ./internal/benchcmp/cmd/benchcompare -reps $(REPS)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# Builds and vets (tests included) for the other supported systems: the
# CPU backend everywhere, mmap and file locks per OS (internal/fsx), the
# portable Go kernels off amd64, the CUDA backend reporting "unsupported
# on this OS" off Linux.
CROSS ?= darwin/arm64 darwin/amd64 windows/amd64 linux/arm64
cross:
	@set -e; for p in $(CROSS); do \
		echo "GOOS=$${p%/*} GOARCH=$${p#*/}: go build ./... && go vet ./..."; \
		GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) build ./...; \
		GOOS=$${p%/*} GOARCH=$${p#*/} $(GO) vet ./...; \
	done

# Brief runs of every fuzz target (CI runs this too).
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzHeader$$' -fuzztime $(or $(FUZZTIME),$(FUZZ_SAFETENSORS_HEADER)) ./formats/safetensors/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(or $(FUZZTIME),$(FUZZ_ARCH_PARSE)) ./formats/arch/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(or $(FUZZTIME),$(FUZZ_TOKENIZER_PARSE)) ./formats/tokenizer/
	$(GO) test -run '^$$' -fuzz '^FuzzEncode$$' -fuzztime $(or $(FUZZTIME),$(FUZZ_TOKENIZER_ENCODE)) ./formats/tokenizer/
	$(GO) test -run '^$$' -fuzz '^FuzzStreamDecode$$' -fuzztime $(or $(FUZZTIME),$(FUZZ_TOKENIZER_STREAM)) ./formats/tokenizer/
	$(GO) test -run '^$$' -fuzz '^FuzzWordFinder$$' -fuzztime $(or $(FUZZTIME),$(FUZZ_TOKENIZER_WORDS)) ./formats/tokenizer/
	$(GO) test -run '^$$' -fuzz '^FuzzHeader$$' -fuzztime $(or $(FUZZTIME),$(FUZZ_PACK_HEADER)) ./pack/
	$(GO) test -run '^$$' -fuzz '^FuzzManifest$$' -fuzztime $(or $(FUZZTIME),$(FUZZ_PACK_MANIFEST)) ./pack/
	$(GO) test -run '^$$' -fuzz '^FuzzParseRecipe$$' -fuzztime $(or $(FUZZTIME),$(FUZZ_RECIPE)) ./compress/
	$(GO) test -run '^$$' -fuzz '^FuzzRead$$' -fuzztime $(or $(FUZZTIME),$(FUZZ_GGUF_READ)) ./formats/gguf/
	$(GO) test -run '^$$' -fuzz '^FuzzReadFile$$' -fuzztime $(or $(FUZZTIME),$(FUZZ_OSCAR_READFILE)) ./quantize/oscar/
	$(GO) test -run '^$$' -fuzz '^FuzzDequantize$$' -fuzztime $(or $(FUZZTIME),$(FUZZ_GGUF_DEQUANTIZE)) ./formats/gguf/

# Compile every embedded CUDA kernel through NVRTC for sm_80 and sm_90 and
# print the PTX sizes and register counts (no GPU needed; CI runs this).
kernels:
	$(GO) test -count=1 -v -run '^(TestCompileKernels|TestKernelsNoSpills)$$' ./runtime/cuda/

ci: lint cross test kernels fuzz

# CUDA backend check on a machine with a GPU (parity tests and benchmarks,
# under 5 minutes on an H200): see scripts/gpu-check.sh.
gpu-check:
	scripts/gpu-check.sh
