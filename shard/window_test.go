package shard

import (
	"io"
	"math"
	"math/rand/v2"
	"slices"
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
		whole    bool // whole keys at any size (format 2), as earlier builds wrote
	}{
		{60000, 1, codec.EncFP32, true, true},
		{60000, 4, codec.EncFP32, false, true},
		{7, 1, codec.EncFP32, false, false},
		{window, 1, codec.EncFP32, true, false},
		{window + 1, 1, codec.EncFP32, true, false},
		{100, 1, codec.EncFP32, true, false},
		{4080, 1, codec.EncFP32, true, false}, // the most records with whole keys
		{4081, 1, codec.EncFP32, true, false}, // 256 buckets: 7-byte quotiented keys
		{60000, 1, codec.EncFP32, true, false},
		{1<<20 + 1, 1, codec.EncFP32, true, false}, // 65,536 buckets: 6-byte keys
		{60000, 2, codec.EncFP16, true, false},
		{60000, 1, codec.EncInt8, true, false},
		{60000, 4, codec.EncFP32, false, false},
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
		write := codec.WritePartition
		if tc.whole {
			write = codec.WriteWholeKeys
		}
		tb := buildTableWith(t, write, keys, tc.width, tc.e, vals)
		if tb.quot != (!tc.whole && codec.Quotiented(tc.n, tc.width, tc.e)) {
			t.Fatalf("n=%d width=%d %v: quotiented keys %v", tc.n, tc.width, tc.e, tb.quot)
		}
		if got := tb.windowed(); got != tc.windowed {
			t.Fatalf("n=%d width=%d %v: windowed=%v, want %v", tc.n, tc.width, tc.e, got, tc.windowed)
		}
		query := []uint64{0, math.MaxUint64, 2, math.MaxUint64 - 2}
		for len(query) < 20000 { // ~600 keys outside their window: several rounds of resolveOutside
			k := keys[rng.IntN(len(keys))]
			switch rng.IntN(5) {
			case 0:
				k++ // usually absent, next to a present key
			case 1:
				k = rng.Uint64()
			case 2:
				// Absent, with an h next to a present key's: the same
				// bucket, the nearest place a quotiented key can have.
				k = codec.KeyUnhash(codec.KeyHash(k) + 1 - 2*uint64(rng.IntN(2)))
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
				if tb.hashAt(int(idx[j])) != codec.KeyHash(q) {
					t.Fatalf("key %d: found record %d holds another key", q, idx[j])
				}
			}
			if w[j] != want {
				t.Fatalf("n=%d: key %d weight %v, want %v", tc.n, q, w[j], want)
			}
		}
	}
}

// scanWindows (assembly on amd64) does exactly what its Go reference
// does, including windows clamped at both ends of the table (of the
// bucket, with quotiented keys), buckets too small for a window, and keys
// whose place lies outside their window: with whole keys (format 2) and
// quotiented ones of 7 and 6 bytes (format 4).
func TestScanWindowsMatchesGo(t *testing.T) {
	for _, n := range []int{4000, 20000, 1<<20 + 1} {
		scanWindowsMatchesGo(t, n, codec.WritePartition)
	}
	scanWindowsMatchesGo(t, 20000, codec.WriteWholeKeys)
}

func scanWindowsMatchesGo(t *testing.T, n int, write func(io.Writer, uint32, int, codec.Encoding, []uint64, []float32) (codec.FileSum, error)) {
	rng := rand.New(rand.NewPCG(5, uint64(n)))
	keys := make([]uint64, n)
	for i := range keys {
		keys[i] = rng.Uint64()
	}
	// Keys whose hashes sort first and last: their windows are clamped.
	ends := []uint64{codec.KeyUnhash(0), codec.KeyUnhash(5), codec.KeyUnhash(math.MaxUint64), codec.KeyUnhash(math.MaxUint64 - 9)}
	copy(keys, ends)
	vals := make([]float32, n)
	for i := range vals {
		vals[i] = float32(i)
	}
	tb := buildTableWith(t, write, keys, 1, codec.EncFP32, vals)
	args := func(q []uint64, out []int32, w []float32) *windowScan {
		var a windowScan
		tb.tableArgs(&a)
		a.keys, a.n, a.out = unsafe.SliceData(q), len(q), unsafe.SliceData(out)
		if w != nil {
			a.w = unsafe.SliceData(w)
		}
		return &a
	}
	var outsides int
	for round := range 300 {
		q := make([]uint64, rng.IntN(200))
		for j := range q {
			switch rng.IntN(4) {
			case 0:
				q[j] = rng.Uint64() // absent
			case 1:
				q[j] = ends[rng.IntN(len(ends))]
			default:
				q[j] = keys[rng.IntN(n)]
			}
		}
		outA, outB := make([]int32, len(q)), make([]int32, len(q))
		wA, wB := make([]float32, len(q)), make([]float32, len(q))
		for j := range wA {
			wA[j], wB[j] = 7, 7
		}
		if round%2 == 0 {
			wA, wB = nil, nil
		}
		a, b := args(q, outA, wA), args(q, outB, wB)
		a.scan()
		scanWindowsGo(b)
		if a.nout != b.nout || a.outs != b.outs {
			t.Fatalf("round %d: outside list %d %v, Go %d %v", round, a.nout, a.outs[:a.nout], b.nout, b.outs[:b.nout])
		}
		for j := range q {
			if outA[j] != outB[j] || (wA != nil && wA[j] != wB[j]) {
				t.Fatalf("round %d key %d: %d, Go %d (weights %v, %v)", round, q[j], outA[j], outB[j], wA, wB)
			}
			if outA[j] == outside {
				if !slices.Contains(a.outs[:a.nout], int32(j)) {
					t.Fatalf("round %d: key %d marked outside, not listed", round, j)
				}
				outsides++
				continue
			}
			if want := int32(tb.findOne(codec.KeyHash(q[j]))); outA[j] != want {
				t.Fatalf("n=%d round %d key %d: %d, findOne %d", n, round, q[j], outA[j], want)
			}
		}
	}
	if outsides == 0 {
		t.Fatalf("n=%d: no key fell outside its window: that path went untested", n)
	}
}

// A batch with more keys outside their windows than scanWindows lists
// (outsideCap) is still answered in full.
func TestFindManyOutside(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	const n = 50000
	keys := make([]uint64, n)
	vals := make([]float32, n)
	for i := range keys {
		keys[i], vals[i] = rng.Uint64(), float32(i)
	}
	tb := buildTable(t, keys, 1, codec.EncFP32, vals)
	// Keys whose place lies outside their window, found one at a time.
	var far []int
	out := make([]int32, 1)
	for i, k := range keys {
		var a windowScan
		tb.tableArgs(&a)
		a.keys, a.n, a.out = &k, 1, &out[0]
		a.scan()
		if out[0] == outside {
			far = append(far, i)
		}
	}
	if len(far) < 100 {
		t.Fatalf("only %d keys outside their windows", len(far))
	}
	var q []uint64
	var want []float32
	for len(q) < 3*outsideCap {
		i := far[rng.IntN(len(far))]
		q, want = append(q, keys[i]), append(want, vals[i])
	}
	idx, w := make([]int32, len(q)), make([]float32, len(q))
	tb.FindWeights(q, idx, w)
	for j := range q {
		if idx[j] < 0 || w[j] != want[j] {
			t.Fatalf("key %d: record %d weight %v, want %v", q[j], idx[j], w[j], want[j])
		}
	}
}
