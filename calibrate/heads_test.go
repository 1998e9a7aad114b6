package calibrate

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/lmpack/lmpack/formats/arch"
	"github.com/lmpack/lmpack/formats/safetensors"
	"github.com/lmpack/lmpack/internal/shared"
	"github.com/lmpack/lmpack/model"
)

// headProxyTensors returns one F64 tensor per layer holding v[l].
func headProxyTensors(v [][]float64) []safetensors.WriteTensor {
	var ts []safetensors.WriteTensor
	for l, x := range v {
		ts = append(ts, safetensors.WriteTensor{Name: HeadProxyTensorName(l), DType: safetensors.F64, Shape: []int{len(x)}, Data: f64Bytes(x)})
	}
	return ts
}

// TestHeadProxyFormat: the head proxy round-trips, and broken head
// tensors are refused naming the file and the tensor.
func TestHeadProxyFormat(t *testing.T) {
	d, err := arch.Load(shared.Path(t, "stories260K-hf"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	c := synthetic(d)
	proxy := func() [][]float64 {
		out := make([][]float64, len(d.Layers))
		for l := range out {
			for g := 0; g < d.Layers[l].NumKVHeads; g++ {
				out[l] = append(out[l], float64(l*10+g)+0.25)
			}
		}
		return out
	}
	c.HeadProxy = proxy()
	good := filepath.Join(dir, "good.safetensors")
	if err := Write(good, c); err != nil {
		t.Fatal(err)
	}
	got, err := Read(good, model.Expect{ModelFingerprint: testFP, Desc: d})
	if err != nil {
		t.Fatal(err)
	}
	if !got.Has(StatHeads) || len(got.HeadProxy) != 5 {
		t.Fatalf("statistics %v, %d proxy layers", got.Header.Statistics, len(got.HeadProxy))
	}
	for l := range c.HeadProxy {
		for g, v := range c.HeadProxy[l] {
			if got.HeadProxy[l][g] != v {
				t.Fatalf("proxy[%d][%d] = %v, wrote %v", l, g, got.HeadProxy[l][g], v)
			}
		}
	}
	hdr := func() Header {
		h := validHeader()
		h.Statistics = append(h.Statistics, StatHeads)
		return h
	}
	for _, k := range []struct {
		name string
		ts   func() []safetensors.WriteTensor
		want []string
	}{
		{"negative", func() []safetensors.WriteTensor {
			p := proxy()
			p[3][1] = -1
			return headProxyTensors(p)
		}, []string{`"heads.layers.3.proxy"`, "group 1 is -1", ">= 0"}},
		{"nan", func() []safetensors.WriteTensor {
			p := proxy()
			p[0][2] = math.NaN()
			return headProxyTensors(p)
		}, []string{`"heads.layers.0.proxy"`, "group 2 is NaN"}},
		{"wrong length", func() []safetensors.WriteTensor {
			p := proxy()
			p[2] = p[2][:3]
			return headProxyTensors(p)
		}, []string{`"heads.layers.2.proxy"`, "F64 [3], want F64 [4]"}},
		{"wrong dtype", func() []safetensors.WriteTensor {
			ts := headProxyTensors(proxy())
			ts[1] = safetensors.FromFloat32(ts[1].Name, []int{4}, make([]float32, 4))
			return ts
		}, []string{`"heads.layers.1.proxy"`, "F32 [4], want F64 [4]"}},
		{"missing layer", func() []safetensors.WriteTensor {
			ts := headProxyTensors(proxy())
			return append(ts[:2:2], ts[3:]...)
		}, []string{`"heads.layers.2.proxy"`, "not found"}},
		{"too few layers", func() []safetensors.WriteTensor { return headProxyTensors(proxy()[:4]) }, []string{"4 layers, the model has 5"}},
	} {
		t.Run(k.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(k.name, " ", "_")+".safetensors")
			writeRaw(t, p, append(rawTensors(c), k.ts()...), hdr())
			_, err := Read(p, model.Expect{ModelFingerprint: testFP, Desc: d})
			if !errors.Is(err, ErrBadStatistic) || !strings.Contains(err.Error(), p) {
				t.Fatalf("error %v: want ErrBadStatistic naming %s", err, p)
			}
			for _, w := range k.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %v: want it to mention %q", err, w)
				}
			}
		})
	}
	// Write refuses what Read would refuse.
	p := filepath.Join(dir, "refused.safetensors")
	c.HeadProxy[4][0] = math.Inf(1)
	if err := Write(p, c); !errors.Is(err, ErrBadStatistic) || !strings.Contains(err.Error(), `"heads.layers.4.proxy"`) {
		t.Errorf("Write with +Inf proxy: %v", err)
	}
	c.HeadProxy[4] = nil
	if err := Write(p, c); !errors.Is(err, ErrBadStatistic) || !strings.Contains(err.Error(), "no KV groups") {
		t.Errorf("Write with an empty layer: %v", err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused writes left %s", p)
	}
}
