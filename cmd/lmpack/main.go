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
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "0.1.0-dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := newRoot().ExecuteContext(ctx)
	stop()
	if err != nil {
		if errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "lmpack: interrupted")
			os.Exit(130)
		}
		fmt.Fprintln(os.Stderr, "lmpack:", err)
		os.Exit(1)
	}
}
