package wquant

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	rt "runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/lmpack/lmpack/calibrate"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/model"
)

// Synthetic Llama checkpoint for benchmarks: hidden 256, 4 heads of 64,
// intermediate 512, vocab 256, seeded random weights (std 0.05).
const (
	synHidden = 256
	synInter  = 512
	synVocab  = 256
	synTokens = 2048
	synCtx    = 256
)

// synthModel writes a layers-block synthetic checkpoint and a calibration
// file holding synTokens random token ids; returns (model dir, calib).
func synthModel(tb testing.TB, layers int) (string, string) {
	tb.Helper()
	dir := filepath.Join(tb.TempDir(), fmt.Sprintf("syn%d", layers))
	if err := os.Mkdir(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	cfg := map[string]any{"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama", "hidden_size": synHidden,
		"intermediate_size": synInter, "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 4,
		"head_dim": 64, "vocab_size": synVocab, "max_position_embeddings": 1024, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
		"tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2}
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o644); err != nil {
		tb.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(7, uint64(layers)))
	mat := func(r, c int, s float64) []float32 {
		v := make([]float32, r*c)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * s)
		}
		return v
	}
	ones := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = 1
		}
		return v
	}
	ts := []safetensors.WriteTensor{
		safetensors.FromFloat32("model.embed_tokens.weight", []int{synVocab, synHidden}, mat(synVocab, synHidden, 1)),
		safetensors.FromFloat32("model.norm.weight", []int{synHidden}, ones(synHidden)),
	}
	for l := 0; l < layers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		for _, n := range []string{"q_proj", "k_proj", "v_proj", "o_proj"} {
			ts = append(ts, safetensors.FromFloat32(p+"self_attn."+n+".weight", []int{synHidden, synHidden}, mat(synHidden, synHidden, 0.05)))
		}
		ts = append(ts,
			safetensors.FromFloat32(p+"mlp.gate_proj.weight", []int{synInter, synHidden}, mat(synInter, synHidden, 0.05)),
			safetensors.FromFloat32(p+"mlp.up_proj.weight", []int{synInter, synHidden}, mat(synInter, synHidden, 0.05)),
			safetensors.FromFloat32(p+"mlp.down_proj.weight", []int{synHidden, synInter}, mat(synHidden, synInter, 0.05)),
			safetensors.FromFloat32(p+"input_layernorm.weight", []int{synHidden}, ones(synHidden)),
			safetensors.FromFloat32(p+"post_attention_layernorm.weight", []int{synHidden}, ones(synHidden)),
		)
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "model.safetensors"), ts, nil); err != nil {
		tb.Fatal(err)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		tb.Fatal(err)
	}
	defer ck.Close()
	fp, err := model.Fingerprint(dir, ck)
	if err != nil {
		tb.Fatal(err)
	}
	ids := make([]int, synTokens)
	for i := range ids {
		ids[i] = rng.IntN(synVocab)
	}
	calib := filepath.Join(tb.TempDir(), "calib.safetensors")
	c := &calibrate.Calibration{Header: calibrate.Header{FormatVersion: calibrate.FormatVersion, Kind: calibrate.Kind, ModelFingerprint: fp,
		DataFingerprint: "synthetic", Tokens: synTokens, Ctx: synCtx, LmpackVersion: "bench", Statistics: []string{calibrate.StatTokens}}, TokenIDs: ids}
	if err := calibrate.Write(calib, c); err != nil {
		tb.Fatal(err)
	}
	return dir, calib
}

// BenchmarkRunGPTQ times the whole pipeline (4-bit, group 128, GPTQ) on a
// 4-block synthetic model with 2048 calibration tokens: s/layer is wall
// time per decoder block (Hessian pass, 7 GPTQ calls, shard write, output
// pass); MB/s counts float32 input weights.
func BenchmarkRunGPTQ(b *testing.B) {
	const layers = 4
	model, calib := synthModel(b, layers)
	perLayer := int64(4*synHidden*synHidden + 3*synHidden*synInter)
	b.SetBytes(4 * perLayer * layers)
	i := 0
	for b.Loop() {
		out := filepath.Join(b.TempDir(), fmt.Sprint("q", i))
		i++
		if _, err := Run(context.Background(), Options{Model: model, Calib: calib, Out: out, Method: MethodGPTQ, Bits: 4, GroupSize: 128, Threads: 1}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N*layers), "s/layer")
}

// BenchmarkRunPeakHeap quantizes synthetic models of 4 and 8 blocks
// (GPTQ 4-bit g128) and reports the peak live heap above the heap before
// the run (runtime/metrics heap objects, sampled every 200µs, GC at 10%
// so garbage does not dominate): peak-heap-B for each, the growth from 4
// to 8 blocks, and one block's working set (float32 weights + float64
// Hessians + GPTQ's float64 copy of the largest weight and its two
// [cols, cols] factors). Sequential processing means the growth stays below
// one block's working set.
func BenchmarkRunPeakHeap(b *testing.B) {
	old := debug.SetGCPercent(10)
	defer debug.SetGCPercent(old)
	peaks := map[int]uint64{}
	for _, layers := range []int{4, 8} {
		model, calib := synthModel(b, layers)
		var peak uint64
		for i := 0; i < max(b.N, 1); i++ {
			out := filepath.Join(b.TempDir(), fmt.Sprint("q", i))
			rt.GC()
			base := heapNow()
			s := startHeapSampler()
			_, err := Run(context.Background(), Options{Model: model, Calib: calib, Out: out, Method: MethodGPTQ, Bits: 4, GroupSize: 128, Threads: 1})
			p := s.stop()
			if err != nil {
				b.Fatal(err)
			}
			peak = max(peak, p-min(base, p))
		}
		peaks[layers] = peak
	}
	H, I := int64(synHidden), int64(synInter)
	weightsF32 := 4 * (4*H*H + 3*H*I)
	hess := 8 * (3*H*H + I*I)
	gptq := 8*I*H + 2*8*I*I
	working := weightsF32 + hess + gptq
	b.ReportMetric(float64(peaks[4]), "peak-heap-4L-B")
	b.ReportMetric(float64(peaks[8]), "peak-heap-8L-B")
	b.ReportMetric(float64(int64(peaks[8])-int64(peaks[4])), "growth-B")
	b.ReportMetric(float64(working), "layer-working-set-B")
	if int64(peaks[8])-int64(peaks[4]) >= working {
		b.Errorf("peak heap grew by %d bytes from 4 to 8 blocks, one block's working set is %d", int64(peaks[8])-int64(peaks[4]), working)
	}
}

type heapSampler struct {
	stopc chan struct{}
	wg    sync.WaitGroup
	peak  uint64
}

func heapNow() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func startHeapSampler() *heapSampler {
	h := &heapSampler{stopc: make(chan struct{})}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		tk := time.NewTicker(200 * time.Microsecond)
		defer tk.Stop()
		for {
			h.peak = max(h.peak, heapNow())
			select {
			case <-h.stopc:
				return
			case <-tk.C:
			}
		}
	}()
	return h
}

func (h *heapSampler) stop() uint64 {
	close(h.stopc)
	h.wg.Wait()
	return max(h.peak, heapNow())
}
