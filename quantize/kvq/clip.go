package kvq

import "math"

// Clip clamps x in place to [−τ, τ] with τ = sorted(|x|)[⌊ratio·len(x)⌋]
// (the index clamped to [0, len(x)−1]) and returns τ; OSCAR's per-row
// clipping after the rotation (docs/METHODS.md §1; published ratios 0.96 for keys,
// 0.92 for values). ratio ≥ 1 − 1/len(x) leaves x unchanged (τ = max|x|).
// NaN elements count as +Inf for τ and are left as they are. An empty x
// returns 0. It does not allocate for len(x) ≤ 512.
func Clip(x []float32, ratio float64) float32 {
	n := len(x)
	if n == 0 {
		return 0
	}
	var k int
	switch {
	case math.IsNaN(ratio) || ratio <= 0:
		k = 0
	case ratio >= 1:
		k = n - 1
	default:
		k = min(int(math.Floor(ratio*float64(n))), n-1)
	}
	var buf [512]float32
	var a []float32
	if n <= len(buf) {
		a = buf[:n]
	} else {
		a = make([]float32, n)
	}
	for i, v := range x {
		if v != v {
			a[i] = float32(math.Inf(1)) // NaN sorts last; keeps selectK's invariants
			continue
		}
		a[i] = math.Float32frombits(math.Float32bits(v) &^ (1 << 31))
	}
	var tau float32
	if n-k <= 32 {
		tau = selectTop(a, n-k)
	} else {
		tau = selectK(a, k)
	}
	for i, v := range x {
		if v > tau {
			x[i] = tau
		} else if v < -tau {
			x[i] = -tau
		}
	}
	return tau
}

// selectTop returns the m-th largest element of a (m ≥ 1), keeping the m
// largest seen in ascending order in a fixed buffer: about one comparison
// per element when m is small (high clipping ratios).
func selectTop(a []float32, m int) float32 {
	var buf [32]float32
	top := buf[:0]
	for _, v := range a {
		if len(top) == m {
			if v <= top[0] {
				continue
			}
			// Drop the smallest.
			copy(buf[:m-1], buf[1:m])
			top = buf[:m-1]
		}
		// Insert v keeping top ascending.
		j := len(top)
		top = top[:j+1]
		for j > 0 && top[j-1] > v {
			top[j] = top[j-1]
			j--
		}
		top[j] = v
	}
	return top[0]
}

// selectK returns the k-th smallest element of a (0-based), reordering a
// (Hoare quickselect with a median-of-three pivot).
func selectK(a []float32, k int) float32 {
	lo, hi := 0, len(a)-1
	for hi > lo {
		if hi-lo < 16 {
			// Insertion sort for short ranges.
			for i := lo + 1; i <= hi; i++ {
				v := a[i]
				j := i
				for j > lo && a[j-1] > v {
					a[j] = a[j-1]
					j--
				}
				a[j] = v
			}
			return a[k]
		}
		mid := lo + (hi-lo)/2
		if a[mid] < a[lo] {
			a[mid], a[lo] = a[lo], a[mid]
		}
		if a[hi] < a[lo] {
			a[hi], a[lo] = a[lo], a[hi]
		}
		if a[hi] < a[mid] {
			a[hi], a[mid] = a[mid], a[hi]
		}
		p := a[mid]
		i, j := lo, hi
		for i <= j {
			for a[i] < p {
				i++
			}
			for a[j] > p {
				j--
			}
			if i <= j {
				a[i], a[j] = a[j], a[i]
				i++
				j--
			}
		}
		switch {
		case k <= j:
			hi = j
		case k >= i:
			lo = i
		default:
			return a[k]
		}
	}
	return a[k]
}
