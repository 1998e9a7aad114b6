package engine

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// TestDeviceKV: the CUDA device cache takes oscar2 and fp16 artifacts with
// the manifest's windows and rotations (and oscar4), and int8, int4, q8_0, q4_0 and fp8
// ones with its windows (no blocker); every other KV method keeps a
// blocker naming it; the float32 cache maps to the device's fp16.
func TestDeviceKV(t *testing.T) {
	rot := &kvcache.Rotations{K: [][]float32{{1}}, V: [][]float32{{1}}}
	opt := kvcache.Options{Sink: 5, Recent: 17, Rotations: rot}
	o, why := deviceKV("oscar2", opt)
	if why != "" || o.Method != "oscar2" || o.Sink != 5 || o.Recent != 17 || o.Rotations != rot {
		t.Errorf("oscar2: %+v, blocker %q; want method oscar2, sink 5, recent 17, the manifest rotations, no blocker", o, why)
	}
	if o, why := deviceKV("fp16", opt); why != "" || o.Method != "fp16" {
		t.Errorf("fp16: %+v, blocker %q", o, why)
	}
	if o, why := deviceKV("", kvcache.Options{}); why != "" || o.Method != "fp16" {
		t.Errorf("float32 cache: %+v, blocker %q; want the device fp16 cache", o, why)
	}
	for _, m := range []string{"int8", "int4", "q8_0", "q4_0", "fp8"} {
		if o, why := deviceKV(m, opt); why != "" || o.Method != m || o.Sink != 5 || o.Recent != 17 {
			t.Errorf("%s: %+v, blocker %q; want method %s, sink 5, recent 17, no blocker", m, o, why, m)
		}
	}
	if o, why := deviceKV("oscar4", opt); why != "" || o.Method != "oscar4" || o.Rotations != rot {
		t.Errorf("oscar4: %+v, blocker %q; want method oscar4 with the manifest rotations, no blocker", o, why)
	}
	for _, m := range []string{"kivi2", "quarot2", "oscar-mixed", "oscars2", "turboquant_k8v4", "int4_per_token_head"} {
		if _, why := deviceKV(m, opt); !strings.Contains(why, m) || !strings.Contains(why, "CPU backend only") {
			t.Errorf("%s: blocker %q, want one naming %s and the CPU", m, why, m)
		}
	}
}

// TestLoadModelKVBlocker: with a GPU faked present, a kivi2 artifact's
// blocker makes --device cuda refuse and auto run on the CPU, while
// oscar2's empty blocker lets --device cuda reach the CUDA backend's Load
// (which, with no real GPU here, fails at the device, not with the
// blocker).
func TestLoadModelKVBlocker(t *testing.T) {
	old := cudaProbe
	defer func() { cudaProbe = old }()
	cudaProbe = func(int) error { return nil }
	_, d, ck, err := model.Open(context.Background(), shared.Path(t, "stories260K-hf"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	_, kivi := deviceKV("kivi2", kvcache.Options{})
	if _, _, err := loadModel(context.Background(), "cuda", logger, d, ck, 1, kivi); err == nil || !strings.Contains(err.Error(), "kivi2") {
		t.Errorf("cuda, kivi2: err %v, want the blocker naming kivi2", err)
	}
	be, m, err := loadModel(context.Background(), "auto", logger, d, ck, 1, kivi)
	if err != nil || be.Name() != "cpu" {
		t.Fatalf("auto, kivi2: backend %v, err %v; want cpu", be, err)
	}
	m.Close()
	_, osc := deviceKV("oscar2", kvcache.Options{})
	be, m, err = loadModel(context.Background(), "cuda", logger, d, ck, 1, osc)
	if err == nil {
		// A real GPU is present: the model must be on it.
		defer m.Close()
		if be.Name() != "cuda" {
			t.Errorf("cuda, oscar2: backend %s, want cuda", be.Name())
		}
	} else if strings.Contains(err.Error(), "CPU backend only") {
		t.Errorf("cuda, oscar2: err %v, the blocker was kept", err)
	}
}
