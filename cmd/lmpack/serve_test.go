package main

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/lmpack/lmpack/internal/shared"
	"github.com/spf13/pflag"
)

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"4GiB": 4 << 30, "512MiB": 512 << 20, "1073741824": 1 << 30, "2GB": 2e9, "1.5KiB": 1536, "100 MiB": 100 << 20, "64B": 64,
	} {
		if got, err := parseBytes("--kv-memory", in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "0", "-1GiB", "4GiBs", "lots", "1e30"} {
		if _, err := parseBytes("--kv-memory", in); err == nil || !strings.Contains(err.Error(), "--kv-memory") {
			t.Errorf("parseBytes(%q): error %v, want one naming --kv-memory", in, err)
		}
	}
}

func TestReadAPIKeys(t *testing.T) {
	p := filepath.Join(t.TempDir(), "keys")
	os.WriteFile(p, []byte("  alpha \n\nbeta\r\n"), 0o600)
	keys, err := readAPIKeys(p)
	if err != nil || len(keys) != 2 || string(keys[0]) != "alpha" || string(keys[1]) != "beta" {
		t.Errorf("keys %q, %v", keys, err)
	}
	os.WriteFile(p, []byte("\n \n"), 0o600)
	if _, err := readAPIKeys(p); err == nil || !strings.Contains(err.Error(), "no key") {
		t.Errorf("empty key file: %v", err)
	}
	// Lines starting with # are comments.
	os.WriteFile(p, []byte("# keys of team A\nalpha\n  # old: beta\n"), 0o600)
	if keys, err := readAPIKeys(p); err != nil || len(keys) != 1 || string(keys[0]) != "alpha" {
		t.Errorf("comments: keys %q, %v; want [alpha]", keys, err)
	}
}

// TestServeFlagErrors: bad flags are refused before the model loads,
// naming the flag.
func TestServeFlagErrors(t *testing.T) {
	m := modelDir(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--kv-memory", "lots"}, "--kv-memory"},
		{[]string{"--port", "70000"}, "--port"},
		{[]string{"--kv-window", "64"}, "--kv-window"},
		{[]string{"--max-batch", "0"}, "--max-batch"},
		{[]string{"--max-queue", "-3"}, "--max-queue"},
		{[]string{"--shutdown-timeout", "0s"}, "--shutdown-timeout"},
		{[]string{"--device", "cuda"}, "--device cuda"},
		{[]string{"--api-key-file", filepath.Join(t.TempDir(), "missing")}, "--api-key-file"},
		{[]string{"--kv", "nosuch"}, "--kv nosuch"},
		{[]string{"--max-model-len", "100000"}, "--max-model-len 100000"},
		{[]string{"--device", "tpu"}, `--device "tpu": want auto, cpu or cuda`},
		{[]string{"--kv-window", "4,4"}, "--kv-window 4,4 without --kv"},
		{[]string{"--kv-block-tokens", "100000"}, "--kv-block-tokens 100000: larger than the max model length 512"},
		{[]string{"--kv-memory", "1"}, "--kv-memory 1 (1 bytes): smaller than the smallest request"},
		{[]string{"--kv", "int4", "--kv-memory", "1KiB"}, "--kv-memory 1KiB (1024 bytes): smaller than the smallest request"},
	} {
		wantError(t, lmpack(t, nil, append([]string{"serve", m}, tc.args...)...), tc.want)
	}
}

// startServeAddr starts lmpack serve with args on a free port and returns
// its address, once the "serving" log line names it.
func startServeAddr(t *testing.T, args ...string) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(lmpackBin, append([]string{"serve", "--port", "0", "--threads", "1"}, args...)...)
	cmd.Env = isolatedEnv(t)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	addrRE := regexp.MustCompile(`msg=serving addr=(\S+)`)
	sc := bufio.NewScanner(stderr)
	var log []string
	for sc.Scan() {
		log = append(log, sc.Text())
		if mm := addrRE.FindStringSubmatch(sc.Text()); mm != nil {
			go io.Copy(io.Discard, stderr)
			return mm[1], cmd
		}
	}
	t.Fatalf("lmpack serve %v: no serving line in the log:\n%s", args, strings.Join(log, "\n"))
	return "", nil
}

// complete posts a completion request and returns the choice's text.
func complete(t *testing.T, addr, body string) string {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var c struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || resp.StatusCode != 200 || len(c.Choices) != 1 {
		t.Fatalf("completion: %d %v %+v", resp.StatusCode, err, c)
	}
	return c.Choices[0].Text
}

const greedyBody = `{"prompt":"Once upon a time","max_tokens":24,"temperature":0}`

// TestServeEndToEnd: lmpack serve on stories260K answers a greedy
// completion with the text lmpack run generates, and SIGTERM exits 0.
func TestServeEndToEnd(t *testing.T) {
	m := modelDir(t)
	run := lmpack(t, nil, "run", m, "--prompt", "Once upon a time", "--max-tokens", "24", "--temperature", "0")
	wantOK(t, run)
	addr, cmd := startServeAddr(t, m, "--kv-memory", "16MiB")
	if got, want := complete(t, addr, greedyBody), strings.TrimSuffix(run.stdout, "\n"); got != want {
		t.Errorf("served text %q, lmpack run %q", got, want)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("after SIGTERM: %v, want exit 0", err)
	}
}

// TestServeKVSchemes: an oscar2 artifact serves with its own scheme (the
// greedy text lmpack run gives on it), the checkpoint with --kv oscar2
// --kv-rotations ROT gives the same text, and --kv on an artifact is
// refused.
func TestServeKVSchemes(t *testing.T) {
	dir := t.TempDir()
	calib, rot := filepath.Join(dir, "calib.st"), filepath.Join(dir, "rot.st")
	wantOK(t, lmpack(t, nil, "calibrate", modelDir(t), "--data", shared.Path(t, "tinystories-valid", "calib.txt"), "--tokens", "2048", "--ctx", "256", "-o", calib))
	wantOK(t, lmpack(t, nil, "quantize", "kv", modelDir(t), "--calib", calib, "-o", rot))
	art := packArtifact(t, "--kv-rotations", rot, "--kv-cache", "oscar2")
	run := lmpack(t, nil, "run", art, "--prompt", "Once upon a time", "--max-tokens", "24", "--temperature", "0")
	wantOK(t, run)
	addr, _ := startServeAddr(t, art, "--kv-memory", "16MiB")
	if got, want := complete(t, addr, greedyBody), strings.TrimSuffix(run.stdout, "\n"); got != want {
		t.Errorf("artifact served %q, lmpack run %q", got, want)
	}
	addr, _ = startServeAddr(t, modelDir(t), "--kv", "oscar2", "--kv-rotations", rot, "--kv-memory", "16MiB")
	if got, want := complete(t, addr, greedyBody), strings.TrimSuffix(run.stdout, "\n"); got != want {
		t.Errorf("checkpoint --kv oscar2 served %q, the artifact %q", got, want)
	}
	wantError(t, lmpack(t, nil, "serve", art, "--kv", "fp16"), "artifact", "own KV cache scheme")
	wantError(t, lmpack(t, nil, "serve", modelDir(t), "--kv", "oscar2"), "--kv oscar2 needs --kv-rotations")
}

// TestServeFlagsAreCLIOnly: every flag of serve is listed as CLI-only in
// recipes/README.md (serve has no recipe keys) and named in the README's
// Serving section.
func TestServeFlagsAreCLIOnly(t *testing.T) {
	recipes, err := os.ReadFile("../../recipes/README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(recipes), "`lmpack serve` is not a stage")
	j := strings.Index(string(readme), "## Serving")
	if i < 0 || j < 0 {
		t.Fatal("recipes/README.md or README.md lacks its serve paragraph")
	}
	root, _ := newRoot()
	cmd, _, err := root.Find([]string{"serve"})
	if err != nil || cmd.Name() != "serve" {
		t.Fatalf("serve command: %v", err)
	}
	n := 0
	cmd.NonInheritedFlags().VisitAll(func(f *pflag.Flag) {
		if f.Name == "help" {
			return
		}
		n++
		if !strings.Contains(string(recipes[i:]), "`--"+f.Name+"`") {
			t.Errorf("serve --%s is not on recipes/README.md's CLI-only list", f.Name)
		}
		if !strings.Contains(string(readme[j:]), "--"+f.Name) {
			t.Errorf("serve --%s is not in README.md's Serving section", f.Name)
		}
	})
	if n < 15 {
		t.Errorf("visited %d serve flags", n)
	}
}
