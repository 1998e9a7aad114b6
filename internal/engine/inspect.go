package engine

import (
	"cmp"
	"fmt"
	"github.com/lmpack/lmpack/internal/fsx"
	"io"
	"sort"
	"strings"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/pack"
)

// TensorShape is one tensor's name, dtype and shape.
type TensorShape struct {
	Name  string `json:"name"`
	DType string `json:"dtype"`
	Shape []int  `json:"shape"`
}

// LayerReport summarises one decoder block.
type LayerReport struct {
	Index            int           `json:"index"`
	NumHeads         int           `json:"num_attention_heads"`
	NumKVHeads       int           `json:"num_key_value_heads"`
	HeadDim          int           `json:"head_dim"`
	IntermediateSize int           `json:"intermediate_size,omitempty"`
	NumExperts       int           `json:"num_experts,omitempty"`
	TopK             int           `json:"num_experts_per_tok,omitempty"`
	Params           int64         `json:"params"`
	Tensors          []TensorShape `json:"tensors"`
}

// InspectReport describes a checkpoint: architecture, parameter count
// (elements), bytes by dtype and per-layer shapes. It reads headers only.
type InspectReport struct {
	Dir           string           `json:"dir"`
	Architecture  string           `json:"architecture"`
	HiddenSize    int              `json:"hidden_size"`
	VocabSize     int              `json:"vocab_size"`
	NumLayers     int              `json:"num_hidden_layers"`
	RoPETheta     float64          `json:"rope_theta"`
	TiedEmbedding bool             `json:"tie_word_embeddings"`
	Params        int64            `json:"params"`
	BytesByDType  map[string]int64 `json:"bytes_by_dtype"`
	TotalBytes    int64            `json:"total_bytes"`
	Other         []TensorShape    `json:"other_tensors"`
	Layers        []LayerReport    `json:"layers"`
	// Unused lists checkpoint tensors the description does not use.
	Unused []string `json:"unused_tensors,omitempty"`
	// KVRotationTensors counts an artifact's KV-cache rotation tensors
	// (F32 [head_dim, head_dim]); they are not model parameters.
	KVRotationTensors int `json:"kv_rotation_tensors,omitempty"`
	// Artifact is set for an artifact: format version, weights and KV
	// cache methods, KV windows.
	Artifact *pack.ArtifactInfo `json:"artifact,omitempty"`
}

// Inspect builds the report for a description and its checkpoint. Errors:
// a tensor the description names is missing from the checkpoint.
func Inspect(dir string, d *arch.Description, ck *safetensors.Checkpoint) (*InspectReport, error) {
	var infos []safetensors.TensorInfo
	files := map[string]string{}
	for _, name := range ck.Names() {
		info, file, err := ck.Info(name)
		if err != nil {
			return nil, err
		}
		infos = append(infos, info)
		files[name] = file
	}
	return inspect(dir, d, infos, func(n string) string { return files[n] })
}

// inspect builds the report from tensor infos; fileOf names the file
// holding a tensor, for messages.
func inspect(dir string, d *arch.Description, infos []safetensors.TensorInfo, fileOf func(string) string) (*InspectReport, error) {
	r := &InspectReport{Dir: dir, Architecture: d.Architecture, HiddenSize: d.HiddenSize, VocabSize: d.VocabSize,
		NumLayers: len(d.Layers), RoPETheta: d.RoPE.Theta, TiedEmbedding: d.TieWordEmbeddings, BytesByDType: map[string]int64{}}
	layerOf := map[string]int{}
	used := map[string]bool{}
	for _, n := range d.TensorNames() {
		layerOf[n] = -1
	}
	for i := range d.Layers {
		for _, n := range layerTensorNames(&d.Layers[i]) {
			layerOf[n] = i
		}
		l := &d.Layers[i]
		lr := LayerReport{Index: i, NumHeads: l.NumHeads, NumKVHeads: l.NumKVHeads, HeadDim: l.HeadDim}
		if l.MLP != nil {
			lr.IntermediateSize = l.MLP.IntermediateSize
		}
		if l.MoE != nil {
			lr.NumExperts, lr.TopK = l.MoE.NumExperts, l.MoE.TopK
			lr.IntermediateSize = l.MoE.Experts[0].IntermediateSize
		}
		r.Layers = append(r.Layers, lr)
	}
	// A quantized weight (docs/QUANT.md) is stored as NAME.qweight,
	// NAME.scales, ...: they take its place, and its rows×cols parameters
	// are counted on the qweight.
	qparams := map[string]int64{}
	if d.Quant != nil {
		logical := d.TensorShapes()
		for n, q := range d.Quant.Tensors {
			sh, ok := logical[n]
			li, ok2 := layerOf[n]
			if !ok || !ok2 || len(sh) != 2 {
				continue
			}
			delete(layerOf, n)
			for sn := range arch.QuantStorage(n, sh[0], sh[1], q) {
				layerOf[sn] = li
				qparams[sn] = 0
			}
			qparams[arch.QuantPrefix(n)+arch.SuffixQWeight] = int64(sh[0]) * int64(sh[1])
		}
	}
	want := d.StorageShapes()
	for _, info := range infos {
		name, file := info.Name, fileOf(info.Name)
		if ws, ok := want[name]; ok && !sameShape(info.Shape, ws) {
			return nil, fmt.Errorf("engine: %s: tensor %q: shape %v, want %v from config.json", file, name, info.Shape, ws)
		}
		var n int64 = 1
		for _, s := range info.Shape {
			n *= int64(s)
		}
		b := n * int64(info.DType.Size())
		r.BytesByDType[string(info.DType)] += b
		r.TotalBytes += b
		if p, ok := qparams[name]; ok {
			n = p
		}
		ts := TensorShape{Name: name, DType: string(info.DType), Shape: info.Shape}
		li, ok := layerOf[name]
		switch {
		case !ok && name == d.LMHead && d.TieWordEmbeddings:
			// A tied lm_head stored explicitly is a copy, not a parameter.
			r.Other = append(r.Other, ts)
			continue
		case !ok:
			r.Unused = append(r.Unused, name)
			continue
		case li >= 0:
			r.Layers[li].Tensors = append(r.Layers[li].Tensors, ts)
			r.Layers[li].Params += n
		default:
			r.Other = append(r.Other, ts)
		}
		used[name] = true
		r.Params += n
	}
	for n := range layerOf {
		if !used[n] {
			return nil, fmt.Errorf("engine: %s: tensor %q named by config.json is missing from the checkpoint", dir, n)
		}
	}
	return r, nil
}

// sameShape reports whether got equals want.
func sameShape(got, want []int) bool {
	if len(got) != len(want) {
		return false
	}
	for i := range got {
		if got[i] != want[i] {
			return false
		}
	}
	return true
}

func layerTensorNames(l *arch.Layer) []string {
	d := arch.Description{Layers: []arch.Layer{*l}}
	return d.TensorNames()
}

// WriteText prints the report for people. It returns the first write
// error (a closed pipe, a full disk).
func (r *InspectReport) WriteText(out io.Writer) error {
	w := &fsx.ErrWriter{W: out}
	fmt.Fprintf(w, "model:         %s\n", r.Dir)
	fmt.Fprintf(w, "architecture:  %s\n", r.Architecture)
	fmt.Fprintf(w, "hidden_size:   %d   vocab_size: %d   layers: %d   rope_theta: %g   tied embeddings: %v\n",
		r.HiddenSize, r.VocabSize, r.NumLayers, r.RoPETheta, r.TiedEmbedding)
	if a := r.Artifact; a != nil {
		weights := cmp.Or(a.WeightsMethod, "float (not quantized)")
		fmt.Fprintf(w, "artifact:      format version %d, weights %s, kv cache %s", a.FormatVersion, weights, a.KVCache)
		if a.KVCache != "fp32" {
			fmt.Fprintf(w, " (sink %d, recent %d tokens)", a.KVSink, a.KVRecent)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "parameters:    %d (%.2fM)\n", r.Params, float64(r.Params)/1e6)
	var dts []string
	for k := range r.BytesByDType {
		dts = append(dts, k)
	}
	sort.Strings(dts)
	var parts []string
	for _, k := range dts {
		parts = append(parts, fmt.Sprintf("%s %d", k, r.BytesByDType[k]))
	}
	fmt.Fprintf(w, "bytes:         %d total (%s)\n", r.TotalBytes, strings.Join(parts, ", "))
	for _, t := range r.Other {
		fmt.Fprintf(w, "  %-50s %-5s %v\n", t.Name, t.DType, t.Shape)
	}
	for _, l := range r.Layers {
		fmt.Fprintf(w, "layer %d: heads %d, kv heads %d, head_dim %d", l.Index, l.NumHeads, l.NumKVHeads, l.HeadDim)
		if l.NumExperts > 0 {
			fmt.Fprintf(w, ", experts %d (top-%d), expert intermediate %d", l.NumExperts, l.TopK, l.IntermediateSize)
		} else {
			fmt.Fprintf(w, ", intermediate %d", l.IntermediateSize)
		}
		fmt.Fprintf(w, ", params %d\n", l.Params)
		for _, t := range l.Tensors {
			fmt.Fprintf(w, "  %-50s %-5s %v\n", t.Name, t.DType, t.Shape)
		}
	}
	for _, n := range r.Unused {
		fmt.Fprintf(w, "unused tensor: %s\n", n)
	}
	if r.KVRotationTensors > 0 {
		fmt.Fprintf(w, "kv rotations:  %d tensors\n", r.KVRotationTensors)
	}
	return w.Err
}
