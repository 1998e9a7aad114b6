package eval

import (
	"bytes"
	"context"
	"image/png"
	"math"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// shiftCache marks a cache whose model output differs: the fake model
// below adds delta to the predicted token's logit when it runs on one.
type shiftCache struct {
	*runtime.F32Cache
	delta float32
}

type cacheAwareModel struct{ bigramModel }

func (m *cacheAwareModel) Forward(ctx context.Context, toks []int, c runtime.KVCache, logits []float32, all bool) error {
	V := m.d.VocabSize
	a := m.a
	if s, ok := c.(*shiftCache); ok {
		a += s.delta
	}
	for i, t := range toks {
		row := logits[i*V : (i+1)*V]
		clear(row)
		row[(t+1)%V] = a
	}
	c.Commit(len(toks))
	return nil
}

// TestCompareKVClosedForm: a method identical to the reference has KL 0,
// top-1 agreement 1 and ΔPPL 0; a method that raises the predicted logit
// from a to a+δ has the closed-form KL of two such distributions, and one
// that inverts it (a → −a) disagrees on the top-1 token everywhere.
func TestCompareKVClosedForm(t *testing.T) {
	const V, a = 8, float32(2)
	m := &cacheAwareModel{bigramModel{d: &arch.Description{VocabSize: V, Layers: []arch.Layer{{NumKVHeads: 1, HeadDim: 2}}}, a: a}}
	ids := make([]int, 40)
	for i := range ids {
		ids[i] = i % V
	}
	mk := func(delta float32) func(int) (runtime.KVCache, error) {
		return func(n int) (runtime.KVCache, error) {
			return &shiftCache{runtime.NewF32Cache([]int{2}, []int{2}, n), delta}, nil
		}
	}
	rep, err := CompareKV(context.Background(), m, ids, []KVMethod{
		{Name: "same", New: func(n int) (runtime.KVCache, error) { return runtime.NewF32Cache([]int{2}, []int{2}, n), nil }},
		{Name: "shift", New: mk(1)},
		{Name: "invert", New: mk(-2 * a)},
	}, KVCompareOptions{Ctx: 10, Buckets: []int{0, 4}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Windows != 4 || rep.TokensScored != 36 || len(rep.Rows) != 3 {
		t.Fatalf("report %+v", rep)
	}
	same, shift, inv := rep.Rows[0], rep.Rows[1], rep.Rows[2]
	if same.KL != 0 || same.Top1Agreement != 1 || same.DeltaPPL != 0 {
		t.Errorf("same: %+v", same)
	}
	// p: e^a at the predicted token, 1 elsewhere; q: e^(a+1).
	lp := func(x float64) (hit, miss float64) {
		z := math.Exp(x) + V - 1
		return x - math.Log(z), -math.Log(z)
	}
	ph, pm := lp(float64(a))
	qh, qm := lp(float64(a) + 1)
	want := math.Exp(ph)*(ph-qh) + (V-1)*math.Exp(pm)*(pm-qm)
	if math.Abs(shift.KL-want) > 1e-12 || shift.Top1Agreement != 1 {
		t.Errorf("shift: KL %.15g want %.15g, top1 %g", shift.KL, want, shift.Top1Agreement)
	}
	if shift.DeltaPPL >= 0 {
		t.Errorf("shift makes every (correct) prediction more likely: ΔPPL %g should be < 0", shift.DeltaPPL)
	}
	if inv.Top1Agreement != 0 || inv.DeltaPPL <= 0 {
		t.Errorf("invert: %+v", inv)
	}
	// Buckets [0,4) and [4,9): 4 and 5 positions per window.
	if b := shift.Buckets; len(b) != 2 || b[0].Positions != 16 || b[1].Positions != 20 || math.Abs(b[1].KL-want) > 1e-12 {
		t.Errorf("buckets %+v", b)
	}
	// 2 (K,V) × 10 tokens × kvDim 2 × 4 bytes = 160 bytes, 32 bits/element.
	if same.KVBytes != 160 || same.BitsPerElement != 32 {
		t.Errorf("bytes %d bits %g", same.KVBytes, same.BitsPerElement)
	}
}

func TestKVReportOutputs(t *testing.T) {
	r := &KVReport{Ctx: 512, Protocol: ProtocolDecode, Prompt: 16, Chunk: 1, ServingCtx: 32768, Windows: 2, TokensScored: 990, Rows: []KVRow{
		{KV: "fp32", Method: "fp32", BitsPerElement: 32, BitsServing: 32, KVBytes: 655360, Perplexity: 5.79, Top1Agreement: 1,
			Buckets: []Bucket{{From: 0, To: 64, Positions: 128, Top1Agreement: 1}}},
		{KV: "oscar2", Method: "oscar2", BitsPerElement: 2.25, BitsServing: 2.25, KVBytes: 46080, Perplexity: 6.1, DeltaPPL: 0.31, KL: 0.05, Top1Agreement: 0.9,
			Buckets: []Bucket{{From: 0, To: 64, Positions: 128, KL: 0.04, Top1Agreement: 0.93}}},
		{KV: "oscars2+w256,512", Method: "oscars2", BitsPerElement: 16, BitsServing: 2.5, KVBytes: 46080, Perplexity: 5.79, NothingQuantized: true,
			Buckets: []Bucket{{From: 0, To: 64, Positions: 128, Top1Agreement: 1}}},
	}}
	var tb, sb strings.Builder
	if err := r.WriteTable(&tb); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"protocol decode (prompt 16, chunk 1)", "bits@512", "bits@32768", "oscar2", "2.250", "46080", "+0.3100", "0.05000", "0.9000", "0-63", "0.04000 / 0.9300", "nothing quantised"} {
		if !strings.Contains(tb.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, tb.String())
		}
	}
	// Aligned columns: every column of the main table ends at the same
	// rune offset in the header and in each row (the old table padded
	// "ΔPPL" by bytes and names to 14 characters).
	lines := strings.Split(tb.String(), "\n")
	head := []rune(lines[1])
	var ends []int // rune offsets where the right-aligned header cells end
	for i := 1; i < len(head); i++ {
		if head[i-1] != ' ' && head[i] == ' ' && i > len("kv") {
			ends = append(ends, i)
		}
	}
	for _, l := range lines[2:5] {
		row := []rune(l)
		for _, e := range ends {
			if e > len(row) || row[e-1] == ' ' || (e < len(row) && row[e] != ' ') {
				t.Errorf("column ending at rune %d of the header is not aligned in\n%s\n%s", e, lines[1], l)
				break
			}
		}
	}
	if err := r.WriteSVG(&sb, "stories260K <ctx 512>"); err != nil {
		t.Fatal(err)
	}
	svg := sb.String()
	for _, want := range []string{"&lt;ctx 512&gt;", "KL (nats, log scale)", "ΔPPL", "bits per element at the evaluated ctx 512", "oscars2+w256,512 (nothing quantised)", `fill="white" stroke="#2ca02c"`} {
		if !strings.Contains(svg, want) {
			t.Errorf("svg lacks %q", want)
		}
	}
	// One marker per row in each of the two panels, plus one per method
	// in the legend.
	if n := strings.Count(svg, "<circle") + strings.Count(svg, "<rect x=") + strings.Count(svg, "<polygon"); !strings.HasPrefix(svg, "<svg") || n != 3*2+3 {
		t.Errorf("svg has %d markers, want 9:\n%s", n, svg)
	}
}

// TestKVLayerErrorsStories260K: with the real model, the fp32 method has
// zero error in every layer, and the per-layer logit error orders the
// quantizers by precision (int8 < int4 < int2-naive).
func TestKVLayerErrorsStories260K(t *testing.T) {
	dir := shared.Path(t, "stories260K-hf")
	d, err := arch.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	m, err := runtime.NewCPU().Load(context.Background(), d, ck, runtime.LoadOptions{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	layers := kvcache.LayersOf(d)
	var methods []KVMethod
	for _, name := range []string{"fp32", "int8", "int4", "int2-naive"} {
		name := name
		methods = append(methods, KVMethod{Name: name, New: func(n int) (runtime.KVCache, error) { return kvcache.New(name, layers, n, kvcache.Options{}) }})
	}
	ids := make([]int, 96)
	for i := range ids {
		ids[i] = (i*131 + 7) % d.VocabSize
	}
	ids[0] = 1
	rep, err := KVLayerErrors(context.Background(), m, ids, methods, 96)
	if err != nil {
		t.Fatal(err)
	}
	for l := range d.Layers {
		fp, i8, i4, i2 := rep.Errors[0][l], rep.Errors[1][l], rep.Errors[2][l], rep.Errors[3][l]
		if fp.LogitError != 0 || fp.OutputError != 0 {
			t.Errorf("layer %d: fp32 error %+v, want 0", l, fp)
		}
		if !(0 < i8.LogitError && i8.LogitError < i4.LogitError && i4.LogitError < i2.LogitError) {
			t.Errorf("layer %d: logit errors int8 %.3g int4 %.3g int2 %.3g not increasing", l, i8.LogitError, i4.LogitError, i2.LogitError)
		}
		if !(i8.OutputError < i4.OutputError && i4.OutputError < i2.OutputError) {
			t.Errorf("layer %d: output errors not increasing: %+v %+v %+v", l, i8, i4, i2)
		}
	}
	var sb strings.Builder
	if err := rep.WriteLayerTable(&sb); err != nil || !strings.Contains(sb.String(), "int2-naive") {
		t.Fatalf("table: %v\n%s", err, sb.String())
	}
}

func TestKVReportPNG(t *testing.T) {
	r := &KVReport{Rows: []KVRow{{KV: "fp32", BitsPerElement: 32, Perplexity: 5.8}, {KV: "oscar2", BitsPerElement: 6, Perplexity: 57}}}
	var b bytes.Buffer
	if err := r.WritePNG(&b, "test"); err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(&b)
	if err != nil {
		t.Fatal(err)
	}
	if sz := img.Bounds().Size(); sz.X != 640 || sz.Y != 400 {
		t.Fatalf("size %v", sz)
	}
	// The fp32 point (largest x, smallest y) is drawn in steelblue near the
	// lower right of the plot area.
	blue := 0
	for y := 200; y < 360; y++ {
		for x := 500; x < 620; x++ {
			if r, g, b, _ := img.At(x, y).RGBA(); r>>8 == 0x46 && g>>8 == 0x82 && b>>8 == 0xb4 {
				blue++
			}
		}
	}
	if blue < 40 {
		t.Fatalf("fp32 point not found (%d blue pixels)", blue)
	}
}
