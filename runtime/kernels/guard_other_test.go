//go:build !linux

package kernels

import "testing"

// guarded falls back to an ordinary slice where guard pages are not set up.
func guarded(t *testing.T, n int) []float32 { return make([]float32, n) }

// guardedBytes falls back to an ordinary slice too.
func guardedBytes(t *testing.T, n int) []byte { return make([]byte, n) }

const haveGuard = false
