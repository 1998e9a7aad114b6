package main

// End-to-end tests of the lmpack command: TestMain builds the binary once
// and every test runs it with os/exec, checking the exit code, stdout and
// stderr. Model and text come from the shared data folder (through
// internal/shared, so a missing file fails the test by name).
//
// Reference values are those of stories260K-hf/SOURCE.md (llama2.c run.c
// and an independent numpy forward), not outputs of this code.
//
// In -short mode only the full-file perplexity run (~1 minute on 2 cores)
// is skipped; the 8-window acceptance run and everything else still run.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
)

// testVersion is stamped into the test binary with -ldflags, the way
// releases set main.version.
const testVersion = "9.8.7-clitest"

// lmpackBin is the path of the binary built by TestMain.
var lmpackBin string

func TestMain(m *testing.M) { os.Exit(testMain(m)) }

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "lmpack-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "cli_test:", err)
		return 2
	}
	defer os.RemoveAll(dir)
	lmpackBin = filepath.Join(dir, "lmpack")
	build := exec.Command("go", "build", "-ldflags=-X main.version="+testVersion, "-o", lmpackBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "cli_test: building lmpack:", err)
		return 2
	}
	return m.Run()
}

// cliResult is one finished run of the binary.
type cliResult struct {
	args   []string
	code   int
	stdout string
	stderr string
}

func (r cliResult) String() string {
	return fmt.Sprintf("lmpack %s\nexit %d\n--- stdout:\n%s\n--- stderr:\n%s", strings.Join(r.args, " "), r.code, abbrev(r.stdout), abbrev(r.stderr))
}

func abbrev(s string) string {
	if len(s) > 3000 {
		return s[:1500] + "\n[...]\n" + s[len(s)-1500:]
	}
	return s
}

// isolatedEnv is the environment of the parent without any Hugging Face
// variable, plus an empty private hub cache and offline mode, so that no
// run can reach the network or a real cache. extra entries ("K=V") are
// appended (later entries win).
func isolatedEnv(t *testing.T, extra ...string) []string {
	t.Helper()
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "HF_") || strings.HasPrefix(kv, "HUGGINGFACE_") || strings.HasPrefix(kv, "XDG_CACHE_HOME=") {
			continue
		}
		env = append(env, kv)
	}
	home := t.TempDir()
	env = append(env, "HF_HOME="+home, "HF_HUB_CACHE="+filepath.Join(home, "hub"), "HF_HUB_OFFLINE=1")
	return append(env, extra...)
}

// lmpack runs the binary with args in env (nil: isolatedEnv) and waits for
// it. There is no time limit of its own: the process is killed only
// shortly before go test -timeout would end the test binary (t.Deadline),
// so that the failure names the command instead of leaving it running.
// It fails the test when the process cannot be started or is killed so.
func lmpack(t *testing.T, env []string, args ...string) cliResult {
	t.Helper()
	if env == nil {
		env = isolatedEnv(t)
	}
	ctx := context.Background()
	if dl, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl.Add(-5*time.Second))
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, lmpackBin, args...)
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := cliResult{args: args, stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("killed just before the go test -timeout deadline:\n%v", r)
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("lmpack %v: %v", args, err)
	}
	checkNoPanic(t, r)
	return r
}

// checkNoPanic fails the test when stderr shows a Go panic or a goroutine
// dump.
func checkNoPanic(t *testing.T, r cliResult) {
	t.Helper()
	if strings.Contains(r.stderr, "panic:") || strings.Contains(r.stderr, "goroutine ") {
		t.Errorf("Go panic in stderr:\n%v", r)
	}
}

// wantOK fails the test unless r exited 0.
func wantOK(t *testing.T, r cliResult) {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("want exit 0:\n%v", r)
	}
}

// wantError checks a failed run: exit status 1, nothing on stdout, and
// stderr made of one "lmpack: ..." error line (after any log lines)
// containing every string in want.
func wantError(t *testing.T, r cliResult, want ...string) {
	t.Helper()
	if r.code != 1 {
		t.Errorf("exit %d, want 1:\n%v", r.code, r)
	}
	if r.stdout != "" {
		t.Errorf("stdout not empty on error:\n%v", r)
	}
	lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
	last := lines[len(lines)-1]
	t.Logf("%s", last)
	if !strings.HasPrefix(last, "lmpack: ") {
		t.Errorf("last stderr line %q does not start with \"lmpack: \":\n%v", last, r)
	}
	for _, w := range want {
		if !strings.Contains(last, w) {
			t.Errorf("error line lacks %q:\n%s", w, last)
		}
	}
}

// modelDir is the shared stories260K Hugging Face directory.
func modelDir(t *testing.T) string {
	t.Helper()
	shared.Path(t, "stories260K-hf", "model.safetensors")
	shared.Path(t, "stories260K-hf", "tokenizer.json")
	shared.Path(t, "stories260K-hf", "config.json")
	return shared.Path(t, "stories260K-hf")
}

// valText is the TinyStories validation excerpt.
func valText(t *testing.T) string {
	t.Helper()
	return shared.Path(t, "tinystories-valid", "tinystories_val.txt")
}

// evalJSON is `lmpack eval --json` output; pointers tell absent keys.
type evalJSON struct {
	Perplexity      *float64 `json:"perplexity"`
	NLL             *float64 `json:"nll"`
	TokensScored    *int     `json:"tokens_scored"`
	TokensPerSecond *float64 `json:"tokens_per_second"`
	Windows         *int     `json:"windows"`
	Ctx             *int     `json:"ctx"`
}

// decodeOneJSON decodes stdout as exactly one JSON value into v.
func decodeOneJSON(t *testing.T, stdout string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(stdout))
	if err := dec.Decode(v); err != nil {
		t.Fatalf("stdout is not a JSON object: %v\n%s", err, stdout)
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); err == nil {
		t.Fatalf("stdout holds more than one JSON value:\n%s", stdout)
	}
}

// referenceWindows derives from the reference token file (BOS + the whole
// text, uint16 LE) how many 512-token windows and scored tokens the
// perplexity protocol gives.
func referenceWindows(t *testing.T, ctx int) (windows int) {
	t.Helper()
	st, err := os.Stat(shared.Path(t, "stories260K-hf", "reference", "tinystories_val.tok512.u16"))
	if err != nil {
		t.Fatal(err)
	}
	return int(st.Size()/2) / ctx
}

func checkEval(t *testing.T, r cliResult, wantPPL, tol float64, wantWindows, ctx int) {
	t.Helper()
	wantOK(t, r)
	var keys map[string]json.RawMessage
	decodeOneJSON(t, r.stdout, &keys)
	for _, k := range []string{"perplexity", "nll", "tokens_scored", "tokens_per_second"} {
		if _, ok := keys[k]; !ok {
			t.Errorf("JSON lacks key %q: %s", k, r.stdout)
		}
	}
	var e evalJSON
	decodeOneJSON(t, r.stdout, &e)
	if e.Perplexity == nil || e.NLL == nil || e.TokensScored == nil || e.TokensPerSecond == nil {
		t.Fatalf("missing fields: %s", r.stdout)
	}
	if math.Abs(*e.Perplexity-wantPPL) > tol {
		t.Errorf("perplexity %.6f, want %.5f ± %g", *e.Perplexity, wantPPL, tol)
	}
	if got := math.Exp(*e.NLL); math.Abs(got-*e.Perplexity) > 1e-9**e.Perplexity {
		t.Errorf("exp(nll) = %.9f, perplexity %.9f: inconsistent", got, *e.Perplexity)
	}
	if want := wantWindows * (ctx - 1); *e.TokensScored != want {
		t.Errorf("tokens_scored %d, want %d (%d windows x %d)", *e.TokensScored, want, wantWindows, ctx-1)
	}
	if e.Windows != nil && *e.Windows != wantWindows {
		t.Errorf("windows %d, want %d", *e.Windows, wantWindows)
	}
	if !(*e.TokensPerSecond > 0) || math.IsInf(*e.TokensPerSecond, 0) {
		t.Errorf("tokens_per_second %v, want a positive number", *e.TokensPerSecond)
	}
}

// TestEvalAcceptance8Windows: first 8 windows of 512 tokens, reference PPL
// 3.76833 over 4,088 scored tokens (SOURCE.md).
func TestEvalAcceptance8Windows(t *testing.T) {
	t.Parallel()
	r := lmpack(t, nil, "eval", modelDir(t), "--data", valText(t), "--ctx", "512", "--max-windows", "8", "--json")
	checkEval(t, r, 3.76833, 0.0005, 8, 512)
	var e evalJSON
	decodeOneJSON(t, r.stdout, &e)
	if *e.TokensScored != 4088 {
		t.Errorf("tokens_scored %d, want 4088", *e.TokensScored)
	}

	// The text form reports the same numbers.
	r = lmpack(t, nil, "eval", modelDir(t), "--data", valText(t), "--ctx", "512", "--max-windows", "8")
	wantOK(t, r)
	m := regexp.MustCompile(`^perplexity (\d+\.\d{4})  nll (\d+\.\d+)  tokens scored (\d+)  windows 8 x 512  \d+\.\d tokens/s\n$`).FindStringSubmatch(r.stdout)
	if m == nil {
		t.Fatalf("text output not in the expected form:\n%v", r)
	}
	if m[1] != fmt.Sprintf("%.4f", *e.Perplexity) || m[3] != "4088" {
		t.Errorf("text output %q disagrees with JSON %+v", r.stdout, e)
	}
}

// TestEvalAcceptanceFullFile: all 767 windows, reference PPL 5.04816 over
// 391,937 scored tokens. Skipped with -short (about a minute on 2 cores).
func TestEvalAcceptanceFullFile(t *testing.T) {
	if testing.Short() {
		t.Skip("full-file perplexity (~1 min on 2 cores) skipped in -short mode; TestEvalAcceptance8Windows still runs")
	}
	t.Parallel()
	windows := referenceWindows(t, 512)
	if windows != 767 {
		t.Fatalf("reference token file gives %d windows, SOURCE.md says 767", windows)
	}
	r := lmpack(t, nil, "eval", modelDir(t), "--data", valText(t), "--ctx", "512", "--json")
	checkEval(t, r, 5.04816, 0.001, windows, 512)
	var e evalJSON
	decodeOneJSON(t, r.stdout, &e)
	if *e.TokensScored != 391937 {
		t.Errorf("tokens_scored %d, want 391937", *e.TokensScored)
	}
	if math.Abs(*e.NLL-1.619025) > 2e-4 {
		t.Errorf("nll %.6f, want 1.619025", *e.NLL)
	}
	// Non-terminal stderr gets coarse progress log lines ending at 100%.
	if !strings.Contains(r.stderr, fmt.Sprintf("windows_done=%d windows=%d", windows, windows)) {
		t.Errorf("no final progress line in stderr:\n%s", abbrev(r.stderr))
	}
}

type greedyRef struct {
	PromptIDs    []int  `json:"prompt_ids"`
	GeneratedIDs []int  `json:"generated_ids"`
	Text         string `json:"text"`
}

func loadGreedyRef(t *testing.T) greedyRef {
	t.Helper()
	b, err := os.ReadFile(shared.Path(t, "stories260K-hf", "reference", "greedy_from_bos.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g greedyRef
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.GeneratedIDs) != 256 || g.Text == "" {
		t.Fatalf("greedy_from_bos.json: %d ids, text %d bytes; want 256 ids and text", len(g.GeneratedIDs), len(g.Text))
	}
	return g
}

// TestRunGreedyFromBOS: temperature 0 from BOS reproduces run.c's 256
// greedy tokens, as text.
func TestRunGreedyFromBOS(t *testing.T) {
	t.Parallel()
	ref := loadGreedyRef(t)
	r := lmpack(t, nil, "run", modelDir(t), "--temperature", "0", "--max-tokens", "256")
	wantOK(t, r)
	if r.stdout != ref.Text+"\n" {
		t.Errorf("greedy text differs from reference\n got: %q\nwant: %q", r.stdout, ref.Text+"\n")
	}
	if !strings.Contains(r.stderr, "prompt_tokens=1 generated_tokens=256") {
		t.Errorf("stderr lacks the generation summary:\n%s", r.stderr)
	}
}

// TestRunEchoAndLeadingSpace: greedy text after a prompt keeps the first
// generated token's leading space, and --echo prints the prompt before
// exactly that text.
func TestRunEchoAndLeadingSpace(t *testing.T) {
	t.Parallel()
	const prompt = "Once upon a time,"
	args := []string{"run", modelDir(t), "--prompt", prompt, "--temperature", "0", "--max-tokens", "12"}
	plain := lmpack(t, nil, args...)
	wantOK(t, plain)
	if !strings.HasPrefix(plain.stdout, " there") {
		t.Errorf("continuation %q: want the leading space of \" there\" kept", plain.stdout)
	}
	echo := lmpack(t, nil, append(args, "--echo")...)
	wantOK(t, echo)
	if echo.stdout != prompt+plain.stdout {
		t.Errorf("--echo printed %q, want %q", echo.stdout, prompt+plain.stdout)
	}
}

// TestRunSamplingSeeds: sampling is reproducible for a seed, differs
// between seeds and from greedy decoding.
func TestRunSamplingSeeds(t *testing.T) {
	t.Parallel()
	dir := modelDir(t)
	sample := func(seed string) string {
		r := lmpack(t, nil, "run", dir, "--temperature", "0.8", "--top-p", "0.9", "--seed", seed, "--max-tokens", "128")
		wantOK(t, r)
		if strings.TrimSpace(r.stdout) == "" {
			t.Fatalf("empty sample:\n%v", r)
		}
		return r.stdout
	}
	a, b, c := sample("7"), sample("7"), sample("8")
	if a != b {
		t.Errorf("seed 7 twice gave different text:\n%q\n%q", a, b)
	}
	if a == c {
		t.Errorf("seeds 7 and 8 gave the same text: %q", a)
	}
	greedy := loadGreedyRef(t).Text
	if strings.HasPrefix(greedy, strings.TrimSuffix(a, "\n")) {
		t.Errorf("sampled text is a prefix of the greedy text; sampling seems off: %q", a)
	}
}

// expectedParams computes stories260K's parameter count from the shapes
// listed in SOURCE.md: embedding 512x64, 5 layers of q 64x64, k 32x64,
// v 32x64, o 64x64, gate and up 172x64, down 64x172 and two norms of 64,
// and the final norm 64. The lm_head is a tied copy, not counted.
func expectedParams() int64 {
	const vocab, hidden, kv, inter, layers = 512, 64, 32, 172, 5
	perLayer := hidden*hidden + kv*hidden + kv*hidden + hidden*hidden + 2*inter*hidden + hidden*inter + 2*hidden
	return int64(vocab*hidden + layers*perLayer + hidden)
}

// fileTensorBytes sums the data bytes of every tensor in the safetensors
// file (lm_head included) and checks them against the file size.
func fileTensorBytes(t *testing.T, path string) int64 {
	t.Helper()
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n int64
	for _, ti := range f.Tensors() {
		if ti.DType != safetensors.F32 {
			t.Fatalf("%s: tensor %q is %s, want F32", path, ti.Name, ti.DType)
		}
		n += ti.End - ti.Begin
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if hdr := int64(binary.LittleEndian.Uint64(b)); 8+hdr+n != int64(len(b)) {
		t.Fatalf("%s: 8 + header %d + tensors %d != file size %d", path, hdr, n, len(b))
	}
	return n
}

func TestInspect(t *testing.T) {
	t.Parallel()
	dir := modelDir(t)
	params := expectedParams()
	if params != 260032 {
		t.Fatalf("parameter count from SOURCE.md shapes is %d, want 260032", params)
	}
	f32 := fileTensorBytes(t, shared.Path(t, "stories260K-hf", "model.safetensors"))

	r := lmpack(t, nil, "inspect", dir)
	wantOK(t, r)
	for _, re := range []string{
		`(?m)^architecture:\s+LlamaForCausalLM$`,
		fmt.Sprintf(`(?m)^parameters:\s+%d \(0\.26M\)$`, params),
		fmt.Sprintf(`(?m)^bytes:\s+%d total \(F32 %d\)$`, f32, f32),
		`(?m)^hidden_size:\s+64\s+vocab_size: 512\s+layers: 5\s+rope_theta: 10000\s+tied embeddings: true$`,
		`(?m)^layer 4: heads 8, kv heads 4, head_dim 8, intermediate 172, params 45440$`,
		`(?m)^\s+model\.layers\.2\.mlp\.down_proj\.weight\s+F32\s+\[64 172\]$`,
	} {
		if !regexp.MustCompile(re).MatchString(r.stdout) {
			t.Errorf("inspect output lacks %s:\n%s", re, r.stdout)
		}
	}

	r = lmpack(t, nil, "inspect", dir, "--json")
	wantOK(t, r)
	var rep struct {
		Architecture  string           `json:"architecture"`
		Params        int64            `json:"params"`
		BytesByDType  map[string]int64 `json:"bytes_by_dtype"`
		TotalBytes    int64            `json:"total_bytes"`
		NumLayers     int              `json:"num_hidden_layers"`
		TiedEmbedding bool             `json:"tie_word_embeddings"`
		Layers        []struct {
			Params  int64 `json:"params"`
			Tensors []struct {
				Name  string `json:"name"`
				Shape []int  `json:"shape"`
			} `json:"tensors"`
		} `json:"layers"`
	}
	decodeOneJSON(t, r.stdout, &rep)
	if rep.Architecture != "LlamaForCausalLM" || rep.Params != params || rep.BytesByDType["F32"] != f32 ||
		rep.TotalBytes != f32 || rep.NumLayers != 5 || !rep.TiedEmbedding || len(rep.Layers) != 5 {
		t.Errorf("inspect --json: %+v; want LlamaForCausalLM, %d params, F32 %d bytes, 5 layers, tied", rep, params, f32)
	}
	var sum int64
	for i, l := range rep.Layers {
		sum += l.Params
		if len(l.Tensors) != 9 {
			t.Errorf("layer %d: %d tensors, want 9", i, len(l.Tensors))
		}
	}
	if want := params - 512*64 - 64; sum != want {
		t.Errorf("layer params sum %d, want %d", sum, want)
	}
}

func TestVersion(t *testing.T) {
	t.Parallel()
	r := lmpack(t, nil, "--version")
	wantOK(t, r)
	if want := "lmpack version " + testVersion + "\n"; r.stdout != want {
		t.Errorf("--version printed %q, want %q", r.stdout, want)
	}
}

// jsonLogLines parses every stderr line as a JSON object with time, level
// and msg, and returns them.
func jsonLogLines(t *testing.T, stderr string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(stderr))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Errorf("stderr line is not JSON: %q", sc.Text())
			continue
		}
		for _, k := range []string{"time", "level", "msg"} {
			if _, ok := m[k]; !ok {
				t.Errorf("log line lacks %q: %s", k, sc.Text())
			}
		}
		out = append(out, m)
	}
	return out
}

func findLog(lines []map[string]any, msg string) map[string]any {
	for _, m := range lines {
		if m["msg"] == msg {
			return m
		}
	}
	return nil
}

func TestLogFormatJSON(t *testing.T) {
	t.Parallel()
	dir := modelDir(t)
	r := lmpack(t, nil, "--log-format", "json", "run", dir, "--temperature", "0", "--max-tokens", "12")
	wantOK(t, r)
	lines := jsonLogLines(t, r.stderr)
	done := findLog(lines, "generation done")
	if done == nil || done["generated_tokens"] != 12.0 || done["prompt_tokens"] != 1.0 {
		t.Errorf("no \"generation done\" line with 12 generated tokens in %v", lines)
	}
	if l := findLog(lines, "model loaded"); l == nil || l["architecture"] != "LlamaForCausalLM" {
		t.Errorf("no \"model loaded\" line naming the architecture in %v", lines)
	}
	if ref := loadGreedyRef(t).Text; !strings.HasPrefix(ref, strings.TrimSuffix(r.stdout, "\n")) || len(r.stdout) < 20 {
		t.Errorf("12 greedy tokens %q are not a prefix of the reference text", r.stdout)
	}

	// The flag also works after the subcommand, and for eval's progress.
	r = lmpack(t, nil, "eval", dir, "--data", valText(t), "--max-windows", "2", "--ctx", "64", "--log-format", "json")
	wantOK(t, r)
	lines = jsonLogLines(t, r.stderr)
	if p := findLog(lines, "eval progress"); p == nil || p["windows"] != 2.0 {
		t.Errorf("no eval progress line in %v", lines)
	}

	// The default text format is logfmt-like, not JSON.
	r = lmpack(t, nil, "run", dir, "--temperature", "0", "--max-tokens", "4")
	wantOK(t, r)
	if !regexp.MustCompile(`(?m)^time=\S+ level=INFO msg="generation done"`).MatchString(r.stderr) {
		t.Errorf("text log lines not in the expected form:\n%s", r.stderr)
	}
}

// syncBuffer is a bytes.Buffer safe for a writer goroutine and a reader.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestInterrupt: SIGINT (SIGTERM) during a full-file eval stops it within a
// few seconds with exit status 130 (143) and "interrupted", without a panic.
func TestInterrupt(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		sig  syscall.Signal
		code int
		text string
	}{{syscall.SIGINT, 130, "interrupt"}, {syscall.SIGTERM, 143, "terminated"}} {
		t.Run(c.text, func(t *testing.T) { testInterrupt(t, c.sig, c.code, c.text) })
	}
}

func testInterrupt(t *testing.T, sig syscall.Signal, code int, text string) {
	cmd := exec.Command(lmpackBin, "eval", modelDir(t), "--data", valText(t), "--ctx", "512", "--json")
	cmd.Env = isolatedEnv(t)
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	exited := false
	t.Cleanup(func() {
		if !exited {
			cmd.Process.Kill()
			<-done
		}
	})

	// Wait until the model is loaded and windows are being evaluated (no
	// time limit: the line comes or the process ends).
	for !strings.Contains(stderr.String(), "model loaded") {
		select {
		case err := <-done:
			exited = true
			t.Fatalf("eval ended before the interrupt (%v); stderr:\n%s", err, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	time.Sleep(300 * time.Millisecond)
	if err := cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	sent := time.Now()
	// No time limit: an eval that ignored the signal would run to its end
	// and exit 0 with a result, which the checks below refuse.
	err := <-done
	exited = true
	t.Logf("exited %v after SIGINT", time.Since(sent).Round(time.Millisecond))
	r := cliResult{args: cmd.Args[1:], stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("want a non-zero exit after SIGINT, got %v:\n%v", err, r)
	}
	r.code = ee.ExitCode()
	checkNoPanic(t, r)
	if r.code != code {
		t.Errorf("exit %d after %v, want %d:\n%v", r.code, sig, code, r)
	}
	if want := "lmpack: interrupted (" + text + ")\n"; !strings.HasSuffix(r.stderr, want) {
		t.Errorf("stderr does not end with %q:\n%v", want, r)
	}
	if r.stdout != "" {
		t.Errorf("interrupted eval printed a result:\n%v", r)
	}
}

// TestConcurrentRuns runs several decoders as separate processes, each
// with more pool threads than there are cores, so the OS deschedules pool
// dispatchers and workers mid-handshake. Before the pool's stale wake-up
// fix this crashed (nil task on a worker) in most of the first few runs;
// every run must exit 0 with the same text as its seed's first run.
func TestConcurrentRuns(t *testing.T) {
	t.Parallel()
	model := shared.Path(t, "stories260K-moe-hf")
	runs := 8
	if testing.Short() {
		runs = 3
	}
	var wg sync.WaitGroup
	for j := 0; j < 3; j++ {
		wg.Add(1)
		go func(j int) {
			defer wg.Done()
			first := ""
			for i := 0; i < runs; i++ {
				r := lmpack(t, nil, "run", model, "--max-tokens", "511", "--ignore-eos", "--seed", "3", "--threads", fmt.Sprint(2+(i+j)%4))
				if r.code != 0 {
					t.Errorf("process %d run %d: exit %d\n%v", j, i, r.code, r)
					return
				}
				if first == "" {
					first = r.stdout
				} else if r.stdout != first {
					t.Errorf("process %d run %d: output differs from run 0 with the same seed", j, i)
				}
			}
		}(j)
	}
	wg.Wait()
}
