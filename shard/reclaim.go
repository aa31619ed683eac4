package shard

import (
	"time"

	"github.com/cumulus-serving/cumulus/internal/tablemem"
)

// Table memory lives outside the Go heap (huge pages, mappings) and is
// given back as soon as no lookup can reach it, without waiting for (or
// forcing) a garbage collection on a latency-critical process.
//
// Lookups register on the snapshot they read (acquire); the loader, the
// only writer, swaps snapshots with install and keeps the replaced ones
// in order. A reader registers, then checks the snapshot is still
// current; one that lost the race to a swap backs off and takes the new
// one, so it never reads a retired snapshot the reclaimer saw idle.
//
// Each table counts the stack slots of the current snapshot that hold it
// (Table.refs). A swap that takes a table's count to zero notes it on the
// snapshot it retired; once that snapshot and every older one have no
// reader, no lookup can reach the table, and it is freed unless a later
// snapshot took it up again. So retiring a snapshot costs in proportion
// to what its swap dropped, and a swap in proportion to the versions it
// changed: neither grows with everything held or with the snapshots
// waiting.

// acquire returns the current snapshot, registered as read until the
// caller calls its done.
func (s *Shard) acquire() *snapshot {
	for {
		sn := s.snap.Load()
		sn.readers.Add(1)
		if s.snap.Load() == sn {
			return sn
		}
		sn.readers.Add(-1)
	}
}

func (sn *snapshot) done() { sn.readers.Add(-1) }

// retiredSnap is a replaced snapshot and the tables its replacement no
// longer holds, to free once no lookup reads it or an older one.
type retiredSnap struct {
	sn    *snapshot
	swap  uint64   // the swap that replaced it
	freed []*Table // tables whose count that swap took to zero
}

// install makes next the current snapshot; the one it replaces is kept
// for reclaim. Loader goroutine only.
func (s *Shard) install(next *snapshot) {
	old := s.snap.Load()
	s.swaps++
	r := retiredSnap{sn: old, swap: s.swaps}
	// Counts up first, then down: a table moved between two stacks in
	// one swap never reaches zero.
	diffStacks(old, next, func(t *Table) {
		if t.refs++; t.refs == 1 {
			s.countResident(t, 1)
		}
	})
	diffStacks(next, old, func(t *Table) {
		if t.refs--; t.refs == 0 {
			t.dropped = s.swaps
			r.freed = append(r.freed, t)
			s.countResident(t, -1)
		}
	})
	s.snap.Store(next)
	s.retired = append(s.retired, r)
}

// countResident adds t's bytes, times sign, to the resident count it
// belongs to.
// (all of a resident table; a table served from disk, its directory:
// its value cache is counted as the loader sizes it).
// It also keeps onDisk, the tables the snapshot serves from disk.
func (s *Shard) countResident(t *Table, sign int64) {
	s.resident.Add(sign * t.ResidentBytes())
	switch {
	case !t.Mapped:
	case sign > 0:
		s.onDisk[t] = struct{}{}
	default:
		delete(s.onDisk, t)
	}
}

// diffStacks calls fn on each table of each stack slot that b holds and
// a does not hold in that slot, once per slot. Versions the two
// snapshots share (the same *version) are not looked into, so a swap
// costs the versions it changed.
func diffStacks(a, b *snapshot, fn func(*Table)) {
	for name, bvs := range b.models {
		avs := a.models[name]
		for v, bv := range bvs {
			av := avs[v]
			if av == bv {
				continue
			}
			for p, bl := range bv.layers {
				var al []*Table
				if av != nil && p < len(av.layers) {
					al = av.layers[p]
				}
				if sameStack(al, bl) {
					continue
				}
				for _, t := range bl {
					if !containsTable(al, t) {
						fn(t)
					}
				}
			}
		}
	}
}

func sameStack(a, b []*Table) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

func containsTable(l []*Table, t *Table) bool {
	for _, x := range l {
		if x == t {
			return true
		}
	}
	return false
}

// reclaim frees the tables of drained snapshots that nothing newer
// holds, waiting up to wait for lookups under way to finish. Loader
// goroutine only.
func (s *Shard) reclaim(wait time.Duration) {
	deadline := time.Now().Add(wait)
	for len(s.retired) > 0 {
		r := s.retired[0]
		if r.sn.readers.Load() != 0 {
			if time.Now().After(deadline) {
				return // freed on a later call
			}
			time.Sleep(100 * time.Microsecond)
			continue
		}
		s.retired[0] = retiredSnap{}
		s.retired = s.retired[1:]
		for _, t := range r.freed {
			// Taken up again since (refs > 0), or dropped again by a
			// later swap (freed with that snapshot): not now.
			if t.refs == 0 && t.dropped == r.swap {
				t.release()
			}
		}
	}
}

// release gives the table's memory back now. No lookup may use t after.
func (t *Table) release() {
	if c := t.cache.Swap(nil); c != nil {
		c.free() // no lookup reaches t, so none reads its cache
	}
	t.abandonGrowth()
	if b, ok := t.owner.(*tablemem.Buffer); ok {
		b.Free()
	}
	if t.dirMem != nil {
		t.dirMem.Free()
	}
}
