package cuda

import (
	"errors"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/runtime/kvcache"
)

// TestNewDeviceCacheShapes: oscar2 rotations whose K/V or ClipK/ClipV
// counts differ from the layer count fail with kvcache.ErrBadShape before
// any device memory is touched (the model here has no device); oscar4
// checks ClipK4/ClipV4 instead, and both need rotations.
func TestNewDeviceCacheShapes(t *testing.T) {
	m := &Model{layers: make([]layerW, 2), rope: map[int]*ropeDev{}}
	rot := func(k, v, ck, cv int) *kvcache.Rotations {
		r := &kvcache.Rotations{K: make([][]float32, k), V: make([][]float32, v)}
		if ck >= 0 {
			r.ClipK = make([]float64, ck)
		}
		if cv >= 0 {
			r.ClipV = make([]float64, cv)
		}
		return r
	}
	for _, tc := range []struct {
		r    *kvcache.Rotations
		want string
	}{
		{rot(1, 2, -1, -1), "1 K and 2 V"},
		{rot(2, 2, 1, 2), "1 ClipK and 2 ClipV"},
		{rot(2, 2, 2, 3), "2 ClipK and 3 ClipV"},
	} {
		_, err := m.NewDeviceCache(8, CacheOptions{Method: "oscar2", Sink: 1, Recent: 2, Rotations: tc.r})
		if !errors.Is(err, kvcache.ErrBadShape) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err = %v, want ErrBadShape naming %q", err, tc.want)
		}
	}
	// oscar4 checks its own ratios, ClipK4/ClipV4, and not oscar2's.
	r4 := rot(2, 2, 5, 5)
	r4.ClipK4, r4.ClipV4 = make([]float64, 2), make([]float64, 1)
	if _, err := m.NewDeviceCache(8, CacheOptions{Method: "oscar4", Sink: 1, Recent: 2, Rotations: r4}); !errors.Is(err, kvcache.ErrBadShape) || !strings.Contains(err.Error(), "2 ClipK4 and 1 ClipV4") {
		t.Errorf("oscar4: err = %v, want ErrBadShape naming \"2 ClipK4 and 1 ClipV4\"", err)
	}
	if _, err := m.NewDeviceCache(8, CacheOptions{Method: "oscar4", Sink: 1, Recent: 2}); !errors.Is(err, kvcache.ErrNoRotations) || !strings.Contains(err.Error(), "oscar4") {
		t.Errorf("oscar4 without rotations: err = %v, want ErrNoRotations naming oscar4", err)
	}
	if len(m.caches) != 0 {
		t.Errorf("a rejected cache was tracked")
	}
}
