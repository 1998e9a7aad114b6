package pack

import "github.com/lmpack/lmpack/internal/engine"

// Any program that links pack lets internal/engine open artifacts: run,
// eval and inspect in cmd/lmpack, and the compress pipeline's eval stage
// (engine cannot import pack, which depends on it through calibrate).
func init() {
	engine.ArtifactOpener = func(path string) (engine.Artifact, error) {
		r, err := Open(path)
		if err != nil {
			return nil, err
		}
		return r, nil
	}
}

var _ engine.Artifact = (*Reader)(nil)
