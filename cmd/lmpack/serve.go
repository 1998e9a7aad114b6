package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/lmpack/lmpack/internal/fsx"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/internal/field"
	"github.com/lmpack/lmpack/model"
	"github.com/lmpack/lmpack/quantize/oscar"
	"github.com/lmpack/lmpack/runtime/kvcache"
	"github.com/lmpack/lmpack/serve"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
)

// serveFlags are lmpack serve's flags (CLI only: serve has no recipe
// keys).
type serveFlags struct {
	host, kvMemory, kv, kvWindow, kvRot, device, apiKeyFile, servedName string
	port, blockTokens, threads                                          int
	sched                                                               serve.SchedOptions
	maxModelLen                                                         int
	logPrompts                                                          bool
	shutdownTimeout, headerTimeout                                      time.Duration
	allowedHosts                                                        []string
}

// schedFlagNames renames serve.SchedOptions' fields in its errors.
var schedFlagNames = map[string]string{
	"MaxBatch": "--max-batch", "MaxPrefillTokens": "--max-prefill-tokens", "MaxQueue": "--max-queue", "MaxModelLen": "--max-model-len",
}

func newServeCmd(g *globalFlags) *cobra.Command {
	var fl serveFlags
	cmd := &cobra.Command{
		Use:   "serve MODEL|ARTIFACT",
		Short: "Serve a model over an OpenAI-compatible HTTP API with continuous batching",
		Long: `serve loads MODEL (a checkpoint directory, hub id or .lmpk artifact) and
answers POST /v1/completions, POST /v1/chat/completions (with the model's
chat_template), GET /v1/models, GET /health and GET /metrics on
--host:--port (127.0.0.1:8000: the loopback interface only unless --host
says otherwise). Requests are batched continuously; their KV caches come
from a pool of --kv-memory bytes, and a request that does not fit waits in
a queue of --max-queue (503 with Retry-After beyond it). An artifact
serves with its own KV cache scheme and rotations; --kv and --kv-window
choose the cache of a plain checkpoint (default fp32, as lmpack run).
SIGTERM, SIGINT or SIGHUP stops admitting, lets running requests finish
within --shutdown-timeout (then cuts them) and exits 0; a second signal
exits at once with 128+N.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runServe(cmd.Context(), g, args[0], &fl)
		},
	}
	f := cmd.Flags()
	f.StringVar(&fl.host, "host", serve.DefaultHost, "address to listen on (0.0.0.0: every interface)")
	f.StringSliceVar(&fl.allowedHosts, "allowed-hosts", nil, "Host header names accepted besides loopback ones (on a loopback --host only loopback Host headers are answered, against DNS rebinding; set, the check applies to any --host)")
	f.IntVar(&fl.port, "port", serve.DefaultPort, "TCP port to listen on")
	f.StringVar(&fl.kvMemory, "kv-memory", "1GiB", "KV cache memory budget of all sequences together: bytes, or with a unit (512MiB, 4GiB, 2GB)")
	f.StringVar(&fl.kv, "kv", "", "KV cache method of a plain checkpoint ("+strings.Join(kvcache.Methods(), ", ")+"; default fp32); an artifact uses its own")
	f.StringVar(&fl.kvWindow, "kv-window", "", "SINK,RECENT: fp16 windows of the first SINK and newest RECENT tokens (plain checkpoint with --kv)")
	f.StringVar(&fl.kvRot, "kv-rotations", "", "OSCAR rotation file (lmpack quantize kv) for --kv oscar2/oscar4 on a plain checkpoint")
	f.IntVar(&fl.blockTokens, "kv-block-tokens", 0, "tokens per KV block of the pool (default 16, or 32 for kivi2 and oscars2)")
	f.IntVar(&fl.sched.MaxBatch, "max-batch", 32, "most sequences decoded together")
	f.IntVar(&fl.sched.MaxPrefillTokens, "max-prefill-tokens", 512, "most prompt tokens prefilled in one step (chunked prefill)")
	f.IntVar(&fl.sched.MaxQueue, "max-queue", 256, "most requests waiting for KV memory; more are answered 503")
	f.IntVar(&fl.maxModelLen, "max-model-len", 0, "most prompt + generated tokens of a request (default: the model's max_position_embeddings)")
	f.IntVar(&fl.threads, "threads", 0, "worker threads (default: all cores)")
	f.StringVar(&fl.apiKeyFile, "api-key-file", "", "file of accepted API keys, one per line; requests to /v1/ then need Authorization: Bearer KEY")
	f.BoolVar(&fl.logPrompts, "log-prompts", false, "include prompt text in the request log lines")
	f.DurationVar(&fl.shutdownTimeout, "shutdown-timeout", serve.DefaultShutdownTimeout, "on SIGTERM, how long running requests may go on before they are cut (the cut ones then get at least 250ms to send their 503 or error event)")
	f.DurationVar(&fl.headerTimeout, "header-timeout", serve.DefaultReadHeaderTimeout, "a request's headers must arrive within this time (slowloris)")
	f.StringVar(&fl.servedName, "served-model-name", "", "model id of the API (default: the base name of MODEL)")
	addCPUDeviceFlag(cmd, &fl.device, "serve (its KV pool is host memory)")
	return cmd
}

// parseBytes reads a byte count: plain bytes, or a number with a unit
// (KiB, MiB, GiB, TiB powers of 1024; KB, MB, GB, TB powers of 1000; B).
func parseBytes(flag, s string) (int64, error) {
	t := strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   float64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}}
	mult := 1.0
	for _, u := range units {
		if num, ok := strings.CutSuffix(t, u.suffix); ok {
			t, mult = strings.TrimSpace(num), u.mult
			break
		}
	}
	x, err := strconv.ParseFloat(t, 64)
	if err != nil || !(x > 0) || x*mult > 1<<62 {
		return 0, fmt.Errorf("%s %q: want a positive byte count, e.g. 4GiB, 512MiB or 1073741824", flag, s)
	}
	return int64(x * mult), nil
}

// parseWindow reads --kv-window SINK,RECENT.
func parseWindow(s string) (sink, recent int, err error) {
	if n, err := fmt.Sscanf(s, "%d,%d", &sink, &recent); n != 2 || err != nil || sink < 0 || recent < 0 || fmt.Sprintf("%d,%d", sink, recent) != s {
		return 0, 0, fmt.Errorf("--kv-window %q: want SINK,RECENT (two non-negative token counts, e.g. 64,256)", s)
	}
	return sink, recent, nil
}

// readAPIKeys reads --api-key-file: one key per line, surrounding space,
// empty lines and lines starting with # (comments) ignored. Errors: an
// unreadable file, a file with no key.
func readAPIKeys(path string) ([][]byte, error) {
	b, err := fsx.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--api-key-file: %w", err)
	}
	var keys [][]byte
	for _, line := range bytes.Split(b, []byte("\n")) {
		if k := bytes.TrimSpace(line); len(k) > 0 && k[0] != '#' {
			keys = append(keys, k)
		}
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("--api-key-file %s: no key in the file (want one key per line)", path)
	}
	return keys, nil
}

// checkServeFlags validates what can be checked before the model loads.
func checkServeFlags(fl *serveFlags) (kvMem int64, err error) {
	if fl.port < 0 || fl.port > 65535 {
		return 0, fmt.Errorf("--port %d: want 0..65535", fl.port)
	}
	if fl.host == "" {
		return 0, fmt.Errorf("--host: empty; want an address such as 127.0.0.1 or 0.0.0.0")
	}
	if kvMem, err = parseBytes("--kv-memory", fl.kvMemory); err != nil {
		return 0, err
	}
	if fl.kvWindow != "" {
		if _, _, err := parseWindow(fl.kvWindow); err != nil {
			return 0, err
		}
	}
	if fl.blockTokens < 0 {
		return 0, fmt.Errorf("--kv-block-tokens %d: want > 0", fl.blockTokens)
	}
	switch fl.device {
	case "auto", "cpu", "cuda":
	default:
		return 0, fmt.Errorf("--device %q: want auto, cpu or cuda", fl.device)
	}
	if fl.maxModelLen < 0 {
		return 0, fmt.Errorf("--max-model-len %d: want > 0 (0: the model's context)", fl.maxModelLen)
	}
	for name, v := range map[string]int{"--max-batch": fl.sched.MaxBatch, "--max-prefill-tokens": fl.sched.MaxPrefillTokens, "--max-queue": fl.sched.MaxQueue} {
		if v < 1 {
			return 0, fmt.Errorf("%s %d: want at least 1", name, v)
		}
	}
	if fl.shutdownTimeout <= 0 {
		return 0, fmt.Errorf("--shutdown-timeout %v: want > 0", fl.shutdownTimeout)
	}
	if fl.headerTimeout <= 0 {
		return 0, fmt.Errorf("--header-timeout %v: want > 0", fl.headerTimeout)
	}
	if err := checkThreads(fl.threads); err != nil {
		return 0, err
	}
	return kvMem, nil
}

// servePool builds the KV pool: an artifact's own scheme (its manifest's
// method, windows and rotations), or --kv and --kv-window for a plain
// checkpoint (fp32 by default, the cache lmpack run uses), with
// --kv-rotations read (and checked against the model's fingerprint) for
// oscar2/oscar4.
func servePool(e *engine.Engine, fl *serveFlags, kvMem int64, logger *slog.Logger) (*kvcache.Pool, string, error) {
	method := "fp32"
	var opt kvcache.Options
	if e.Artifact != nil {
		if fl.kv != "" || fl.kvWindow != "" || fl.kvRot != "" {
			return nil, "", fmt.Errorf("--kv/--kv-window/--kv-rotations: %s is an artifact, which serves with its own KV cache scheme and rotations; drop the flags", e.Dir)
		}
		m, o, err := e.Artifact.KVCache()
		if err != nil {
			return nil, "", err
		}
		if m != "" {
			method, opt = m, o
		}
	} else {
		// After the artifact check: an artifact refuses the flags whole.
		if fl.kvWindow != "" && fl.kv == "" {
			return nil, "", fmt.Errorf("--kv-window %s without --kv: the default fp32 cache has no windows; give --kv METHOD", fl.kvWindow)
		}
		if fl.kv != "" {
			method = fl.kv
		}
		if fl.kvWindow != "" {
			opt.Sink, opt.Recent, _ = parseWindow(fl.kvWindow)
		}
		if fl.kvRot != "" {
			fp, err := model.Fingerprint(e.Dir, e.Checkpoint)
			if err != nil {
				return nil, "", err
			}
			r, _, err := oscar.ReadFile(fl.kvRot, model.Expect{ModelFingerprint: fp, Desc: e.Desc})
			if err != nil {
				return nil, "", fmt.Errorf("--kv-rotations: %w", err)
			}
			kr := kvcache.Rotations(*r)
			opt.Rotations = &kr
		}
	}
	bt := fl.blockTokens
	if bt == 0 {
		bt = 16
		if method == "kivi2" || method == "oscars2" {
			bt = 32
		}
	}
	maxLen := fl.maxModelLen
	if maxLen == 0 {
		maxLen = e.Desc.MaxPositionEmbeddings
	}
	if maxLen > 0 && bt > maxLen {
		return nil, "", fmt.Errorf("--kv-block-tokens %d: larger than the max model length %d (--max-model-len); every request would reserve a block of %d tokens", bt, maxLen, bt)
	}
	// The newest token reads what was quantized before it (the first
	// maxLen−1 tokens at most) and its own key and value exact.
	if w := opt.Sink + opt.Recent; maxLen > 0 && w >= maxLen-1 && method != "fp32" && method != "fp16" && logger != nil {
		logger.Warn("the KV windows cover the whole max model length: no token is ever quantized, the cache costs fp16 bytes", "kv", method, "sink", opt.Sink, "recent", opt.Recent, "max_model_len", maxLen)
	}
	p, err := kvcache.NewPool(method, kvcache.LayersOf(e.Desc), opt, kvMem, bt)
	if errors.Is(err, kvcache.ErrNoRotations) {
		return nil, "", fmt.Errorf("--kv %s needs --kv-rotations ROT (a rotation file from lmpack quantize kv): %w", method, err)
	}
	if err != nil {
		return nil, "", fmt.Errorf("--kv %s (--kv-memory %s, --kv-block-tokens %d): %w", method, fl.kvMemory, bt, err)
	}
	// The smallest request (one prompt token and one generated) needs the
	// fixed bytes of a max-length cache and one block.
	if maxLen > 0 {
		if least := p.BytesForReserve(maxLen, 2); kvMem < least {
			return nil, "", fmt.Errorf("--kv-memory %s (%d bytes): smaller than the smallest request, which needs %d bytes of %s KV cache (one %d-token block and the fp16 windows); want at least that", fl.kvMemory, kvMem, least, method, bt)
		}
	}
	return p, method, nil
}

func runServe(ctx context.Context, g *globalFlags, name string, fl *serveFlags) error {
	kvMem, err := checkServeFlags(fl)
	if err != nil {
		return err
	}
	device, err := cpuOnly(fl.device, "serve", g.logger)
	if err != nil {
		return err
	}
	var keys [][]byte
	if fl.apiKeyFile != "" {
		if keys, err = readAPIKeys(fl.apiKeyFile); err != nil {
			return err
		}
	}
	e, err := engine.Open(ctx, name, engine.Options{Threads: fl.threads, Device: device, Logger: g.logger, Artifacts: true})
	if err != nil {
		return err
	}
	defer e.Close()
	pool, method, err := servePool(e, fl, kvMem, g.logger)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	so := fl.sched
	so.MaxModelLen = fl.maxModelLen
	so.Logger = g.logger
	sched, err := serve.NewScheduler(e.Model, pool, so, reg)
	if err != nil {
		return field.Rename(err, schedFlagNames)
	}
	srv, err := serve.New(e, sched, reg, serve.Options{
		Host: fl.host, Port: fl.port, AllowedHosts: fl.allowedHosts, APIKeys: keys, ModelName: fl.servedName, MaxModelLen: fl.maxModelLen,
		LogPrompts: fl.logPrompts, ShutdownTimeout: fl.shutdownTimeout, ReadHeaderTimeout: fl.headerTimeout, Logger: g.logger,
	})
	if err != nil {
		return field.Rename(err, map[string]string{"MaxModelLen": "--max-model-len"})
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(fl.host, strconv.Itoa(fl.port)))
	if err != nil {
		return fmt.Errorf("--host %s --port %d: %w", fl.host, fl.port, err)
	}
	if fl.host == "0.0.0.0" || fl.host == "::" || fl.host == "[::]" {
		g.logger.Warn("listening on every interface, IPv4 and IPv6: the API is reachable from the network", "host", fl.host, "api_keys", len(keys) > 0)
	}
	st := pool.Stats()
	if avail, ok := memAvailable(); ok && st.TotalBytes > avail {
		g.logger.Warn("--kv-memory is larger than the memory available now (MemAvailable): the pool takes memory as it fills, so the budget may not be reachable", "kv_memory_bytes", st.TotalBytes, "mem_available_bytes", avail)
	}
	if full := pool.BytesFor(srv.Options().MaxModelLen); st.TotalBytes < full {
		g.logger.Warn("--kv-memory holds less than one full-context sequence: requests whose prompt + max_tokens need more are refused", "kv_memory_bytes", st.TotalBytes, "full_context_bytes", full)
	}
	g.logger.Info("kv pool", "method", method, "budget_bytes", st.TotalBytes, "block_tokens", st.BlockTokens, "blocks", st.TotalBlocks,
		"full_context_sequences", st.TotalBytes/max(1, pool.BytesFor(srv.Options().MaxModelLen)), "chat_template", srv.HasChatTemplate())
	runCtx, stopRun := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- sched.Run(runCtx) }()
	// ctx ends on SIGTERM/SIGINT (main): Serve drains and returns nil.
	err = srv.Serve(ctx, ln, sched.Drain)
	stopRun()
	if rerr := <-ran; err == nil && rerr != nil {
		err = rerr
	}
	return err
}

// memAvailable reads MemAvailable of /proc/meminfo in bytes (Linux);
// false when it cannot.
func memAvailable() (int64, bool) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			var kb int64
			if _, err := fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb); err == nil {
				return kb << 10, true
			}
		}
	}
	return 0, false
}
