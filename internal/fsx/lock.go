package fsx

import "errors"

// ErrLocked is returned by TryLock when another open file (in this or
// another process) holds the lock.
var ErrLocked = errors.New("file is locked by another process")
