package shard

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/model"
)

// aheadDelta draws a resident delta of n keys, of diskTable's (k*k+k)
// and others, some of them tombstones.
func aheadDelta(t *testing.T, rng *rand.Rand, width int, n int) *Table {
	seen := map[uint64]bool{}
	var keys []uint64
	var vals []float32
	for len(keys) < n {
		k := rng.Uint64N(3000)
		k = k*k + k
		if rng.IntN(4) == 0 {
			k += 1 // not in the base
		}
		if seen[k] {
			continue
		}
		seen[k] = true
		keys = append(keys, k)
		v := make([]float32, width)
		for j := range v {
			v[j] = rng.Float32()*2 - 1
		}
		if rng.IntN(5) == 0 {
			v[0] = codec.Tombstone
			clear(v[1:])
		}
		vals = append(vals, v...)
	}
	return buildTable(t, keys, width, codec.EncFP32, vals)
}

type aheadResult struct {
	vals        []byte
	found       []uint64
	hits, reads int
}

// aheadLookup is the shard's lookup of sections in ver, reading ahead
// or not, its reads taking turns from r.
func aheadLookup(t *testing.T, ver *version, sections []codec.Section, w int, r *ColdReads, ahead, stored bool) (aheadResult, error) {
	sc := new(scratch)
	sc.sec = -1
	if err := sc.req.Decode(codec.AppendLookupRequest(nil, "m", 1, sections)); err != nil {
		t.Fatal(err)
	}
	n := sc.req.NumKeys()
	sc.found = make([]uint64, (n+63)/64)
	sc.stored = stored
	sc.turns = r
	defer sc.ahead.reset()
	if ahead {
		if err := sc.readAhead(context.Background(), ver); err != nil {
			return aheadResult{}, err
		}
	}
	i := 0
	for k, sec := range sc.req.Sections {
		sc.sec = k
		var err error
		if i, err = sc.lookupSection(context.Background(), ver, sec, w, i); err != nil {
			return aheadResult{}, err
		}
	}
	return aheadResult{slices.Clone(sc.vals), slices.Clone(sc.found), sc.hits, sc.reads}, nil
}

// TestReadAheadMatches: a lookup that reads ahead answers exactly what
// one that does not answers, and counts the same hits and reads, through
// io_uring and preads, over stacks of several resident deltas
// (tombstones, overlapping keys), views with resident layers below, a
// mapped delta over a mapped base, bases shared by several sections,
// and duplicate keys; then again once the caches hold some of them.
func TestReadAheadMatches(t *testing.T) {
	for _, dr := range diskReaders(t, 8) {
		t.Run(dr.name, func(t *testing.T) { testReadAheadMatches(t, dr.r) })
	}
}

func testReadAheadMatches(t *testing.T, r *ColdReads) {
	for _, shape := range []model.Shape{{Type: model.FM, Dim: 2}, {Type: model.LR}} {
		t.Run(fmt.Sprint(shape.Type), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 4))
			width := shape.Width()
			base0, _, _ := diskTable(t, shape, "")
			base1, _, _ := diskTable(t, shape, "")
			mdelta, _, _ := diskTable(t, shape, "")
			d := func(n int) *Table { return aheadDelta(t, rng, width, n) }
			ov := newOverlay()
			a, b := d(300), d(300)
			ls := []int{ov.merge(a), ov.merge(b)}
			v1 := newView(ov, ls, 2)
			c := d(300)
			ls5 := []int{ov.merge(c)}
			v5 := newView(ov, ls5, 1)
			ver := &version{
				layers: [][]*Table{
					{d(300), d(300), d(300), base0}, // no view, three resident deltas
					{a, b, d(300), base1},           // a view of two, a resident delta below it
					{base0},                         // a base shared with partition 0
					{mdelta, base1},                 // a mapped delta on a mapped base
					{c, base1},                      // a view on a base from disk
					{d(50)},                         // resident only
				},
				views: []*view{nil, v1, nil, nil, v5, nil},
			}
			var sections []codec.Section
			for p := range ver.layers {
				var keys []uint64
				for range 800 {
					k := rng.Uint64N(3200)
					k = k*k + k + uint64(rng.IntN(3)/2)
					keys = append(keys, k)
					if rng.IntN(10) == 0 {
						keys = append(keys, k) // a duplicate
					}
				}
				sections = append(sections, codec.Section{Partition: uint32(p), Keys: keys})
			}
			// Partition 0 asked twice.
			sections = append(sections, codec.Section{Partition: 0, Keys: slices.Clone(sections[0].Keys[:100])})
			for _, stored := range []bool{false, true} {
				want, err := aheadLookup(t, ver, sections, width, r, false, stored)
				if err != nil {
					t.Fatal(err)
				}
				got, err := aheadLookup(t, ver, sections, width, r, true, stored)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got.vals, want.vals) || !slices.Equal(got.found, want.found) {
					t.Fatalf("stored=%v: reading ahead answers differently", stored)
				}
				if got.hits != want.hits || got.reads != want.reads {
					t.Fatalf("stored=%v: reading ahead counts %d hits %d reads, without %d hits %d reads", stored, got.hits, got.reads, want.hits, want.reads)
				}
			}
			for _, tb := range []*Table{base0, base1, mdelta} {
				if !tb.EnableCache(1 << 20) {
					t.Fatal("no cache")
				}
			}
			want, _ := aheadLookup(t, ver, sections, width, r, false, false)
			for round := range 3 {
				got, err := aheadLookup(t, ver, sections, width, r, true, false)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got.vals, want.vals) || !slices.Equal(got.found, want.found) {
					t.Fatalf("cached, round %d: reading ahead answers differently", round)
				}
			}
		})
	}
}
