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
// in order. Once the oldest replaced snapshot has no reader, no lookup
// can reach anything only it and older ones held: those tables are
// freed. A reader registers, then checks the snapshot is still current;
// one that lost the race to a swap backs off and takes the new one, so
// it never reads a retired snapshot the reclaimer saw idle.

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

// install makes next the current snapshot; the one it replaces is kept
// for reclaim. Loader goroutine only.
func (s *Shard) install(next *snapshot) {
	s.retired = append(s.retired, s.snap.Swap(next))
}

// reclaim frees the tables of drained snapshots that the current one and
// the newer retired ones no longer hold, waiting up to wait for lookups
// under way to finish. Loader goroutine only.
func (s *Shard) reclaim(wait time.Duration) {
	deadline := time.Now().Add(wait)
	for len(s.retired) > 0 {
		if s.retired[0].readers.Load() != 0 {
			if time.Now().After(deadline) {
				return // freed on a later call
			}
			time.Sleep(100 * time.Microsecond)
			continue
		}
		old := s.retired[0]
		s.retired = s.retired[1:]
		live := map[*Table]bool{}
		for _, sn := range append([]*snapshot{s.snap.Load()}, s.retired...) {
			sn.tables(func(t *Table) { live[t] = true })
		}
		old.tables(func(t *Table) {
			if !live[t] {
				t.release()
			}
		})
	}
}

// release gives the table's memory back now. No lookup may use t after.
func (t *Table) release() {
	if b, ok := t.owner.(*tablemem.Buffer); ok {
		b.Free()
	}
}
