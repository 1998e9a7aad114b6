package export

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/gguf"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
)

func exportGGUF(t *testing.T, model string, opt GGUFOptions) (*Report, string) {
	t.Helper()
	if opt.Out == "" {
		opt.Out = filepath.Join(t.TempDir(), "m.gguf")
	}
	rep, err := GGUF(context.Background(), model, opt)
	if err != nil {
		t.Fatal(err)
	}
	return rep, opt.Out
}

// spPiece is one piece of a SentencePiece model proto (tokenizer.model).
type spPiece struct {
	piece string
	score float32
	typ   int32
}

// readSentencePiece parses the pieces of a SentencePiece ModelProto
// (field 1 repeated SentencePiece {1: piece, 2: score, 3: type, default
// NORMAL = 1}) from the protobuf wire format.
func readSentencePiece(t *testing.T, path string) []spPiece {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	varint := func(b []byte, i *int) uint64 {
		var r uint64
		for s := 0; ; s += 7 {
			c := b[*i]
			*i++
			r |= uint64(c&0x7f) << s
			if c < 0x80 {
				return r
			}
		}
	}
	var out []spPiece
	for i := 0; i < len(b); {
		k := varint(b, &i)
		switch k & 7 {
		case 0:
			varint(b, &i)
		case 1:
			i += 8
		case 5:
			i += 4
		case 2:
			n := int(varint(b, &i))
			v := b[i : i+n]
			i += n
			if k>>3 != 1 {
				continue
			}
			p := spPiece{typ: 1}
			for j := 0; j < len(v); {
				kk := varint(v, &j)
				switch {
				case kk == 1<<3|2:
					nn := int(varint(v, &j))
					p.piece = string(v[j : j+nn])
					j += nn
				case kk == 2<<3|5:
					p.score = math.Float32frombits(binary.LittleEndian.Uint32(v[j:]))
					j += 4
				case kk == 3<<3|0:
					p.typ = int32(varint(v, &j))
				default:
					t.Fatalf("tokenizer.model: unexpected field key %d", kk)
				}
			}
			out = append(out, p)
		default:
			t.Fatalf("tokenizer.model: wire type %d", k&7)
		}
	}
	return out
}

// TestGGUFStories260KMetadata checks the llama metadata and the
// SentencePiece tokenizer of the stories260K export key by key against
// config.json, tokenizer_config.json and tokenizer.model (scores and
// token types, which the exporter derives from tokenizer.json alone).
func TestGGUFStories260KMetadata(t *testing.T) {
	dir := shared.Path(t, "stories260K-hf")
	rep, out := exportGGUF(t, dir, GGUFOptions{})
	f := openGGUF(t, out)
	want := map[string]any{
		"general.architecture":                   "llama",
		"general.alignment":                      uint32(32),
		"general.file_type":                      uint32(0),
		"llama.vocab_size":                       uint32(512),
		"llama.context_length":                   uint32(512),
		"llama.embedding_length":                 uint32(64),
		"llama.block_count":                      uint32(5),
		"llama.feed_forward_length":              uint32(172),
		"llama.attention.head_count":             uint32(8),
		"llama.attention.head_count_kv":          uint32(4),
		"llama.attention.key_length":             uint32(8),
		"llama.attention.value_length":           uint32(8),
		"llama.rope.dimension_count":             uint32(8),
		"llama.rope.freq_base":                   float32(10000),
		"llama.attention.layer_norm_rms_epsilon": float32(1e-5),
		"tokenizer.ggml.model":                   "llama",
		"tokenizer.ggml.pre":                     "default",
		"tokenizer.ggml.bos_token_id":            uint32(1),
		"tokenizer.ggml.eos_token_id":            uint32(2),
		"tokenizer.ggml.unknown_token_id":        uint32(0),
		"tokenizer.ggml.add_bos_token":           true,
		"tokenizer.ggml.add_eos_token":           false,
		"tokenizer.ggml.add_space_prefix":        true,
	}
	for k, v := range want {
		if got := kv(t, f, k); !reflect.DeepEqual(got, v) {
			t.Errorf("%s = %#v, want %#v", k, got, v)
		}
	}
	for _, k := range []string{"tokenizer.ggml.merges", "tokenizer.chat_template", "tokenizer.ggml.padding_token_id", "general.quantization_version"} {
		if _, ok := f.Get(k); ok {
			t.Errorf("%s present; the model has none", k)
		}
	}
	sp := readSentencePiece(t, filepath.Join(dir, "tokenizer.model"))
	toks, _ := kv(t, f, "tokenizer.ggml.tokens").([]string)
	scores, _ := kv(t, f, "tokenizer.ggml.scores").([]float32)
	types, _ := kv(t, f, "tokenizer.ggml.token_type").([]int32)
	if len(sp) != 512 || len(toks) != 512 || len(scores) != 512 || len(types) != 512 {
		t.Fatalf("%d pieces, %d tokens, %d scores, %d types; want 512 each", len(sp), len(toks), len(scores), len(types))
	}
	for i, p := range sp {
		if toks[i] != p.piece || scores[i] != p.score || types[i] != p.typ {
			t.Errorf("token %d: (%q, %v, type %d), tokenizer.model has (%q, %v, type %d)", i, toks[i], scores[i], types[i], p.piece, p.score, p.typ)
		}
	}
	// Tensors: tied embeddings (no output.weight), llama.cpp's names.
	if len(f.Tensors) != 47 || f.Tensors[0].Name != "token_embd.weight" || f.Tensors[46].Name != "output_norm.weight" {
		t.Errorf("%d tensors, first %q, last %q", len(f.Tensors), f.Tensors[0].Name, f.Tensors[len(f.Tensors)-1].Name)
	}
	if _, ok := f.Tensor("output.weight"); ok {
		t.Error("output.weight written for tied embeddings")
	}
	ti, _ := f.Tensor("blk.2.ffn_down.weight")
	if ti == nil || !slices.Equal(ti.Dims, []uint64{172, 64}) || ti.Type != gguf.TypeF32 {
		t.Errorf("blk.2.ffn_down.weight: %+v, want F32 dims [172 64] (ne[0] = in_features)", ti)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	for gname, hf := range map[string]string{"token_embd.weight": "model.embed_tokens.weight", "blk.2.ffn_down.weight": "model.layers.2.mlp.down_proj.weight",
		"blk.4.attn_v.weight": "model.layers.4.self_attn.v_proj.weight", "output_norm.weight": "model.norm.weight"} {
		g, err := f.TensorData(gname)
		if err != nil {
			t.Fatal(err)
		}
		h, _ := ck.Tensor(hf)
		if !bytes.Equal(g, h.Data) {
			t.Errorf("%s differs from %s", gname, hf)
		}
	}
	if rep.BitsPerWeight != 32 || rep.Counts()[ModeExact] != 47 {
		t.Errorf("report: %.3f bits per weight, modes %v; want 32 and 47 exact", rep.BitsPerWeight, rep.Counts())
	}
	if st, _ := os.Stat(out); rep.Bytes != st.Size() {
		t.Errorf("report bytes %d, file %d", rep.Bytes, st.Size())
	}
}

// TestGGUFQKPermutation checks the q/k row permutation of the llama
// export two ways: un-permuting (row h·hd + 2i + j of the GGUF tensor is
// row h·hd + j·hd/2 + i of the checkpoint) gives the checkpoint back, and
// attention scores computed with llama.cpp's interleaved RoPE on the GGUF
// rows equal those with Hugging Face's rotate_half RoPE on the checkpoint
// rows. The qwen3 export is not permuted.
func TestGGUFQKPermutation(t *testing.T) {
	dir := shared.Path(t, "stories260K-hf")
	_, out := exportGGUF(t, dir, GGUFOptions{})
	f := openGGUF(t, out)
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	const hd, hidden, theta = 8, 64, 10000.0
	for _, c := range []struct {
		g, h  string
		heads int
	}{{"blk.1.attn_q.weight", "model.layers.1.self_attn.q_proj.weight", 8}, {"blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight", 4}} {
		gb, err := f.TensorData(c.g)
		if err != nil {
			t.Fatal(err)
		}
		ht, _ := ck.Tensor(c.h)
		g := f32s(gb)
		h, _ := ht.Float32()
		if slices.Equal(g, h) {
			t.Fatalf("%s equals %s unpermuted", c.g, c.h)
		}
		for r := 0; r < c.heads*hd; r++ {
			hh, k := r/hd, r%hd
			src := hh*hd + (k%2)*(hd/2) + k/2
			if !slices.Equal(g[r*hidden:(r+1)*hidden], h[src*hidden:(src+1)*hidden]) {
				t.Fatalf("%s row %d is not checkpoint row %d", c.g, r, src)
			}
		}
	}
	// Attention scores of head 0 of q against head 0 of k (GQA group 0)
	// at positions 5 and 2 for a fixed input vector.
	x := make([]float32, hidden)
	for i := range x {
		x[i] = float32(math.Sin(float64(i) * 0.37))
	}
	proj := func(w []float32, rows int) []float64 {
		out := make([]float64, rows)
		for r := range out {
			for c := 0; c < hidden; c++ {
				out[r] += float64(w[r*hidden+c]) * float64(x[c])
			}
		}
		return out
	}
	ropeHF := func(v []float64, pos int) []float64 { // rotate_half: pairs (i, i+hd/2)
		o := slices.Clone(v)
		for i := 0; i < hd/2; i++ {
			a := float64(pos) * math.Pow(theta, -2*float64(i)/hd)
			o[i] = v[i]*math.Cos(a) - v[i+hd/2]*math.Sin(a)
			o[i+hd/2] = v[i+hd/2]*math.Cos(a) + v[i]*math.Sin(a)
		}
		return o
	}
	ropeNorm := func(v []float64, pos int) []float64 { // ggml normal RoPE: pairs (2i, 2i+1)
		o := slices.Clone(v)
		for i := 0; i < hd/2; i++ {
			a := float64(pos) * math.Pow(theta, -2*float64(i)/hd)
			o[2*i] = v[2*i]*math.Cos(a) - v[2*i+1]*math.Sin(a)
			o[2*i+1] = v[2*i+1]*math.Cos(a) + v[2*i]*math.Sin(a)
		}
		return o
	}
	dot := func(a, b []float64) (s float64) {
		for i := range a {
			s += a[i] * b[i]
		}
		return
	}
	load := func(g, h string) ([]float32, []float32) {
		gb, _ := f.TensorData(g)
		ht, _ := ck.Tensor(h)
		hv, _ := ht.Float32()
		return f32s(gb), hv
	}
	gq, hq := load("blk.1.attn_q.weight", "model.layers.1.self_attn.q_proj.weight")
	gk, hk := load("blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight")
	sHF := dot(ropeHF(proj(hq, hd), 5), ropeHF(proj(hk, hd), 2))
	sGG := dot(ropeNorm(proj(gq, hd), 5), ropeNorm(proj(gk, hd), 2))
	if math.Abs(sHF-sGG) > 1e-9*math.Max(1, math.Abs(sHF)) || sHF == 0 {
		t.Errorf("attention score: rotate_half on the checkpoint %.12g, interleaved RoPE on the GGUF rows %.12g", sHF, sGG)
	}
	// Without the permutation the scores differ (the check can fail).
	if bad := dot(ropeNorm(proj(hq, hd), 5), ropeNorm(proj(hk, hd), 2)); math.Abs(bad-sHF) < 1e-6 {
		t.Errorf("interleaved RoPE on unpermuted rows gives the same score %.9g; the check is vacuous", bad)
	}
}

func f32s(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// TestGGUFQwen3MoE checks the qwen3moe export of qwen3moe-2m-hf against
// its config.json: the architecture keys, stacked BF16 experts equal to
// the experts' tensors one after another, unpermuted q/k (NEOX RoPE),
// q/k norms, the F32 router, the untied output.
func TestGGUFQwen3MoE(t *testing.T) {
	dir := shared.Path(t, "qwen3moe-2m-hf")
	_, out := exportGGUF(t, dir, GGUFOptions{})
	f := openGGUF(t, out)
	var cfg struct {
		Hidden   int     `json:"hidden_size"`
		Inter    int     `json:"intermediate_size"`
		MoEInter int     `json:"moe_intermediate_size"`
		Layers   int     `json:"num_hidden_layers"`
		Heads    int     `json:"num_attention_heads"`
		KVHeads  int     `json:"num_key_value_heads"`
		HeadDim  int     `json:"head_dim"`
		Experts  int     `json:"num_experts"`
		TopK     int     `json:"num_experts_per_tok"`
		Theta    float64 `json:"rope_theta"`
		Eps      float64 `json:"rms_norm_eps"`
		MaxPos   int     `json:"max_position_embeddings"`
		Vocab    int     `json:"vocab_size"`
		BOSRaw   int     `json:"bos_token_id"`
		EOSRaw   int     `json:"eos_token_id"`
	}
	b, _ := os.ReadFile(filepath.Join(dir, "config.json"))
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"general.architecture":                      "qwen3moe",
		"general.file_type":                         uint32(32),
		"qwen3moe.vocab_size":                       uint32(cfg.Vocab),
		"qwen3moe.context_length":                   uint32(cfg.MaxPos),
		"qwen3moe.embedding_length":                 uint32(cfg.Hidden),
		"qwen3moe.block_count":                      uint32(cfg.Layers),
		"qwen3moe.feed_forward_length":              uint32(cfg.Inter),
		"qwen3moe.expert_feed_forward_length":       uint32(cfg.MoEInter),
		"qwen3moe.expert_count":                     uint32(cfg.Experts),
		"qwen3moe.expert_used_count":                uint32(cfg.TopK),
		"qwen3moe.attention.head_count":             uint32(cfg.Heads),
		"qwen3moe.attention.head_count_kv":          uint32(cfg.KVHeads),
		"qwen3moe.attention.key_length":             uint32(cfg.HeadDim),
		"qwen3moe.attention.value_length":           uint32(cfg.HeadDim),
		"qwen3moe.rope.freq_base":                   float32(cfg.Theta),
		"qwen3moe.attention.layer_norm_rms_epsilon": float32(cfg.Eps),
		"tokenizer.ggml.bos_token_id":               uint32(cfg.BOSRaw),
		"tokenizer.ggml.eos_token_id":               uint32(cfg.EOSRaw),
	}
	for k, v := range want {
		if got := kv(t, f, k); !reflect.DeepEqual(got, v) {
			t.Errorf("%s = %#v, want %#v", k, got, v)
		}
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	ti, _ := f.Tensor("blk.3.ffn_down_exps.weight")
	if ti == nil || ti.Type != gguf.TypeBF16 || !slices.Equal(ti.Dims, []uint64{uint64(cfg.MoEInter), uint64(cfg.Hidden), uint64(cfg.Experts)}) {
		t.Fatalf("blk.3.ffn_down_exps.weight: %+v, want BF16 dims [%d %d %d]", ti, cfg.MoEInter, cfg.Hidden, cfg.Experts)
	}
	got, _ := f.TensorData("blk.3.ffn_down_exps.weight")
	var stacked []byte
	for e := 0; e < cfg.Experts; e++ {
		tt, err := ck.Tensor("model.layers.3.mlp.experts." + string(rune('0'+e)) + ".down_proj.weight")
		if err != nil {
			t.Fatal(err)
		}
		stacked = append(stacked, tt.Data...)
	}
	if !bytes.Equal(got, stacked) {
		t.Error("blk.3.ffn_down_exps.weight is not the experts' down_proj stacked in expert order")
	}
	for gname, hf := range map[string]string{"blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj.weight", "blk.0.attn_k.weight": "model.layers.0.self_attn.k_proj.weight", "output.weight": "lm_head.weight"} {
		g, err := f.TensorData(gname)
		if err != nil {
			t.Fatal(err)
		}
		h, _ := ck.Tensor(hf)
		if !bytes.Equal(g, h.Data) {
			t.Errorf("%s differs from %s (qwen3 uses NEOX RoPE: no permutation)", gname, hf)
		}
	}
	for _, n := range []string{"blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight", "blk.0.ffn_gate_inp.weight"} {
		ti, ok := f.Tensor(n)
		if !ok || ti.Type != gguf.TypeF32 {
			t.Errorf("%s: %+v, want an F32 tensor", n, ti)
		}
	}
	ti, _ = f.Tensor("blk.0.ffn_gate_inp.weight")
	if !slices.Equal(ti.Dims, []uint64{uint64(cfg.Hidden), uint64(cfg.Experts)}) {
		t.Errorf("router dims %v", ti.Dims)
	}
}

// TestGGUFByteLevelBPE converts the Qwen3 tokenizer (byte-level BPE) and
// checks the gpt2 metadata against tokenizer.json and
// tokenizer_config.json: tokens by id, merges in order, types of the added
// tokens, the qwen2 pre-tokenizer, eos and padding ids, the chat template.
func TestGGUFByteLevelBPE(t *testing.T) {
	zf, err := os.Open(shared.Path(t, "qwen3-tokenizer", "tokenizer.json.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer zf.Close()
	zr, err := gzip.NewReader(zf)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := os.ReadFile(shared.Path(t, "qwen3-tokenizer", "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(cb, &cfg); err != nil {
		t.Fatal(err)
	}
	var tj struct {
		Model struct {
			Vocab  map[string]int    `json:"vocab"`
			Merges []json.RawMessage `json:"merges"`
		} `json:"model"`
		Added []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
			Special bool   `json:"special"`
		} `json:"added_tokens"`
	}
	if err := json.Unmarshal(raw, &tj); err != nil {
		t.Fatal(err)
	}
	const vocab = 151936 // Qwen3's vocab_size: more rows than tokens
	d := descForTokenizer("qwen3")
	kvs, warn, err := convertTokenizer(raw, cfg, d, vocab)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]any{}
	for _, x := range kvs {
		m[x.Key] = x.Value
	}
	if m["tokenizer.ggml.model"] != "gpt2" || m["tokenizer.ggml.pre"] != "qwen2" {
		t.Errorf("model %v pre %v, want gpt2 qwen2", m["tokenizer.ggml.model"], m["tokenizer.ggml.pre"])
	}
	toks := m["tokenizer.ggml.tokens"].([]string)
	types := m["tokenizer.ggml.token_type"].([]int32)
	if len(toks) != vocab || len(types) != vocab {
		t.Fatalf("%d tokens %d types, want %d", len(toks), len(types), vocab)
	}
	for s, id := range tj.Model.Vocab {
		if toks[id] != s || types[id] != 1 {
			t.Fatalf("token %d: %q type %d, want %q NORMAL", id, toks[id], types[id], s)
		}
	}
	maxID := 0
	for _, a := range tj.Added {
		maxID = max(maxID, a.ID)
		wt := int32(4)
		if a.Special {
			wt = 3
		}
		if toks[a.ID] != a.Content || types[a.ID] != wt {
			t.Errorf("added token %d: %q type %d, want %q type %d", a.ID, toks[a.ID], types[a.ID], a.Content, wt)
		}
	}
	if toks[vocab-1] != "[PAD151935]" || types[vocab-1] != 5 || len(warn) == 0 {
		t.Errorf("padding row: %q type %d, warnings %v", toks[vocab-1], types[vocab-1], warn)
	}
	merges := m["tokenizer.ggml.merges"].([]string)
	if len(merges) != len(tj.Model.Merges) {
		t.Fatalf("%d merges, want %d", len(merges), len(tj.Model.Merges))
	}
	for i, r := range tj.Model.Merges {
		var p []string
		var s string
		if json.Unmarshal(r, &s) != nil {
			json.Unmarshal(r, &p)
			s = strings.Join(p, " ")
		}
		if merges[i] != s {
			t.Fatalf("merge %d: %q, want %q", i, merges[i], s)
		}
	}
	var eosTok string
	json.Unmarshal(cfg["eos_token"], &eosTok)
	if id := int(m["tokenizer.ggml.eos_token_id"].(uint32)); toks[id] != eosTok {
		t.Errorf("eos id %d is %q, tokenizer_config.json eos_token %q", id, toks[id], eosTok)
	}
	var tmpl string
	json.Unmarshal(cfg["chat_template"], &tmpl)
	if m["tokenizer.chat_template"] != tmpl || tmpl == "" {
		t.Errorf("chat_template not copied (%d chars in tokenizer_config.json)", len(tmpl))
	}
	if _, ok := m["tokenizer.ggml.scores"]; ok {
		t.Error("gpt2 tokenizer with scores")
	}
}
