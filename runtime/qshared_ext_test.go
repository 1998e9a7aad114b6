package runtime_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/internal/synthmoe"
	"github.com/lmpack/lmpack/quantize/wquant"
	"github.com/lmpack/lmpack/runtime"
)

// A Qwen2-MoE with shared experts quantized by wquant (GPTQ act-order
// 4-bit g32: shared gate/up/down packed with permutations) runs packed:
// its logits follow the dequantize-at-load model's (checkPackedLogits: the
// int8-activation criterion where 4-bit weights run on int8 activations;
// prefill and decode, 1 and 3 threads), and every quantized weight, the
// shared experts' included, is packed: the packed model's linear weights
// take exactly Σ (4·rows·cols − stored bytes) fewer bytes.
func TestPackedSharedExpertsMatchDequantized(t *testing.T) {
	model := filepath.Join(t.TempDir(), "qwen2moe")
	if _, err := synthmoe.Write(model, 3, shared.Path(t, "stories260K-hf")); err != nil {
		t.Fatal(err)
	}
	calib := filepath.Join(t.TempDir(), "calib.safetensors")
	if _, err := calibrate.Run(context.Background(), calibrate.Options{Model: model, Data: shared.Path(t, "tinystories-valid", "calib.txt"),
		Tokens: 1024, Ctx: 256, Out: calib, Threads: 1, Version: "test"}); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "q")
	rep, err := wquant.Run(context.Background(), wquant.Options{Model: model, Calib: calib, Out: out, Method: wquant.MethodGPTQ,
		Bits: 4, GroupSize: 32, ActOrder: true, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	var saved int64
	nShared := 0
	for _, tr := range rep.Tensors {
		saved += int64(4*tr.Rows*tr.Cols) - tr.BytesAfter
		if tr.Shared {
			nShared++
			if !tr.Perm {
				t.Errorf("%s: no act-order permutation", tr.Name)
			}
		}
	}
	if nShared != 3*synthmoe.Layers {
		t.Fatalf("%d shared-expert tensors quantized", nShared)
	}
	ids := make([]int, 40)
	for i := range ids {
		ids[i] = (i*37 + 1) % synthmoe.Vocab
	}
	for _, th := range []int{1, 3} {
		pm, dm := loadQ(t, out, th, false), loadQ(t, out, th, true)
		a, b := runLogits(t, pm, ids, 33), runLogits(t, dm, ids, 33)
		checkPackedLogits(t, fmt.Sprintf("threads %d", th), a, b, synthmoe.Vocab, 33, anyQ8(4))
		pb, db := runtime.LinearWeightBytes(pm), runtime.LinearWeightBytes(dm)
		t.Logf("threads %d: linear weights %d bytes packed, %d dequantized, %d saved by the report", th, pb, db, saved)
		if db-pb != saved {
			t.Errorf("threads %d: packing saves %d bytes, want %d (a quantized weight is not packed)", th, db-pb, saved)
		}
	}
}
