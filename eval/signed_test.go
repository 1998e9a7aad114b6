package eval

import "testing"

// Signed writes an explicit sign and never a negative zero.
func TestSigned(t *testing.T) {
	for _, c := range []struct {
		v    float64
		prec int
		want string
	}{
		{0, 4, "+0.0000"}, {-1e-9, 4, "+0.0000"}, {-0.00004, 4, "+0.0000"}, {1e-9, 4, "+0.0000"},
		{-0.00005001, 4, "-0.0001"}, {0.4054, 4, "+0.4054"}, {-16.2323, 4, "-16.2323"},
		{7.5612, 2, "+7.56"}, {-0.004, 2, "+0.00"}, {-0.006, 2, "-0.01"}, {-3, 0, "-3"}, {-0.4, 0, "+0"},
	} {
		if got := Signed(c.v, c.prec); got != c.want {
			t.Errorf("Signed(%g, %d) = %q, want %q", c.v, c.prec, got, c.want)
		}
	}
}
