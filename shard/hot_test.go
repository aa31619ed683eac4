package shard

import (
	"slices"
	"testing"
)

// sampleKeys has t sample n keys, from first on, in calls of call keys.
func sampleKeys(t *Table, first, n, call uint64) {
	keys := make([]uint64, call)
	for k := first; k < first+n; k += call {
		for i := range keys {
			keys[i] = k + uint64(i)
		}
		t.Sample(keys)
	}
}

// Under heavy traffic lookups sample fewer keys, so that a drain finds
// about sampleDrain of them whatever the traffic, and every key again
// once the traffic is light.
func TestSampleStride(t *testing.T) {
	s := new(sampler)
	tb := &Table{sample: s}
	count := func() (n int) {
		s.drain(func(*Table, uint64) { n++ })
		return n
	}
	sampleKeys(tb, 0, 1<<20, 1<<12) // 32 drains' worth
	if n := count(); n != sampleRing {
		t.Fatalf("a drain after 2^20 keys found %d samples, want the ring's %d", n, sampleRing)
	}
	for range 3 {
		sampleKeys(tb, 0, 1<<20, 1<<12)
		if n := count(); n < sampleDrain/2 || n > 2*sampleDrain {
			t.Fatalf("at a steady 2^20 keys a drain, a drain found %d samples (stride %d), want about %d", n, s.stride.Load(), sampleDrain)
		}
	}
	// Light traffic: every key again, after one drain at the old stride.
	sampleKeys(tb, 0, 1000, 100)
	count()
	sampleKeys(tb, 0, 1000, 100)
	if n := count(); n != 1000 {
		t.Fatalf("after heavy traffic, a drain of 1,000 keys found %d samples, want all (stride %d)", n, s.stride.Load())
	}
	// Calls smaller than the stride are still sampled, in their share.
	s.stride.Store(10)
	sampleKeys(tb, 0, 1000, 4)
	if n := count(); n < 50 || n > 150 {
		t.Fatalf("250 calls of 4 keys at stride 10: %d samples, want about 100", n)
	}
}

// A drain's samples are grouped by table, whatever their order, in
// buffers kept from drain to drain.
func TestHeardGroups(t *testing.T) {
	s := new(sampler)
	a, b := &Table{sample: s}, &Table{sample: s}
	var h heard
	for round := range 3 {
		sampleKeys(a, 0, 300, 100)
		sampleKeys(b, 1000, 200, 100)
		sampleKeys(a, 300, 100, 50)
		got := h.group(s)
		if len(got) != 2 {
			t.Fatalf("round %d: %d tables, want 2", round, len(got))
		}
		for _, c := range []struct {
			t           *Table
			first, keys uint64
		}{{a, 0, 400}, {b, 1000, 200}} {
			want := make([]uint64, c.keys)
			for i := range want {
				want[i] = c.first + uint64(i)
			}
			if !slices.Equal(got[c.t], want) {
				t.Fatalf("round %d: a table's samples %v, want %v", round, got[c.t], want)
			}
		}
		h.release()
		if len(h.tables) != 0 || len(h.counts) != 0 || len(h.drained) != 0 || h.drained[:1][0].t != nil {
			t.Fatalf("round %d: the buffers hold tables after release", round)
		}
	}
}
