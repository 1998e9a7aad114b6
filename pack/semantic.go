package pack

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// QuantMethods are the weight-quantization methods a quantized checkpoint
// may name (config.json lmpack_quantization.method; what quantize/wquant
// writes) and so the Manifest.WeightsMethod values an artifact may carry.
var QuantMethods = []string{"rtn", "gptq"}

// checkQuantMethod refuses a weights method other than QuantMethods.
func checkQuantMethod(method string) error {
	if !slices.Contains(QuantMethods, method) {
		return fmt.Errorf("weights method %q, want one of %s (what lmpack quantize weights writes): %w", method, strings.Join(QuantMethods, ", "), ErrFormat)
	}
	return nil
}

// CheckKVWindows checks the fp16 KV windows sink and recent (tokens)
// against the model's context length maxPos (max_position_embeddings;
// 0 means unknown, then only signs are checked): both ≥ 0 and sink +
// recent ≤ maxPos. Errors wrap ErrFormat and name the values.
func CheckKVWindows(sink, recent, maxPos int) error {
	switch {
	case sink < 0 || recent < 0:
		return fmt.Errorf("kv windows sink %d, recent %d: want ≥ 0 tokens: %w", sink, recent, ErrFormat)
	case maxPos > 0 && (sink > maxPos || recent > maxPos || sink+recent > maxPos):
		return fmt.Errorf("kv windows sink %d + recent %d tokens exceed the model's max_position_embeddings %d: %w", sink, recent, maxPos, ErrFormat)
	}
	return nil
}

// sourceFunc adapts a function to runtime.TensorSource.
type sourceFunc func(name string) (*safetensors.Tensor, error)

func (f sourceFunc) Tensor(name string) (*safetensors.Tensor, error) { return f(name) }

// checkQuantValues reads every quantized weight of d through the
// runtime's reader (runtime.ReadQuantized: finite positive scales,
// integer zero-points in range, a true permutation, no stray bits) from
// src. Errors name the weight and the storage tensor (runtime.ErrBadWeights).
func checkQuantValues(d *arch.Description, src runtime.TensorSource) error {
	if d.Quant == nil {
		return nil
	}
	for _, n := range slices.Sorted(maps.Keys(d.Quant.Tensors)) {
		if _, _, err := runtime.ReadQuantized(src, n, d.Quant.Tensors[n]); err != nil {
			return err
		}
	}
	return nil
}

// semantics runs the checks a loader runs on an artifact beyond its
// checksums: the manifest model validates (Description), the manifest's
// tensors are exactly those the model reads with the shapes it expects
// (a tied lm_head and RoPE inv_freq buffers excepted), the KV scheme
// builds with its rotations and clip ratios (kvcache.New) and its windows
// fit max_position_embeddings, the weights method is known, every plain
// tensor the model reads is a float dtype, the embedded tokenizer loads
// (checkTokenizer), and every quantized weight's values are valid
// (checkQuantValues). Storage and embedded files are read through get,
// which returns raw section bytes or false when that section failed its
// own check.
func (r *Reader) semantics(get func(section string) ([]byte, bool)) []error {
	d, err := r.Description()
	if err != nil {
		return []error{err}
	}
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("pack: %s: "+format, append([]any{r.path}, a...)...))
	}
	m := r.manifest // Description checked the weights method, KVCache the windows
	want := d.StorageShapes()
	have := map[string]bool{}
	for _, t := range r.TensorInfos() {
		if r.IsKVRotation(t.Name) {
			continue
		}
		have[t.Name] = true
		w, ok := want[t.Name]
		switch {
		case !ok && !(t.Name == d.LMHead && d.TieWordEmbeddings) && !strings.HasSuffix(t.Name, "rotary_emb.inv_freq"):
			bad("the manifest lists tensor %q, which the model does not use: %w", t.Name, ErrMismatch)
		case ok && !slices.Equal(w, t.Shape):
			bad("tensor %q has shape %v, the manifest model implies %v: %w", t.Name, t.Shape, w, ErrMismatch)
		case ok && !isStorage(r.storage, t.Name) && !t.DType.IsFloat():
			bad("tensor %q: dtype %s, want a float dtype (F32, F16, BF16, F64, F8_E4M3, F8_E5M2): the runtime loads it as a float weight: %w", t.Name, t.DType, ErrFormat)
		}
	}
	for _, n := range slices.Sorted(maps.Keys(want)) {
		if !have[n] && !(n == d.LMHead && d.TieWordEmbeddings) {
			bad("the manifest model needs tensor %q, which the artifact lacks: %w", n, ErrMismatch)
		}
	}
	if kv := m.KV; kv != nil {
		method, opt, err := r.KVCache()
		if err != nil {
			errs = append(errs, err)
		} else if _, err := kvcache.New(method, kvcache.LayersOf(d), 1, opt); err != nil {
			bad("manifest kv cache %s: %w", method, err)
		}
	}
	if err := r.checkTokenizer(d, get); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return errs
	}
	src := sourceFunc(func(name string) (*safetensors.Tensor, error) {
		s, ok := r.storage[name]
		if !ok {
			return nil, fmt.Errorf("pack: %s: tensor %q: %w", r.path, name, safetensors.ErrMissingTensor)
		}
		b, ok := get(s.section)
		if !ok {
			return nil, errSkip
		}
		return &safetensors.Tensor{Name: name, File: r.path, DType: s.dtype, Shape: slices.Clone(s.shape), Data: b}, nil
	})
	if d.Quant != nil {
		for _, n := range slices.Sorted(maps.Keys(d.Quant.Tensors)) {
			if _, _, err := runtime.ReadQuantized(src, n, d.Quant.Tensors[n]); err != nil && !errors.Is(err, errSkip) {
				errs = append(errs, fmt.Errorf("pack: %s: %w", r.path, err))
			}
		}
	}
	return errs
}

// isStorage reports whether name is a storage tensor of a quantized weight
// (NAME.qweight, NAME.scales, ...).
func isStorage(storage map[string]storageRef, name string) bool {
	_, ok := storage[name]
	return ok
}

// checkTokenizer checks that the artifact embeds the tokenizer a loader
// builds (Reader.Tokenizer: tokenizer.json and, when embedded,
// tokenizer_config.json, parsed together, at most vocab_size tokens),
// reading the files through get (a file whose section failed its own
// check is skipped: already reported). Errors name the artifact and the
// file; a missing tokenizer.json wraps ErrFormat.
func (r *Reader) checkTokenizer(d *arch.Description, get func(section string) ([]byte, bool)) error {
	section := func(name string) (string, bool) {
		for _, f := range r.manifest.Files {
			if f.Name == name {
				return f.Section, true
			}
		}
		return "", false
	}
	sec, ok := section("tokenizer.json")
	if !ok {
		return fmt.Errorf("pack: %s: the artifact embeds no tokenizer.json; run and eval need it: %w", r.path, ErrFormat)
	}
	tj, ok := get(sec)
	if !ok {
		return nil
	}
	var cfg []byte
	if sec, ok := section("tokenizer_config.json"); ok {
		if cfg, ok = get(sec); !ok {
			return nil
		}
		if cfg == nil {
			cfg = []byte{}
		}
	}
	if _, err := parseTokenizer(tj, cfg, d.VocabSize); err != nil {
		return fmt.Errorf("pack: %s: embedded %w; run and eval would refuse the artifact", r.path, err)
	}
	return nil
}

// errSkip: a storage section already reported as corrupt.
var errSkip = errors.New("section already reported")
