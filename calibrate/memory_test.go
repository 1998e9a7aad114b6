package calibrate

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
)

// Sizes of the synthetic Llama checkpoints of the peak-RSS test and
// benchmark: large enough that the decoder blocks' weights dominate the
// process's memory (one block is rssLayerParams weights: 11.8 MB in
// float32, 5.9 MB in BF16).
const (
	rssHidden = 512  // hidden_size
	rssInter  = 1408 // intermediate_size
	rssHeads  = 8    // num_attention_heads (head_dim 64)
	rssKV     = 4    // num_key_value_heads (GQA groups of 2)
	rssVocab  = 512  // vocab_size: stories260K's tokenizer
	rssTokens = 64   // calibration tokens (one window)
)

// rssLayerParams is the number of weights of one decoder block of the
// synthetic checkpoint: q, k, v, o, gate, up and down (the two RMSNorm
// vectors add 2·hidden).
const rssLayerParams = rssHidden*rssHidden*2 + 2*rssHidden*(rssHidden/rssHeads*rssKV) + 3*rssHidden*rssInter + 2*rssHidden

// rssMarginBytes is what the peak-RSS test allows on top of one block's
// float32 weights for the memory that grows with the layer count besides
// the mapped file: the per-layer statistics (OSCAR's three [head_dim,
// head_dim] float64 matrices per KV head, 0.4 MB a layer, and the
// similarity states), their copies in the written calibration file, and
// the Go heap's slack around them.
const rssMarginBytes = 16 << 20

// writeRSSModel writes a Llama checkpoint of the rss* sizes with layers
// decoder blocks into dir: config.json, model.safetensors with random
// weights of dtype dt (BF16 or F16) drawn from a fixed seed (norms 1, the
// embedding uniform in [−1, 1), every matrix uniform in
// ±1/sqrt(in_features)), and stories260K's tokenizer files. It returns the
// size of model.safetensors in bytes.
func writeRSSModel(tb testing.TB, dir string, layers int, dt safetensors.DType) int64 {
	tb.Helper()
	cfg := map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama",
		"hidden_size": rssHidden, "intermediate_size": rssInter, "num_hidden_layers": layers,
		"num_attention_heads": rssHeads, "num_key_value_heads": rssKV, "vocab_size": rssVocab,
		"max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
		"tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": map[safetensors.DType]string{safetensors.BF16: "bfloat16", safetensors.F16: "float16"}[dt],
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	d, err := arch.Parse(raw)
	if err != nil {
		tb.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), raw, 0o644); err != nil {
		tb.Fatal(err)
	}
	shapes := d.TensorShapes()
	names := make([]string, 0, len(shapes))
	for n := range shapes {
		if n == d.LMHead && d.TieWordEmbeddings {
			continue
		}
		names = append(names, n)
	}
	slices.Sort(names)
	r := rand.New(rand.NewPCG(12, 0x5eed))
	var ws []safetensors.WriteTensor
	for _, name := range names {
		shape := shapes[name]
		n := 1
		for _, s := range shape {
			n *= s
		}
		scale := 1.0 // the embedding
		if len(shape) == 2 && name != d.Embedding {
			scale = 1 / float64(shape[1]) // a matrix: ±1/sqrt(in_features)
		}
		v := make([]float32, n)
		for i := range v {
			if len(shape) == 1 {
				v[i] = 1
				continue
			}
			v[i] = float32((2*r.Float64() - 1) * math.Sqrt(scale))
		}
		w, err := safetensors.FromFloat32As(name, dt, shape, v)
		if err != nil {
			tb.Fatal(err)
		}
		ws = append(ws, w)
	}
	path := filepath.Join(dir, "model.safetensors")
	if err := safetensors.WriteFile(path, ws, map[string]string{"format": "pt"}); err != nil {
		tb.Fatal(err)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"} {
		b, err := os.ReadFile(filepath.Join(shared.Path(tb, "stories260K-hf"), f))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			tb.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			tb.Fatal(err)
		}
	}
	st, err := os.Stat(path)
	if err != nil {
		tb.Fatal(err)
	}
	return st.Size()
}

// rssChildEnv names the environment variables that make
// TestCalibratePeakRSSChild calibrate a model in its own process: the
// model directory, the data file and the output file.
const (
	rssChildModel = "LMPACK_TEST_RSS_MODEL"
	rssChildData  = "LMPACK_TEST_RSS_DATA"
	rssChildOut   = "LMPACK_TEST_RSS_OUT"
)

// TestCalibratePeakRSSChild is the process peakRSS starts: with
// rssChildModel set it runs Run on that model (rssTokens tokens, one
// window, two threads) and prints the process's peak resident set size
// (VmHWM) as "peak-rss-bytes N". Without the variable it is skipped.
func TestCalibratePeakRSSChild(t *testing.T) {
	model := os.Getenv(rssChildModel)
	if model == "" {
		t.Skip("child process of TestCalibratePeakRSS (set " + rssChildModel + ")")
	}
	_, err := Run(context.Background(), Options{Model: model, Data: os.Getenv(rssChildData), Out: os.Getenv(rssChildOut),
		Tokens: rssTokens, Ctx: rssTokens, Threads: 2, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	hwm, err := vmHWM()
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("peak-rss-bytes %d\n", hwm)
}

// vmHWM returns the process's peak resident set size in bytes (VmHWM in
// /proc/self/status, Linux). Errors: the file unreadable (other systems)
// or without VmHWM.
func vmHWM() (int64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/self/status: VmHWM %q: %w", v, err)
			}
			return kb << 10, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("/proc/self/status: no VmHWM line")
}

// peakRSS calibrates the model in dir in a fresh process (this test
// binary running TestCalibratePeakRSSChild) and returns that process's
// peak resident set size in bytes. It skips where /proc/self/status has
// no VmHWM (not Linux).
func peakRSS(tb testing.TB, dir string) int64 {
	tb.Helper()
	if _, err := vmHWM(); err != nil {
		tb.Skipf("peak RSS needs /proc/self/status VmHWM (Linux): %v", err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCalibratePeakRSSChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), rssChildModel+"="+dir,
		rssChildData+"="+shared.Path(tb, "tinystories-valid", "calib.txt"),
		rssChildOut+"="+filepath.Join(tb.TempDir(), "calib.safetensors"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		tb.Fatalf("calibrating %s in a child process: %v\n%s", dir, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(line, "peak-rss-bytes "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				tb.Fatal(err)
			}
			return n
		}
	}
	tb.Fatalf("child process printed no peak-rss-bytes line:\n%s", out)
	return 0
}

// TestCalibratePeakRSS checks that calibrate's memory grows with the
// number of decoder blocks by the mapped checkpoint only: it calibrates
// BF16 and F16 checkpoints of 4 and 8 blocks (writeRSSModel), each in its
// own process, and requires the growth of the peak RSS from 4 to 8
// blocks, less the growth of the file (mapped, so resident once read),
// to stay below one block's float32 weights plus rssMarginBytes. A float32
// copy of every weight (the defect) grows it by four blocks' float32
// weights (47 MB).
func TestCalibratePeakRSS(t *testing.T) {
	if testing.Short() {
		t.Skip("writes and calibrates four checkpoints of 25–50 MB in child processes")
	}
	const n = 4
	layerF32 := int64(4 * rssLayerParams)
	for _, dt := range []safetensors.DType{safetensors.BF16, safetensors.F16} {
		t.Run(string(dt), func(t *testing.T) {
			var rss, size [2]int64
			for i, layers := range []int{n, 2 * n} {
				dir := filepath.Join(t.TempDir(), "model")
				size[i] = writeRSSModel(t, dir, layers, dt)
				rss[i] = peakRSS(t, dir)
				os.RemoveAll(dir)
			}
			growth, fileGrowth := rss[1]-rss[0], size[1]-size[0]
			t.Logf("%s: %d blocks: peak RSS %d B, file %d B; %d blocks: peak RSS %d B, file %d B; growth %d B beyond the file's %d B (bound %d B: one block in float32 %d B + margin %d B)",
				dt, n, rss[0], size[0], 2*n, rss[1], size[1], growth-fileGrowth, fileGrowth, layerF32+rssMarginBytes, layerF32, rssMarginBytes)
			if growth-fileGrowth >= layerF32+rssMarginBytes {
				t.Errorf("%s: peak RSS grew by %d B from %d to %d blocks, %d B beyond the mapped file's growth of %d B; want less than one block's float32 weights (%d B) + %d B",
					dt, growth, n, 2*n, growth-fileGrowth, fileGrowth, layerF32, rssMarginBytes)
			}
		})
	}
}

// BenchmarkCalibratePeakRSS reports the peak resident set size of `lmpack
// calibrate` (Run, in a fresh process) on BF16 checkpoints of 8 and 16
// decoder blocks (writeRSSModel): peak-RSS-bytes, file-bytes (the
// checkpoint, mapped) and peak-RSS-minus-file-bytes. From 8 to 16 blocks
// peak-RSS-minus-file-bytes should grow by less than one block's float32
// weights (4·rssLayerParams bytes).
func BenchmarkCalibratePeakRSS(b *testing.B) {
	for _, layers := range []int{8, 16} {
		b.Run(fmt.Sprintf("layers=%d", layers), func(b *testing.B) {
			dir := filepath.Join(b.TempDir(), "model")
			size := writeRSSModel(b, dir, layers, safetensors.BF16)
			var peak int64
			b.ResetTimer()
			for range b.N {
				peak = max(peak, peakRSS(b, dir))
			}
			b.ReportMetric(float64(peak), "peak-RSS-bytes")
			b.ReportMetric(float64(size), "file-bytes")
			b.ReportMetric(float64(peak-size), "peak-RSS-minus-file-bytes")
			b.ReportMetric(float64(4*rssLayerParams), "layer-f32-bytes")
		})
	}
}
