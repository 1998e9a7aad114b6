// Package openaijs drives an OpenAI-compatible server (lmpack serve) with
// the official `openai` npm client, a real client that no one here wrote,
// for tests. The client comes pinned (openai 7.55.0) in
// test/openai/package-lock.json; .ci/run installs it with `npm ci`. The
// script test/openai/run.mjs reads the cases (see Case) as a JSON array on
// stdin and prints one JSON Result per case.
//
// Tests get a Runner from Require, which skips the test, naming what is
// missing, when node or test/openai/node_modules is absent, and fails it
// instead when LMPACK_REQUIRE_OPENAI=1 (set by .ci/run, so that CI cannot
// pass without running the client).
package openaijs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"testing"
)

// RequireEnv is the environment variable that turns Require's skip into a
// failure when set to "1".
const RequireEnv = "LMPACK_REQUIRE_OPENAI"

// Runner runs test/openai/run.mjs with node.
type Runner struct {
	// Node is the node executable's path.
	Node string
	// Dir is the absolute path of test/openai (run.mjs and node_modules).
	Dir string
}

// Dir returns the absolute path of the repository's test/openai folder,
// found from this source file's location.
func Dir() string {
	_, file, _, _ := goruntime.Caller(0)
	repo := filepath.Dir(filepath.Dir(filepath.Dir(file)))
	return filepath.Join(repo, "test", "openai")
}

// Find returns a Runner when node is on $PATH and test/openai holds run.mjs
// and the installed openai package; otherwise an error naming what is
// missing and how to install it.
func Find() (*Runner, error) {
	dir := Dir()
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("openai client tests need node (Node.js >= 20) on $PATH: %v", err)
	}
	for _, rel := range []string{
		"run.mjs",
		filepath.Join("node_modules", "openai", "package.json"),
	} {
		if _, err := os.Stat(filepath.Join(dir, rel)); err != nil {
			return nil, fmt.Errorf("openai client tests need %s: run `npm ci --ignore-scripts` in %s (installs the openai npm package pinned in package-lock.json): %v",
				filepath.Join(dir, rel), dir, err)
		}
	}
	return &Runner{Node: node, Dir: dir}, nil
}

// Require returns a Runner, or skips tb with Find's message; with
// LMPACK_REQUIRE_OPENAI=1 it fails tb instead of skipping.
func Require(tb testing.TB) *Runner {
	tb.Helper()
	r, err := Find()
	if err != nil {
		if os.Getenv(RequireEnv) == "1" {
			tb.Fatalf("%v (%s=1: the openai client must run here)", err, RequireEnv)
		}
		tb.Skipf("%v (set %s=1 to make this a failure)", err, RequireEnv)
	}
	return r
}

// Case is one call of the client.
type Case struct {
	// Name labels the case in results and test messages.
	Name string `json:"name"`
	// Kind picks the call: "completion" (completions.create), "chat"
	// (chat.completions.create), "completion_stream" and "chat_stream"
	// (the same with stream: true, every chunk collected), "models"
	// (models.list).
	Kind string `json:"kind"`
	// Params is the request body given to the client (model, prompt or
	// messages, max_tokens, ...); nil for "models".
	Params map[string]any `json:"params,omitempty"`
	// APIKey, when not empty, replaces the run's key for this case.
	APIKey string `json:"api_key,omitempty"`
}

// Error is an exception the client threw.
type Error struct {
	// Class is the error's constructor name ("BadRequestError", ...).
	Class   string `json:"class"`
	Message string `json:"message"`
	// BadRequest, Authentication and APIError are `instanceof` tests
	// against the client's BadRequestError, AuthenticationError and
	// APIError.
	BadRequest     bool `json:"bad_request"`
	Authentication bool `json:"authentication"`
	APIError       bool `json:"api_error"`
	// Status is the HTTP status; Type, Param and Code the fields of the
	// server's {"error": {...}} body as the client read them; Body that
	// object itself (APIError only).
	Status *int            `json:"status"`
	Type   *string         `json:"type"`
	Param  *string         `json:"param"`
	Code   json.RawMessage `json:"code"`
	Body   json.RawMessage `json:"body"`
}

// Result is the client's answer to one Case.
type Result struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	// OK: the call returned (Response or Chunks set); otherwise Error.
	OK bool `json:"ok"`
	// Response is the parsed response object (non-streaming kinds).
	Response json.RawMessage `json:"response"`
	// Chunks are the streamed chunks in arrival order (stream kinds).
	Chunks []json.RawMessage `json:"chunks"`
	Error  *Error            `json:"error"`
}

// Run runs cases in order in one node process against the server at
// baseURL (e.g. "http://127.0.0.1:8000/v1") with apiKey ("" sends the
// placeholder key "none"). Errors: node failing (its stderr is in the
// error), output that is not one result per case.
func (r *Runner) Run(ctx context.Context, baseURL, apiKey string, cases []Case) ([]Result, error) {
	in, err := json.Marshal(cases)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, r.Node, filepath.Join(r.Dir, "run.mjs"), "--url", baseURL)
	cmd.Dir = r.Dir
	cmd.Env = os.Environ()
	if apiKey != "" {
		cmd.Env = append(cmd.Env, "OPENAI_API_KEY="+apiKey)
	} else {
		cmd.Env = append(cmd.Env, "OPENAI_API_KEY=none")
	}
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("openaijs: %v\n%s", err, stderr.String())
	}
	var out []Result
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		return nil, fmt.Errorf("openaijs: bad JSON from run.mjs: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}
	if len(out) != len(cases) {
		return nil, fmt.Errorf("openaijs: %d results for %d cases", len(out), len(cases))
	}
	for i, o := range out {
		if o.Name != cases[i].Name {
			return nil, fmt.Errorf("openaijs: result %d is %q, want %q", i, o.Name, cases[i].Name)
		}
	}
	return out, nil
}
