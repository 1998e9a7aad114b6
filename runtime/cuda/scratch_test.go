package cuda

import "testing"

// TestPartSlots: the attention scratch holds exactly the partial results
// attention writes. On an H200 (132 SMs) with a 16-head/8-KV layer and a
// 32-head/8-KV layer (head_dim 128): a 32k decode step splits the sequence
// into 128 splits of 256 positions (4096 slots per row, from the 32-head
// layer); a 32k-token prefill needs one split (32 slots per row, about
// 1.07 GB of part_o), where sizing by attnSplit(nTok, 1) gave 256 splits
// and 137 GB (the review's finding). For every R and nTok no layer's grid
// exceeds partSlots.
func TestPartSlots(t *testing.T) {
	m := &Model{dev: &Device{SMs: 132}, layers: []layerW{{nh: 16, nkv: 8, hd: 128}, {nh: 32, nkv: 8, hd: 128}}}
	if got := m.partSlots(1, 32768); got != 4096 {
		t.Errorf("decode at 32k: %d slots per row, want 4096 (32 heads × 128 splits)", got)
	}
	if got := m.partSlots(32768, 32768); got != 32 {
		t.Errorf("32k prefill: %d slots per row, want 32 (32 heads × 1 split)", got)
	}
	bytes := 4 * int64(32768) * int64(m.partSlots(32768, 32768)) * 2 * 128
	if bytes > 1100e6 {
		t.Errorf("32k prefill part_o %.2f GB, want about 1.07", float64(bytes)/1e9)
	}
	for _, R := range []int{1, 3, 16, 17, 512, 4096} {
		for _, nTok := range []int{1, 127, 128, 129, 4096, 32768} {
			if R > nTok*16 {
				continue
			}
			slots := m.partSlots(R, nTok)
			for i := range m.layers {
				l := &m.layers[i]
				_, _, splitLen, nsplit := m.attnGrid(l, R, nTok)
				if l.nh*nsplit > slots {
					t.Errorf("R %d nTok %d layer %d: %d heads × %d splits exceed the %d slots", R, nTok, i, l.nh, nsplit, slots)
				}
				if nsplit < 1 || splitLen%128 != 0 || (nsplit-1)*splitLen >= nTok || nsplit*splitLen < nTok {
					t.Errorf("R %d nTok %d layer %d: %d splits of %d positions do not tile the sequence", R, nTok, i, nsplit, splitLen)
				}
			}
		}
	}
}
