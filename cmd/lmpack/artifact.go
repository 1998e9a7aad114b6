package main

import (
	"github.com/lmpack/lmpack/internal/engine"
	"github.com/lmpack/lmpack/pack"
)

// run, eval and inspect accept a .lmpk artifact as MODEL: the engine
// opens it through pack (which it cannot import itself).
func init() {
	engine.ArtifactOpener = func(path string) (engine.Artifact, error) {
		r, err := pack.Open(path)
		if err != nil {
			return nil, err
		}
		return r, nil
	}
}
