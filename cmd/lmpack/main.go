// Command lmpack is the offline compression toolchain for large language
// models: inspect, run and evaluate Hugging Face checkpoints (calibrate,
// prune, quantize and pack follow). This package only parses flags into
// option structs and calls one entry function per subcommand.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

func main() {
	os.Exit(run())
}

// run executes the CLI and returns the exit status: 0, 1 on error, 3 when
// compress's eval gate fails, or 128+signal (130 SIGINT, 143 SIGTERM, 129
// SIGHUP) when interrupted. SIGHUP is handled like SIGTERM (serve drains
// gracefully and exits 0). A second signal during the shutdown exits at
// once with 128+that signal (as uvicorn exits on a second Ctrl-C), even
// when the process was started with SIGINT ignored (a background job).
func run() int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	var got atomic.Int32
	go func() {
		s, ok := <-sigs
		if !ok {
			return
		}
		got.Store(int32(s.(syscall.Signal)))
		cancel()
		s = <-sigs
		fmt.Fprintf(os.Stderr, "lmpack: second signal (%v) during shutdown: exiting at once\n", s)
		os.Exit(128 + int(s.(syscall.Signal)))
	}()
	root, g := newRoot()
	err := root.ExecuteContext(ctx)
	signal.Stop(sigs)
	if err == nil {
		return 0
	}
	code, msg := 1, err.Error()
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
	}
	if s := syscall.Signal(got.Load()); s != 0 && errors.Is(err, context.Canceled) {
		code, msg = 128+int(s), "interrupted ("+s.String()+")"
	}
	if g.logFormat == "json" && g.logger != nil {
		g.logger.Error(msg, "exit_code", code)
	} else {
		fmt.Fprintln(os.Stderr, "lmpack:", msg)
	}
	return code
}
