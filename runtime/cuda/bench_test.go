package cuda

// GPU benchmarks (skipped without a GPU): device copy bandwidth, the INT2
// decode attention kernel's bandwidth against it, and decode tokens/s
// with fp16 and oscar2 KV caches on a synthetic KV-dominated model.

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lmpack/lmpack/runtime"
	"github.com/lmpack/lmpack/runtime/kvcache"
)

// copyBandwidth measures device-to-device copy bandwidth in GB/s (bytes
// read plus bytes written per second) over 1 GiB copies.
func copyBandwidth(tb testing.TB, d *Device) float64 {
	tb.Helper()
	const n = 1 << 30
	a, err := d.Alloc(n)
	if err != nil {
		tb.Fatal(err)
	}
	defer d.Free(a)
	b, err := d.Alloc(n)
	if err != nil {
		tb.Fatal(err)
	}
	defer d.Free(b)
	for i := 0; i < 3; i++ { // warm up
		if err := d.CopyDtoD(b, a, n); err != nil {
			tb.Fatal(err)
		}
	}
	if err := d.Sync(); err != nil {
		tb.Fatal(err)
	}
	const reps = 20
	t0 := time.Now()
	for i := 0; i < reps; i++ {
		if err := d.CopyDtoD(b, a, n); err != nil {
			tb.Fatal(err)
		}
	}
	if err := d.Sync(); err != nil {
		tb.Fatal(err)
	}
	return 2 * n * reps / time.Since(t0).Seconds() / 1e9
}

// BenchmarkCopyBandwidth reports cuMemcpyDtoD bandwidth (GB/s, read +
// write).
func BenchmarkCopyBandwidth(b *testing.B) {
	d, _ := gpuOrSkip(b)
	var bw float64
	for i := 0; i < b.N; i++ {
		bw = copyBandwidth(b, d)
	}
	b.ReportMetric(bw, "GB/s")
}

// syntheticKVModel is the KV-dominated decode model: 32 layers, hidden
// 1024, 16 q heads and 8 kv heads of head_dim 128, intermediate 1024,
// vocabulary 1024 (about 0.3 G parameters; the fp16 KV cache of one 32k
// sequence is 4.3 GB).
func syntheticKVModel(b *testing.B) *Model {
	b.Helper()
	gpuOrSkip(b)
	desc, src := syntheticModel(b, 32, 1024, 16, 8, 128, 1024, 1024, 5)
	m, err := (Backend{CacheDir: testCacheDir(b)}).Load(context.Background(), desc, src, runtime.LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	return m.(*Model)
}

// filledCache returns a B-sequence cache of method holding n tokens whose
// bytes are a fixed pattern (0x3c: binary16 1.06, finite), with identity
// rotations and OSCAR's windows (sink 64, recent 256) for oscar2: the
// contents do not change the work done.
func filledCache(b *testing.B, m *Model, method string, B, n, capacity int) *DeviceCache {
	b.Helper()
	o := CacheOptions{Method: method, Batch: B}
	if method == "oscar2" {
		rot := &kvcache.Rotations{}
		for _, l := range m.layers {
			id := make([]float32, l.hd*l.hd)
			for i := 0; i < l.hd; i++ {
				id[i*l.hd+i] = 1
			}
			rot.K, rot.V = append(rot.K, id), append(rot.V, id)
		}
		o.Sink, o.Recent, o.Rotations = 64, 256, rot
	} else if method != "fp16" {
		o.Sink, o.Recent = 64, 256
	}
	c, err := m.NewDeviceCache(capacity, o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Free() })
	for i, L := range c.layers {
		l := &m.layers[i]
		rows := int64(B * l.nkv)
		fill := []struct {
			p DevPtr
			n int64
		}{{L.ringK, 2 * rows * int64(c.ring*l.hd)}, {L.ringV, 2 * rows * int64(c.ring*l.hd)}}
		if c.kind != 0 {
			type span = struct {
				p DevPtr
				n int64
			}
			fill = append(fill, span{L.sinkK, 2 * rows * int64(c.sink*l.hd)}, span{L.sinkV, 2 * rows * int64(c.sink*l.hd)},
				span{L.codesK, rows * int64(c.capQ*L.rb)}, span{L.codesV, rows * int64(c.capQ*L.rb)})
			if c.kind == kvASYM {
				fill = append(fill, span{L.parK, 4 * rows * int64(c.capQ)}, span{L.parV, 4 * rows * int64(c.capQ)})
			}
		}
		for _, f := range fill {
			if f.n > 0 {
				if err := m.dev.Memset(f.p, 0x3c, f.n); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	c.n, c.hi = n, n
	return c
}

// BenchmarkAttnINT2 times one layer's decode attention (attn_split +
// attn_merge, 16 q heads over 8 kv heads of 128) over an oscar2 cache of
// 16 sequences and reports the bytes it must read (INT2 codes and
// parameters of K and V, the fp16 sink and window rows) per second, and
// that as a percentage of the measured device copy bandwidth (goal ≥ 80).
func BenchmarkAttnINT2(b *testing.B) {
	m := syntheticKVModel(b)
	copyBW := copyBandwidth(b, m.dev)
	for _, n := range []int{4096, 16384, 32768} {
		b.Run(fmt.Sprintf("ctx=%d", n), func(b *testing.B) {
			const B = 16
			c := filledCache(b, m, "oscar2", B, n, n+1)
			l, L := &m.layers[0], &c.layers[0]
			if err := m.ensureScratch(B, 1, n); err != nil {
				b.Fatal(err)
			}
			ws := c.windowStart(n)
			q := int64(ws - c.sink)
			fp := int64(n) - q
			bytes := int64(B*l.nkv) * (q*2*int64(l.hd/4+4) + fp*2*int64(2*l.hd))
			run := func() {
				if err := m.attention(m.k, l, L, c, m.s.qkv, m.s.att, B, 1, n-1, n, ws); err != nil {
					b.Fatal(err)
				}
			}
			run()
			if err := m.dev.Sync(); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				run()
			}
			if err := m.dev.Sync(); err != nil {
				b.Fatal(err)
			}
			sec := b.Elapsed().Seconds()
			gbs := float64(bytes) * float64(b.N) / sec / 1e9
			b.ReportMetric(gbs, "GB/s")
			b.ReportMetric(100*gbs/copyBW, "%copy")
			b.ReportMetric(copyBW, "copyGB/s")
		})
	}
}

// BenchmarkDecode reports decode tokens/s (all sequences) of the
// synthetic KV-dominated model with fp16 and oscar2 KV caches at 4k, 16k
// and 32k context, batch 1 and 16 (goal: oscar2 ≥ 3× fp16 at 32k).
func BenchmarkDecode(b *testing.B) {
	m := syntheticKVModel(b)
	for _, n := range []int{4096, 16384, 32768} {
		for _, B := range []int{1, 16} {
			for _, method := range []string{"fp16", "oscar2"} {
				b.Run(fmt.Sprintf("ctx=%d/batch=%d/kv=%s", n, B, method), func(b *testing.B) {
					c := filledCache(b, m, method, B, n, n+1)
					ids := make([]int, B)
					logits := make([]float32, B*m.d.VocabSize)
					step := func() {
						if err := m.ForwardUniform(context.Background(), ids, B, c, logits, false); err != nil {
							b.Fatal(err)
						}
						c.Truncate(n)
					}
					step()
					b.ResetTimer()
					for i := 0; i < b.N; i++ {
						step()
					}
					b.ReportMetric(float64(B*b.N)/b.Elapsed().Seconds(), "tokens/s")
					b.ReportMetric(float64(c.Bytes())/1e9, "kvGB")
				})
			}
		}
	}
}

// BenchmarkDecodeKVKinds reports decode tokens/s of the synthetic
// KV-dominated model at 16k context, batch 1 and 16, with each device KV
// kind (fp16 for the ratio; sink 64 and recent 256 fp16 for the
// quantized ones, as BenchmarkDecode's oscar2), and the cache's bytes.
func BenchmarkDecodeKVKinds(b *testing.B) {
	m := syntheticKVModel(b)
	const n = 16384
	for _, B := range []int{1, 16} {
		for _, method := range []string{"fp16", "int8", "int4", "q8_0", "q4_0", "fp8"} {
			b.Run(fmt.Sprintf("ctx=%d/batch=%d/kv=%s", n, B, method), func(b *testing.B) {
				c := filledCache(b, m, method, B, n, n+1)
				ids := make([]int, B)
				logits := make([]float32, B*m.d.VocabSize)
				step := func() {
					if err := m.ForwardUniform(context.Background(), ids, B, c, logits, false); err != nil {
						b.Fatal(err)
					}
					c.Truncate(n)
				}
				step()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					step()
				}
				b.ReportMetric(float64(B*b.N)/b.Elapsed().Seconds(), "tokens/s")
				b.ReportMetric(float64(c.Bytes())/1e9, "kvGB")
			})
		}
	}
}
