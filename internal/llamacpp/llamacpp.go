// Package llamacpp runs GGUF files through llama.cpp, the real consumer of
// lmpack's GGUF export, for tests. llama.cpp comes as the node-llama-cpp
// npm package (pinned 3.21.1 with its prebuilt linux-x64 CPU binary in
// test/llamacpp/package-lock.json; .ci/run installs it with `npm ci`),
// driven by the script test/llamacpp/run.mjs, which reads the jobs (GGUF
// files and their requests) as JSON on stdin and prints one JSON result
// per job (see Job, Request and Output).
//
// Tests get a Runner from Require, which skips the test, naming what is
// missing, when node or test/llamacpp/node_modules is absent, and fails it
// instead when LMPACK_REQUIRE_LLAMACPP=1 (set by .ci/run, so that CI cannot
// pass without running llama.cpp).
package llamacpp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"testing"
)

// RequireEnv is the environment variable that turns Require's skip into a
// failure when set to "1".
const RequireEnv = "LMPACK_REQUIRE_LLAMACPP"

// Runner runs test/llamacpp/run.mjs with node.
type Runner struct {
	// Node is the node executable's path.
	Node string
	// Dir is the absolute path of test/llamacpp (run.mjs and node_modules).
	Dir string
	// Threads is the CPU thread count llama.cpp uses (>= 1).
	Threads int
}

// Dir returns the absolute path of the repository's test/llamacpp folder,
// found from this source file's location.
func Dir() string {
	_, file, _, _ := goruntime.Caller(0)
	repo := filepath.Dir(filepath.Dir(filepath.Dir(file)))
	return filepath.Join(repo, "test", "llamacpp")
}

// Find returns a Runner when node is on $PATH and test/llamacpp holds
// run.mjs and the installed node-llama-cpp package with its linux-x64
// binary; otherwise an error naming what is missing and how to install it.
func Find() (*Runner, error) {
	dir := Dir()
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("llama.cpp tests need node (Node.js >= 20) on $PATH: %v", err)
	}
	for _, rel := range []string{
		"run.mjs",
		filepath.Join("node_modules", "node-llama-cpp", "package.json"),
		filepath.Join("node_modules", "@node-llama-cpp", "linux-x64", "package.json"),
	} {
		if _, err := os.Stat(filepath.Join(dir, rel)); err != nil {
			return nil, fmt.Errorf("llama.cpp tests need %s: run `npm ci` in %s (installs node-llama-cpp 3.21.1 and its prebuilt CPU binary): %v",
				filepath.Join(dir, rel), dir, err)
		}
	}
	return &Runner{Node: node, Dir: dir, Threads: 1}, nil
}

// Require returns a Runner, or skips tb with Find's message; with
// LMPACK_REQUIRE_LLAMACPP=1 it fails tb instead of skipping.
func Require(tb testing.TB) *Runner {
	tb.Helper()
	r, err := Find()
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			tb.Fatalf("%v (%s=1: llama.cpp must run here)", err, RequireEnv)
		}
		tb.Skipf("%v (set %s=1 to make this a failure)", err, RequireEnv)
	}
	return r
}

// Request is one item of a run: either a greedy decode (Generate > 0) of
// Prompt (tokenized by llama.cpp from the GGUF's tokenizer metadata, BOS
// prepended when tokenizer.ggml.add_bos_token is true) or of Tokens (ids
// used as given), or, with Score, the teacher-forced probabilities of
// Tokens[1:] (one perplexity window).
type Request struct {
	// Prompt is the text to tokenize, or Tokens the ids to use.
	Prompt string `json:"prompt,omitempty"`
	Tokens []int  `json:"tokens,omitempty"`
	// Generate is the number of greedy tokens to decode (0 with Score).
	Generate int `json:"generate,omitempty"`
	// Probs asks for the next-token distribution before each generated
	// token.
	Probs bool `json:"probs,omitempty"`
	// Score asks for TargetProbs over Tokens instead of a decode.
	Score bool `json:"score,omitempty"`
	// Special makes llama.cpp parse special-token text in Prompt
	// ("<|im_start|>") as those tokens, as Hugging Face tokenizers do.
	Special bool `json:"special,omitempty"`
}

// Result is llama.cpp's answer to one Request.
type Result struct {
	// PromptIDs is the prompt as llama.cpp evaluated it (BOS included).
	PromptIDs []int `json:"prompt_ids"`
	// IDs are the generated token ids, Text their detokenization after
	// the prompt.
	IDs  []int  `json:"ids"`
	Text string `json:"text"`
	// Probs is [Generate][vocab]: Probs[k] is the softmax (float32, from
	// llama.cpp's raw logits) of the distribution IDs[k] was chosen from.
	Probs [][]float64 `json:"probs"`
	// TargetProbs is [len(Tokens)-1]: the probability of Tokens[t+1]
	// after Tokens[0..t].
	TargetProbs []float64 `json:"target_probs"`
}

// ModelInfo is what llama.cpp read from the GGUF's metadata.
type ModelInfo struct {
	// BOS and EOS are the token ids (nil when the file names none).
	BOS *int `json:"bos"`
	EOS *int `json:"eos"`
	// AddBOS is tokenizer.ggml.add_bos_token as llama.cpp applies it.
	AddBOS bool `json:"add_bos"`
	// NVocab is the number of tokenizer.ggml.tokens (llama.cpp's n_vocab,
	// the length of every distribution).
	NVocab int `json:"n_vocab"`
	// VocabType is llama.cpp's tokenizer kind ("spm", "bpe", ...).
	VocabType string `json:"vocab_type"`
	// TrainContext is <arch>.context_length; ContextSize the KV cache
	// length in tokens llama.cpp created.
	TrainContext int `json:"train_context"`
	ContextSize  int `json:"context_size"`
}

// Output is one run's result: Results in the order of the requests, and
// llama.cpp's log lines of level warn and above.
type Output struct {
	Model   ModelInfo `json:"model"`
	Results []Result  `json:"results"`
	Logs    []string  `json:"logs"`
}

// Job is one GGUF file and the requests to answer with it, in a KV cache
// of ContextSize tokens.
type Job struct {
	Model       string    `json:"model"`
	ContextSize int       `json:"context_size"`
	Requests    []Request `json:"requests"`
}

// Run loads the GGUF file gguf in llama.cpp (CPU, F32 KV cache of
// contextSize tokens) and answers reqs in order (RunJobs with one job).
func (r *Runner) Run(ctx context.Context, gguf string, contextSize int, reqs []Request) (*Output, error) {
	outs, err := r.RunJobs(ctx, []Job{{Model: gguf, ContextSize: contextSize, Requests: reqs}})
	if err != nil {
		return nil, err
	}
	return outs[0], nil
}

// RunJobs runs the jobs in order in one node process (llama.cpp's binary
// loaded once, each file loaded, answered and released in turn) and
// returns one Output per job. Errors: llama.cpp refusing a file (the error
// carries node-llama-cpp's reason and llama.cpp's log), a malformed
// request, result counts that do not match.
func (r *Runner) RunJobs(ctx context.Context, jobs []Job) ([]*Output, error) {
	in, err := json.Marshal(map[string]any{"threads": r.Threads, "jobs": jobs})
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, r.Node, filepath.Join(r.Dir, "run.mjs"))
	cmd.Dir = r.Dir
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("llamacpp: %v\n%s", err, stderr.String())
	}
	var out struct {
		Jobs []*Output `json:"jobs"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		return nil, fmt.Errorf("llamacpp: bad JSON from run.mjs: %v\n%s", err, stderr.String())
	}
	if len(out.Jobs) != len(jobs) {
		return nil, fmt.Errorf("llamacpp: %d results for %d jobs", len(out.Jobs), len(jobs))
	}
	for i, o := range out.Jobs {
		if len(o.Results) != len(jobs[i].Requests) {
			return nil, fmt.Errorf("llamacpp: %s: %d results for %d requests", jobs[i].Model, len(o.Results), len(jobs[i].Requests))
		}
	}
	return out.Jobs, nil
}

// LogProbs returns log(p) for each probability in float64 (−Inf for 0).
func LogProbs(p []float64) []float64 {
	out := make([]float64, len(p))
	for i, v := range p {
		out[i] = math.Log(v)
	}
	return out
}
