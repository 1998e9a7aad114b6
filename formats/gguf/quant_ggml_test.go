//go:build linux

// The comparison against llama.cpp's libggml-base.so loads it with purego
// (dlopen), as the node-llama-cpp prebuilt binary exists for Linux here.

package gguf

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	goruntime "runtime"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/quantize/weights"
)

// libggmlEnv names the libggml-base.so to cross-check against; by default
// the one in the node-llama-cpp install of test/llamacpp (the llama.cpp
// test harness, pinned 3.21.1).
const libggmlEnv = "LMPACK_LIBGGML"

// ggmlRef holds llama.cpp's own reference quantizers and dequantizers from
// libggml-base.so (ggml-quants.h: quantize_row_*_ref, dequantize_row_*).
type ggmlRef struct {
	quant   map[Type]func(x *float32, y *byte, k int64)
	dequant map[Type]func(x *byte, y *float32, k int64)
	// toHalf, toBF16: ggml_fp32_to_fp16_row, ggml_fp32_to_bf16_row_ref.
	toHalf, toBF16 func(x *float32, y *uint16, k int64)
}

func loadGGML(t *testing.T) *ggmlRef {
	t.Helper()
	path := os.Getenv(libggmlEnv)
	if path == "" {
		_, file, _, _ := goruntime.Caller(0)
		path = filepath.Join(filepath.Dir(file), "..", "..", "test", "llamacpp", "node_modules",
			"@node-llama-cpp", "linux-x64", "bins", "linux-x64", "libggml-base.so")
	}
	if goruntime.GOOS != "linux" || goruntime.GOARCH != "amd64" {
		t.Skipf("the ggml cross-check loads node-llama-cpp's linux-x64 libggml-base.so")
	}
	if _, err := os.Stat(path); err != nil {
		msg := "ggml cross-check needs libggml-base.so (run `npm ci` in test/llamacpp, or set " + libggmlEnv + "): " + err.Error()
		if os.Getenv("LMPACK_REQUIRE_LLAMACPP") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		t.Fatalf("dlopen %s: %v", path, err)
	}
	g := &ggmlRef{quant: map[Type]func(*float32, *byte, int64){}, dequant: map[Type]func(*byte, *float32, int64){}}
	names := map[Type]string{TypeQ8_0: "q8_0", TypeQ4_0: "q4_0", TypeQ4_1: "q4_1", TypeQ4_K: "q4_K", TypeQ6_K: "q6_K"}
	for ty, n := range names {
		var q func(*float32, *byte, int64)
		var d func(*byte, *float32, int64)
		purego.RegisterLibFunc(&q, lib, "quantize_row_"+n+"_ref")
		purego.RegisterLibFunc(&d, lib, "dequantize_row_"+n)
		g.quant[ty], g.dequant[ty] = q, d
	}
	purego.RegisterLibFunc(&g.toHalf, lib, "ggml_fp32_to_fp16_row")
	purego.RegisterLibFunc(&g.toBF16, lib, "ggml_fp32_to_bf16_row_ref")
	return g
}

func (g *ggmlRef) quantize(ty Type, x []float32) []byte {
	out := make([]byte, len(x)/ty.BlockSize()*ty.BlockBytes())
	g.quant[ty](unsafe.SliceData(x), unsafe.SliceData(out), int64(len(x)))
	return out
}

func (g *ggmlRef) dequantize(ty Type, b []byte) []float32 {
	out := make([]float32, len(b)/ty.BlockBytes()*ty.BlockSize())
	g.dequant[ty](unsafe.SliceData(b), unsafe.SliceData(out), int64(len(out)))
	return out
}

// ggmlInputs are rows of 1024 that exercise the quantizers: Gaussian with
// outliers, all-positive, heavy-tailed, tiny (fp16-subnormal scales),
// large, and rows with all-zero, constant and single-spike blocks.
func ggmlInputs() map[string][]float32 {
	r := rand.New(rand.NewPCG(21, 22))
	const n = 1024
	in := map[string][]float32{"gaussian": gaussian(11, 64, n)}
	pos := make([]float32, 8*n)
	heavy := make([]float32, 8*n)
	tiny := make([]float32, 8*n)
	large := make([]float32, 8*n)
	for i := range pos {
		pos[i] = float32(r.ExpFloat64())
		heavy[i] = float32(r.NormFloat64() / (0.05 + r.Float64()))
		tiny[i] = float32(r.NormFloat64() * 1e-6)
		large[i] = float32(r.NormFloat64() * 300)
	}
	special := make([]float32, 2*n)
	for i := 256; i < 512; i++ {
		special[i] = -0.375
	}
	special[600] = 4
	for i := 1024; i < 2048; i++ {
		special[i] = float32(i%7) * 0.125
	}
	in["positive"], in["heavy"], in["tiny"], in["large"], in["special"] = pos, heavy, tiny, large, special
	return in
}

// TestAgainstGGML compares with llama.cpp's own code (libggml-base.so of
// node-llama-cpp 3.21.1): Quantize writes exactly the bytes of
// quantize_row_*_ref (what llama-quantize writes without an importance
// matrix) for every type and input, Dequantize of those blocks equals
// dequantize_row_* bit for bit, and the fp16/bf16 conversions equal
// ggml's row converters.
func TestAgainstGGML(t *testing.T) {
	g := loadGGML(t)
	const n = 1024
	for name, x := range ggmlInputs() {
		for _, ty := range []Type{TypeQ8_0, TypeQ4_0, TypeQ4_1, TypeQ4_K, TypeQ6_K} {
			ref := g.quantize(ty, x)
			ours, err := Quantize(ty, x, n)
			if err != nil {
				t.Fatalf("%s %v: %v", name, ty, err)
			}
			bb, same := ty.BlockBytes(), 0
			for b := 0; b < len(ref)/bb; b++ {
				if string(ref[b*bb:(b+1)*bb]) == string(ours[b*bb:(b+1)*bb]) {
					same++
				} else if same == b {
					t.Errorf("%s %v: block %d differs from ggml:\n ours %x\n ggml %x", name, ty, b, ours[b*bb:(b+1)*bb], ref[b*bb:(b+1)*bb])
				}
			}
			yRef := g.dequantize(ty, ref)
			y, err := Dequantize(ty, ref, n)
			if err != nil {
				t.Fatal(err)
			}
			for i := range y {
				if math.Float32bits(y[i]) != math.Float32bits(yRef[i]) {
					t.Fatalf("%s %v: Dequantize of ggml's blocks, element %d = %g, ggml %g", name, ty, i, y[i], yRef[i])
				}
			}
			if name == "gaussian" {
				t.Logf("%v: %d of %d blocks identical to ggml; relative RMSE %.6f", ty, same, len(ref)/bb, relRMSE(x, y))
			}
			if same != len(ref)/bb {
				t.Errorf("%s %v: %d of %d blocks differ from quantize_row_%v_ref", name, ty, len(ref)/bb-same, len(ref)/bb, ty)
			}
		}
	}
	// fp16 and bf16: random bit patterns over the finite float32 range
	// (fp16 overflow and subnormals included) plus every fp16 midpoint.
	r := rand.New(rand.NewPCG(5, 6))
	xs := make([]float32, 0, 1<<17)
	for len(xs) < 1<<16 {
		v := math.Float32frombits(r.Uint32())
		if !math.IsNaN(float64(v)) && !math.IsInf(float64(v), 0) {
			xs = append(xs, v)
		}
	}
	for h := uint16(0); h < 0x7bff; h++ {
		xs = append(xs, float32((float64(safetensors.F16ToFloat32(h))+float64(safetensors.F16ToFloat32(h+1)))/2))
	}
	hs, bs := make([]uint16, len(xs)), make([]uint16, len(xs))
	g.toHalf(unsafe.SliceData(xs), unsafe.SliceData(hs), int64(len(xs)))
	g.toBF16(unsafe.SliceData(xs), unsafe.SliceData(bs), int64(len(xs)))
	for i, v := range xs {
		if safetensors.F16FromFloat32(v) != hs[i] {
			t.Fatalf("safetensors.F16FromFloat32(%g) = %#04x, ggml %#04x", v, safetensors.F16FromFloat32(v), hs[i])
		}
		if safetensors.BF16FromFloat32(v) != bs[i] {
			t.Fatalf("safetensors.BF16FromFloat32(%g) = %#04x, ggml %#04x", v, safetensors.BF16FromFloat32(v), bs[i])
		}
	}
	// The exact builders decode in ggml as lmpack decodes them.
	for _, c := range []struct {
		bits int
		sym  bool
	}{{8, true}, {4, true}, {4, false}, {3, false}} {
		q, err := weights.QuantizeRTN(gaussian(12, 8, 256), 8, 256, weights.Options{Bits: c.bits, GroupSize: 32, Symmetric: c.sym})
		if err != nil {
			t.Fatal(err)
		}
		blocks, conv, err := FromQuantized(q)
		if err != nil {
			t.Fatal(err)
		}
		got := g.dequantize(conv.Type, blocks)
		want := make([]float32, len(got))
		q.Dequantize(want)
		maxErr := 0.0
		for i := range got {
			maxErr = math.Max(maxErr, math.Abs(float64(got[i])-float64(want[i])))
		}
		if maxErr != conv.MaxAbsErr || (conv.Exact && maxErr != 0) {
			t.Errorf("%d-bit sym %v → %v: ggml decodes with max |err| %g, Conversion says %+v", c.bits, c.sym, conv.Type, maxErr, conv)
		}
	}
}
