package hub

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/lmpack/lmpack/internal/fsx"
)

// lockFile takes an exclusive lock on path (created if needed; flock(2)
// on Unix, the kind of lock huggingface_hub's filelock takes on the same
// <cache>/.locks/<repo>/<blob>.lock file, LockFileEx on Windows:
// fsx.TryLock), so two processes never write one blob at once. It polls
// every 100 ms until the lock is free or ctx ends.
func lockFile(ctx context.Context, path string) (unlock func(), err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := fsx.TryLock(f)
		if err == nil {
			return func() {
				_ = fsx.Unlock(f)
				f.Close()
			}, nil
		}
		if !errors.Is(err, fsx.ErrLocked) {
			f.Close()
			return nil, err
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
