package loader

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/partition"
)

// TestCompact: a chain of int8-quantized FM deltas (upserts and deletes)
// compacted into a full version holds, for every key, exactly the bytes
// the chain resolves it to, newest first (so every score is identical),
// and no deleted key; a compaction racing a newer version publishes
// nothing.
func TestCompact(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	base, err := repo.Generate(GenSpec{Name: "m", Type: codec.TypeFM, Dim: 4, Params: 5000, Partitions: 3, Encoding: "int8", Seed: 3, Dense: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Compact("m", base.Version); err == nil {
		t.Fatal("compacting a full version succeeded")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	top := base
	for range 4 {
		up := &Sparse{Type: codec.TypeFM, Dim: 4}
		seen := map[uint64]bool{}
		var dels []uint64
		for range 300 {
			k := rng.Uint64N(6000) // some new keys, some old
			if seen[k] {
				continue
			}
			seen[k] = true
			if rng.IntN(4) == 0 {
				dels = append(dels, k)
				continue
			}
			up.Keys = append(up.Keys, k)
			for range 5 {
				up.Values = append(up.Values, float32(rng.NormFloat64()))
			}
		}
		if top, err = repo.PublishDelta("m", Delta{Upserts: up, Deletes: dels}); err != nil {
			t.Fatal(err)
		}
	}
	full, err := repo.Compact("m", 0)
	if err != nil {
		t.Fatal(err)
	}
	if full.Kind != codec.KindFull || full.Version != top.Version+1 || full.Bias != top.Bias || full.Encoding != "int8" {
		t.Fatalf("compacted manifest %+v", full)
	}
	chain, err := repo.Chain("m", top.Version)
	if err != nil {
		t.Fatal(err)
	}
	for p := range full.Partitions {
		got, err := repo.ReadPartition(full, p)
		if err != nil {
			t.Fatal(err)
		}
		records := map[uint64][]byte{}
		for j := range got.Count {
			records[got.Key(j)] = got.Records[j*got.RecordSize : (j+1)*got.RecordSize]
		}
		want := 0
		for k := uint64(0); k < 6000; k++ {
			if partition.Of(k, full.Partitions) != p {
				continue
			}
			rec := resolve(t, repo, chain, p, k)
			if rec == nil {
				if records[k] != nil {
					t.Fatalf("key %d: deleted in the chain, present after compaction", k)
				}
				continue
			}
			want++
			if !bytes.Equal(records[k], rec) {
				t.Fatalf("key %d: record % x after compaction, % x in the chain", k, records[k], rec)
			}
		}
		if got.Count != want {
			t.Fatalf("partition %d: %d records, the chain resolves %d", p, got.Count, want)
		}
	}
	// A version published while a compaction runs wins: nothing is
	// published by the compaction.
	w, err := repo.NewVersion(Spec{Name: "m", Type: codec.TypeFM, Dim: 4, Partitions: 3, Encoding: "int8", Newest: top.Version})
	if err != nil {
		t.Fatal(err)
	}
	for p := range uint32(3) {
		if err := w.WritePartition(p, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.Commit(); !errors.Is(err, ErrSuperseded) {
		t.Fatalf("commit after a newer version: %v", err)
	}
}

// resolve is key k's record as chain (newest first) serves it: the
// newest record of k, nil when none or when it deletes k.
func resolve(t *testing.T, repo Repo, chain []*codec.Manifest, p uint32, k uint64) []byte {
	for _, m := range chain {
		pt, err := repo.ReadPartition(m, p)
		if err != nil {
			t.Fatal(err)
		}
		for j := range pt.Count {
			if pt.Key(j) == k {
				if codec.IsTombstone(pt.Value(j, 0)) {
					return nil
				}
				return pt.Records[j*pt.RecordSize : (j+1)*pt.RecordSize]
			}
		}
	}
	return nil
}
