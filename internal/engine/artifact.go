package engine

import (
	"cmp"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/hub"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/pack"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/cuda"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// openArtifact opens path (pack.Open) and reads its description.
func openArtifact(path string) (*pack.Reader, *arch.Description, error) {
	a, err := pack.Open(path)
	if err != nil {
		return nil, nil, err
	}
	d, err := a.Description()
	if err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, d, nil
}

// kvModel is a loaded model whose NewCache builds the artifact's KV-cache
// scheme: a runtime/kvcache cache on the CPU backend, a cuda.DeviceCache
// (deviceKV's options) when the model is on the CUDA backend.
type kvModel struct {
	runtime.Model
	method string
	layers []kvcache.Layer
	opt    kvcache.Options
	// fakeQuant: CPU caches read through kvcache.NewFakeQuant (EvalFile,
	// as eval --kv measures).
	fakeQuant bool
}

// NewCache implements runtime.Model. The scheme was built once for a
// 1-token cache when the artifact was opened (on the device too, for a
// *cuda.Model), so only a capacity < 1 (a caller's bug) or, on the GPU,
// device memory running out can fail here (a panic, as cuda.Model's
// NewCache).
func (m *kvModel) NewCache(capacity int) runtime.KVCache {
	if cm, ok := m.Model.(*cuda.Model); ok {
		o, _ := deviceKV(m.method, m.opt)
		c, err := cm.NewDeviceCache(capacity, o)
		if err != nil {
			panic(fmt.Sprintf("engine: device kv cache %s for %d tokens: %v", m.method, capacity, err))
		}
		return c
	}
	newCache := kvcache.New
	if m.fakeQuant {
		newCache = kvcache.NewFakeQuant
	}
	c, err := newCache(m.method, m.layers, capacity, m.opt)
	if err != nil {
		panic(fmt.Sprintf("engine: kv cache %s for %d tokens: %v", m.method, capacity, err))
	}
	return c
}

// ForwardBatch implements runtime.BatchForwarder: the wrapped model's
// batched forward when it has one (the CPU backend's), one Forward per
// sequence otherwise (runtime.ForwardBatch).
func (m *kvModel) ForwardBatch(ctx context.Context, seqs []runtime.Seq) error {
	return runtime.ForwardBatch(ctx, m.Model, seqs)
}

// deviceKV maps an artifact's KV-cache scheme (a runtime/kvcache method
// and its options) to the CUDA backend's device cache. The device
// implements fp16, oscar2, oscar4, int8, int4, q8_0, q4_0 and fp8
// (cuda.DeviceKVMethods; cuda.CacheOptions: the same Sink and Recent
// windows in tokens and the manifest's rotations and clip ratios); for any
// other method ("kivi2", "quarot2", ...) blocker says why the artifact cannot
// run on the GPU (loadModel's blocker). method "" (the float32 cache) runs
// on the device's fp16 cache, as checkpoints do.
func deviceKV(method string, opt kvcache.Options) (o cuda.CacheOptions, blocker string) {
	switch method {
	case "":
		return cuda.CacheOptions{Method: "fp16"}, ""
	case "fp16", "oscar2", "oscar4", "int8", "int4", "q8_0", "q4_0", "fp8":
		return cuda.CacheOptions{Method: method, Sink: opt.Sink, Recent: opt.Recent, Rotations: opt.Rotations}, ""
	}
	return cuda.CacheOptions{}, fmt.Sprintf("the artifact's KV cache scheme %s runs on the CPU backend only (the CUDA backend's device cache implements %s)", method, strings.Join(cuda.DeviceKVMethods(), ", "))
}

// openArtifactEngine loads an artifact on the backend --device selects
// (the CPU when the KV scheme is one the CUDA device cache lacks, see
// deviceKV) with the manifest's KV-cache scheme (Model.NewCache then
// builds that cache, with
// the stored rotations, clip ratios and windows) and fails when the
// scheme does not build for the model or any manifest tensor, rotations
// included, went unconsumed (a tied lm_head stored explicitly and RoPE
// inv_freq buffers excepted, as for checkpoints).
func openArtifactEngine(ctx context.Context, path string, opt Options) (*Engine, error) {
	a, d, err := openArtifact(path)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			a.Close()
		}
	}()
	kvMethod, kvOpt, err := a.KVCache()
	if err != nil {
		return nil, err
	}
	kvLayers := kvcache.LayersOf(d)
	if kvMethod != "" {
		if _, err := kvcache.New(kvMethod, kvLayers, 1, kvOpt); err != nil {
			return nil, fmt.Errorf("engine: %s: manifest kv cache %s: %w", path, kvMethod, err)
		}
	}
	tok, err := a.Tokenizer(d)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	_, blocker := deviceKV(kvMethod, kvOpt)
	be, m, err := loadModelOpts(ctx, opt.Device, opt.Logger, d, a, runtime.LoadOptions{Threads: opt.Threads, DequantizeWeights: opt.DequantizeWeights}, blocker)
	if err != nil {
		return nil, err
	}
	if kvMethod != "" {
		if cm, ok := m.(*cuda.Model); ok {
			// Build the device cache once, as kvcache.New was above, so a
			// bad scheme fails here rather than in NewCache.
			o, _ := deviceKV(kvMethod, kvOpt)
			c, err := cm.NewDeviceCache(1, o)
			if err != nil {
				m.Close()
				return nil, fmt.Errorf("engine: %s: manifest kv cache %s on the CUDA device: %w", path, kvMethod, err)
			}
			if err := c.Free(); err != nil {
				m.Close()
				return nil, fmt.Errorf("engine: %s: %w", path, err)
			}
		}
		m = &kvModel{Model: m, method: kvMethod, layers: kvLayers, opt: kvOpt}
	}
	var extra []string
	for _, n := range a.Unconsumed() {
		if (n == d.LMHead && d.TieWordEmbeddings) || strings.HasSuffix(n, "rotary_emb.inv_freq") {
			continue
		}
		extra = append(extra, n)
	}
	if len(extra) > 0 {
		m.Close()
		return nil, fmt.Errorf("engine: %s: the manifest lists %d tensors the model does not use (first %q); the manifest's model and its tensors disagree",
			path, len(extra), extra[0])
	}
	if opt.Logger != nil {
		opt.Logger.Info("model loaded", "artifact", path, "architecture", d.Architecture, "layers", len(d.Layers), "kv_cache", cmp.Or(kvMethod, "fp32"), "device", be.Name(), "seconds", time.Since(t0).Seconds())
	}
	ok = true
	return &Engine{Dir: path, Desc: d, Artifact: a, Tokenizer: tok, Model: m, KVCache: kvMethod}, nil
}

// InspectModel builds the inspect report for MODEL: an artifact (from its
// manifest, reading no section) or a checkpoint directory or hub id
// (model.Open, then Inspect).
func InspectModel(ctx context.Context, name string, h *hub.Options) (*InspectReport, error) {
	if model.IsArtifact(name) {
		a, d, err := openArtifact(name)
		if err != nil {
			return nil, err
		}
		defer a.Close()
		var infos []safetensors.TensorInfo
		kv := 0
		for _, t := range a.TensorInfos() {
			if a.IsKVRotation(t.Name) {
				kv++
				continue
			}
			infos = append(infos, t)
		}
		r, err := inspect(name, d, infos, func(string) string { return name })
		if err != nil {
			return nil, err
		}
		r.KVRotationTensors = kv
		info := a.Info()
		info.KVCache = cmp.Or(info.KVCache, "fp32")
		r.Artifact = &info
		return r, nil
	}
	dir, d, ck, err := model.Open(ctx, name, h)
	if err != nil {
		return nil, err
	}
	defer ck.Close()
	return Inspect(dir, d, ck)
}
