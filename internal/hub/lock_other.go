//go:build !unix

package hub

import "context"

// lockFile is a no-op where flock(2) is unavailable.
func lockFile(ctx context.Context, path string) (unlock func(), err error) {
	return func() {}, ctx.Err()
}
