package router

import (
	"math/rand/v2"
	"testing"
)

// The router's own per-request work — dedup and scoring — allocates
// nothing once its pooled buffers have grown.
func TestHotPathAllocs(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	req := &Request{Model: "m", RowSplits: []int64{0}}
	for range 200 {
		for range 100 {
			req.IDs = append(req.IDs, rng.Uint64N(5000))
			req.Values = append(req.Values, 1)
		}
		req.RowSplits = append(req.RowSplits, int64(len(req.IDs)))
	}
	for range 400 {
		req.SharedIDs = append(req.SharedIDs, rng.Uint64N(5000))
	}
	const dim = 8
	var x idIndex
	var sharedPos, pos []int32
	vals := make([]float32, 10000*(1+dim))
	out := make([]float32, req.Rows())
	buf := make([]float64, 4*dim)
	run := func() {
		x.reset(len(req.IDs) + len(req.SharedIDs))
		sharedPos, pos = sharedPos[:0], pos[:0]
		for _, id := range req.SharedIDs {
			sharedPos = append(sharedPos, x.index(id))
		}
		for _, id := range req.IDs {
			pos = append(pos, x.index(id))
		}
		scoreFM(out, 0.1, dim, vals, req, sharedPos, pos, buf)
		scoreLR(out, 0.1, vals, req, sharedPos, pos)
	}
	run()
	if n := testing.AllocsPerRun(20, run); n != 0 {
		t.Errorf("dedup + scoring allocated %.1f times per request, want 0", n)
	}
	if len(x.uniq) > 5000 {
		t.Errorf("%d distinct ids from a 5000-id space", len(x.uniq))
	}
}

func TestIDIndex(t *testing.T) {
	var x idIndex
	for round := range 3 {
		x.reset(10)
		ids := []uint64{0, 7, ^uint64(0), 7, 0, 42}
		want := []int32{0, 1, 2, 1, 0, 3}
		for i, id := range ids {
			if got := x.index(id); got != want[i] {
				t.Fatalf("round %d: index(%d) = %d, want %d", round, id, got, want[i])
			}
		}
		if len(x.uniq) != 4 {
			t.Fatalf("round %d: %d distinct, want 4", round, len(x.uniq))
		}
	}
}

// The table grows while it fills: every id keeps its number through the
// doublings, and a later small request reuses the grown table.
func TestIDIndexGrows(t *testing.T) {
	var x idIndex
	rng := rand.New(rand.NewPCG(3, 4))
	for round, n := range []int{40, 100_000, 7} {
		x.reset(n / 10) // far fewer expected than come
		ids := make([]uint64, n)
		for i := range ids {
			ids[i] = rng.Uint64()
		}
		for i, id := range ids {
			if got := x.index(id); got != int32(i) {
				t.Fatalf("round %d: new id %d numbered %d", round, i, got)
			}
		}
		for i, id := range ids {
			if got := x.index(id); got != int32(i) {
				t.Fatalf("round %d: id %d numbered %d the second time", round, i, got)
			}
		}
		if len(x.uniq) != n || int(x.mask+1)*2/3 < n {
			t.Fatalf("round %d: %d distinct in a table of %d", round, len(x.uniq), x.mask+1)
		}
	}
}
