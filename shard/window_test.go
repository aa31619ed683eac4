package shard

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/cumulus-serving/cumulus/codec"
)

// Both lookup paths, the windowed search (narrow records, ≥ window keys)
// and the scan (wide records or tiny tables), answer exactly as a map
// does: present and absent keys, key 0, the largest key, repeats, and
// the linear weight of each found record.
func TestFindPathsMatchMap(t *testing.T) {
	cases := []struct {
		n, width int
		e        codec.Encoding
		windowed bool
	}{
		{7, 1, codec.EncFP32, false},
		{window, 1, codec.EncFP32, true},
		{window + 1, 1, codec.EncFP32, true},
		{100, 1, codec.EncFP32, true},
		{60000, 1, codec.EncFP32, true},
		{60000, 2, codec.EncFP16, true},
		{60000, 1, codec.EncInt8, true},
		{60000, 4, codec.EncFP32, false},
	}
	for _, tc := range cases {
		rng := rand.New(rand.NewPCG(uint64(tc.n), uint64(tc.width)))
		keys := []uint64{0, math.MaxUint64, math.MaxUint64 - 1, 1}[:min(tc.n, 4)]
		ref := map[uint64]int{}
		for i, k := range keys {
			ref[k] = i
		}
		for len(keys) < tc.n {
			k := rng.Uint64() >> rng.UintN(50) // clustered and spread ids
			if _, dup := ref[k]; !dup {
				ref[k] = len(keys)
				keys = append(keys, k)
			}
		}
		vals := make([]float32, tc.n*tc.width)
		for i := range vals {
			vals[i] = float32(rng.NormFloat64())
		}
		tb := buildTable(t, keys, tc.width, tc.e, vals)
		if got := tb.rs <= maxWindowRecord && tb.n >= window; got != tc.windowed {
			t.Fatalf("n=%d width=%d %v: windowed=%v, want %v", tc.n, tc.width, tc.e, got, tc.windowed)
		}
		query := []uint64{0, math.MaxUint64, 2, math.MaxUint64 - 2}
		for len(query) < 5000 {
			k := keys[rng.IntN(len(keys))]
			switch rng.IntN(4) {
			case 0:
				k++ // usually absent, next to a present key
			case 1:
				k = rng.Uint64()
			}
			query = append(query, k, k) // every key twice in the batch
		}
		idx := make([]int32, len(query))
		w := make([]float32, len(query))
		for j := range w {
			w[j] = 99 // must be overwritten
		}
		tb.FindWeights(query, idx, w)
		idx2 := make([]int32, len(query))
		tb.Find(query, idx2)
		for j, q := range query {
			i, present := ref[q]
			if idx2[j] != idx[j] {
				t.Fatalf("n=%d: key %d: Find %d, FindWeights %d", tc.n, q, idx2[j], idx[j])
			}
			if present != (idx[j] >= 0) {
				t.Fatalf("n=%d width=%d %v: key %d present=%v, found %d", tc.n, tc.width, tc.e, q, present, idx[j])
			}
			want := float32(0)
			if present {
				want = vals[i*tc.width]
				if tb.hAt(int(idx[j])) != codec.KeyHash(q) {
					t.Fatalf("key %d: found record %d holds another key", q, idx[j])
				}
			}
			if w[j] != want {
				t.Fatalf("n=%d: key %d weight %v, want %v", tc.n, q, w[j], want)
			}
		}
	}
}

// The amd64 assembly stages of the windowed search do exactly what
// their Go reference does, including clamped windows and keys whose
// place lies outside their window (forced here by moving windows).
func TestWindowStagesMatchGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	const n = 20000
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = rng.Uint64()
	}
	vals := make([]float32, n)
	for i := range vals {
		vals[i] = float32(i)
	}
	tb := buildTable(t, keys, 1, codec.EncFP32, vals)
	dir := unsafe.Pointer(unsafe.SliceData(tb.dir))
	rec := unsafe.Pointer(unsafe.SliceData(tb.rec))
	rs, last := uintptr(tb.rs), int64(tb.n-window)
	var misses int
	for round := range 20000 {
		m := 1 + rng.IntN(wgroup)
		q := make([]uint64, m)
		for j := range q {
			q[j] = keys[rng.IntN(n)]
			if rng.IntN(3) == 0 {
				q[j] = rng.Uint64()
			}
		}
		var a, b winGroup
		hashGroup(&a, &q[0], m, tb.nb, dir)
		hashGroupGo(&b, &q[0], m, tb.nb, dir)
		placeGroup(&a, m, dir, rec, rs, last)
		placeGroupGo(&b, m, dir, rec, rs, last)
		if a != b {
			t.Fatalf("round %d: assembly %+v, Go %+v", round, a, b)
		}
		if round%4 == 0 { // windows at the ends of the table
			for j := range m {
				a.start[j] = int32(rng.IntN(2)) * int32(last)
			}
			b = a
		}
		outA, outB := make([]int32, m), make([]int32, m)
		wA, wB := make([]float32, m), make([]float32, m)
		var wpA, wpB *float32
		if round%2 == 0 {
			wpA, wpB = &wA[0], &wB[0]
		}
		missA := settleGroup(&a, m, rec, rs, int64(tb.n), &outA[0], wpA)
		missB := settleGroupGo(&b, m, rec, rs, int64(tb.n), &outB[0], wpB)
		if missA != missB {
			t.Fatalf("round %d: miss %b, Go %b", round, missA, missB)
		}
		for j := range m {
			if missA&(1<<j) != 0 {
				misses++
				continue // left to the caller
			}
			if outA[j] != outB[j] || wA[j] != wB[j] {
				t.Fatalf("round %d key %d: %d %v, Go %d %v", round, q[j], outA[j], wA[j], outB[j], wB[j])
			}
			if want := int32(tb.findOne(codec.KeyHash(q[j]))); outA[j] != want {
				t.Fatalf("round %d key %d: %d, findOne %d", round, q[j], outA[j], want)
			}
		}
	}
	if misses == 0 {
		t.Fatal("no key fell outside its window: the miss path went untested")
	}
}
