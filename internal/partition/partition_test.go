package partition

import "testing"

// Golden values pin the documented mapping: changing them breaks every
// model repository ever written.
func TestGolden(t *testing.T) {
	cases := []struct {
		id   uint64
		hash uint64
	}{
		{0, 0x34c96acdcadb1bbb},
		{1, 0x9f29cb17a2a49995},
		{^uint64(0), 0x85d136adb773c6c9},
	}
	for _, c := range cases {
		if got := Hash(c.id); got != c.hash {
			t.Errorf("Hash(%d) = %#x, want %#x", c.id, got, c.hash)
		}
		if got, want := Of(c.id, 7), uint32(c.hash%7); got != want {
			t.Errorf("Of(%d, 7) = %d, want %d", c.id, got, want)
		}
	}
}

func TestSpread(t *testing.T) {
	const p, n = 8, 80000
	var counts [p]int
	for i := uint64(0); i < n; i++ {
		counts[Of(i, p)]++
	}
	for i, c := range counts {
		if c < n/p*9/10 || c > n/p*11/10 {
			t.Errorf("partition %d holds %d of %d ids, want about %d", i, c, n, n/p)
		}
	}
}
