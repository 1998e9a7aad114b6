// Package fsx holds small file helpers shared by the readers: refuse
// anything but a regular file before opening it, so that a FIFO or device
// passed by mistake gives an error instead of blocking forever.
package fsx

import (
	"fmt"
	"io"
	"os"
)

// CheckRegular returns an error naming path when it is missing or is not a
// regular file (after following symlinks).
func CheckRegular(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	switch m := st.Mode(); {
	case m.IsDir():
		return fmt.Errorf("%s: is a directory, want a regular file", path)
	case !m.IsRegular():
		return fmt.Errorf("%s: not a regular file (a named pipe, socket or device)", path)
	}
	return nil
}

// ReadFile is os.ReadFile after CheckRegular.
func ReadFile(path string) ([]byte, error) {
	if err := CheckRegular(path); err != nil {
		return nil, err
	}
	return os.ReadFile(path)
}

// ErrWriter wraps a writer and remembers its first error, so that a run of
// fmt.Fprintf calls can be checked once through Err. Later writes after an
// error are dropped.
type ErrWriter struct {
	W   io.Writer
	Err error
}

// Write implements io.Writer.
func (e *ErrWriter) Write(p []byte) (int, error) {
	if e.Err != nil {
		return 0, e.Err
	}
	n, err := e.W.Write(p)
	e.Err = err
	return n, err
}
