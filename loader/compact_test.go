package loader

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/partition"
	"github.com/cumulus-serving/cumulus/model"
)

// TestCompact: a chain of int8-quantized FM deltas (upserts and deletes)
// compacted into a full version holds, for every key, exactly the bytes
// the chain resolves it to, newest first (so every score is identical),
// and no deleted key; deltas racing a compaction are copied onto it; a
// full version racing it makes it publish nothing.
func TestCompact(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	base, err := repo.Generate(GenSpec{Name: "m", Shape: model.Shape{Type: model.FM, Dim: 4}, Params: 5000, Partitions: 3, Encoding: "int8", Seed: 3, Dense: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Compact("m", base.Version); err == nil {
		t.Fatal("compacting a full version succeeded")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	top := base
	for range 4 {
		top = publishSome(t, repo, rng, 0)
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
			records[got.Key(j)] = got.AppendRecord(nil, j)
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
	// A compaction racing deltas on its line: they are copied onto it,
	// and a delta published later on one of them lands on its copy; a
	// full version published meanwhile makes the compaction publish
	// nothing.
	d1 := publishSome(t, repo, rng, 0)
	chain1, err := repo.Chain("m", d1.Version)
	if err != nil {
		t.Fatal(err)
	}
	w, err := repo.NewVersion(Spec{Name: "m", Shape: model.Shape{Type: model.FM, Dim: 4}, Bias: d1.Bias, Partitions: 3, Encoding: "int8", SameAs: d1.Version})
	if err != nil {
		t.Fatal(err)
	}
	for p := range uint32(3) {
		records, err := repo.mergeChain(chain1, p, false)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.WriteRecords(p, records); err != nil {
			t.Fatal(err)
		}
	}
	d2 := publishSome(t, repo, rng, 0) // while the compaction runs
	compacted, err := w.Commit()
	if err != nil {
		t.Fatal(err)
	}
	latest, _ := repo.Latest("m")
	copied, err := repo.Manifest("m", latest)
	if err != nil {
		t.Fatal(err)
	}
	if compacted.SameAs != d1.Version || copied.SameAs != d2.Version || copied.Parent != compacted.Version || copied.Version != compacted.Version+1 {
		t.Fatalf("compaction %d (same as %d), then %d (same as %d, on %d); want a copy of %d on the compaction", compacted.Version, compacted.SameAs,
			copied.Version, copied.SameAs, copied.Parent, d2.Version)
	}
	d3 := publishSome(t, repo, rng, d2.Version) // built on d2, published after the rebase
	if d3.Parent != copied.Version {
		t.Fatalf("a delta on %d landed on %d, want its copy %d", d2.Version, d3.Parent, copied.Version)
	}
	oldChain, err := repo.Chain("m", d2.Version)
	if err != nil {
		t.Fatal(err)
	}
	newChain, err := repo.Chain("m", copied.Version)
	if err != nil {
		t.Fatal(err)
	}
	if len(newChain) != 2 {
		t.Fatalf("the copy's chain has %d links, want 2 (it and the compaction)", len(newChain))
	}
	for k := uint64(0); k < 6000; k += 7 {
		p := partition.Of(k, 3)
		if a, b := resolve(t, repo, oldChain, p, k), resolve(t, repo, newChain, p, k); !bytes.Equal(a, b) {
			t.Fatalf("key %d: % x through the copy, % x through the original", k, b, a)
		}
	}
	w, err = repo.NewVersion(Spec{Name: "m", Shape: model.Shape{Type: model.FM, Dim: 4}, Partitions: 3, Encoding: "int8", SameAs: d3.Version})
	if err != nil {
		t.Fatal(err)
	}
	for p := range uint32(3) {
		if err := w.WritePartition(p, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := repo.Publish("m", &Sparse{Shape: model.Shape{Type: model.FM, Dim: 4}, Keys: []uint64{1}, Values: []float32{1, 0, 0, 0, 0}}, 3, ""); err != nil {
		t.Fatal(err)
	}
	before, _ := repo.Latest("m")
	if _, err := w.Commit(); !errors.Is(err, ErrSuperseded) {
		t.Fatalf("compaction after a full version: %v", err)
	}
	if after, _ := repo.Latest("m"); after != before {
		t.Fatalf("a superseded compaction published version %d", after)
	}
	// A delta on the line that cannot be copied (a file gone) fails the
	// compaction before anything is published: it would hide the delta.
	e1 := publishSome(t, repo, rng, 0)
	w, err = repo.NewVersion(Spec{Name: "m", Shape: model.Shape{Type: model.FM, Dim: 4}, Partitions: 3, Encoding: "int8", SameAs: e1.Version})
	if err != nil {
		t.Fatal(err)
	}
	for p := range uint32(3) {
		if err := w.WritePartition(p, nil, nil); err != nil {
			t.Fatal(err)
		}
	}
	e2 := publishSome(t, repo, rng, 0)
	if err := os.Remove(filepath.Join(repo.VersionDir("m", e2.Version), e2.Files[1].Path)); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Commit(); err == nil || !strings.Contains(err.Error(), "cannot be copied") {
		t.Fatalf("compaction with an uncopyable delta on its line: %v", err)
	}
	if after, _ := repo.Latest("m"); after != e2.Version {
		t.Fatalf("newest %d after a refused compaction, want %d", after, e2.Version)
	}
}

// publishSome publishes a delta of random upserts and deletes on parent
// (0: the newest).
func publishSome(t *testing.T, repo Repo, rng *rand.Rand, parent uint64) *codec.Manifest {
	t.Helper()
	up := &Sparse{Shape: model.Shape{Type: model.FM, Dim: 4}}
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
	m, err := repo.PublishDelta("m", Delta{Upserts: up, Deletes: dels, Parent: parent})
	if err != nil {
		t.Fatal(err)
	}
	return m
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
				return pt.AppendRecord(nil, j)
			}
		}
	}
	return nil
}

// TestCompactDeltas: a chain of small FM deltas (upserts and deletes,
// each touching a few of 16 partitions) merged into one delta on the
// full version resolves every key to the bytes the chain did, deletions
// included; it writes only the partitions the deltas touched; a delta
// published afterwards on the compacted version lands on the merge.
func TestCompactDeltas(t *testing.T) {
	for _, pack := range []bool{false, true} {
		t.Run(fmt.Sprintf("pack=%v", pack), func(t *testing.T) { compactDeltas(t, pack) })
	}
}

// compactDeltas is TestCompactDeltas over deltas packed (their
// partitions sections of one file, format 3) or not.
func compactDeltas(t *testing.T, pack bool) {
	repo := Repo{Dir: t.TempDir()}
	shape := model.Shape{Type: model.FM, Dim: 4}
	base, err := repo.Generate(GenSpec{Name: "m", Shape: shape, Params: 5000, Partitions: 16, Seed: 3, Dense: true})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	var top *codec.Manifest
	for i := range 6 {
		up := &Sparse{Shape: shape}
		keys := []uint64{uint64(rng.IntN(6000)), uint64(rng.IntN(6000)), 42} // key 42 in every delta: newest wins
		for _, k := range keys {
			up.Keys = append(up.Keys, k)
			up.Values = append(up.Values, float32(i), 1, 2, 3, float32(k))
		}
		var dels []uint64
		if i%2 == 1 {
			dels = []uint64{uint64(i)} // base keys 1, 3, 5 deleted
		}
		if top, err = repo.PublishDelta("m", Delta{Upserts: up, Deletes: dels, Pack: pack}); err != nil {
			t.Fatal(err)
		}
		if got := top.Format == codec.PackedFormat; got != pack || (pack && top.Files[len(top.Files)-1].Offset == 0) {
			t.Fatalf("delta %d: format %d, files %+v", top.Version, top.Format, top.Files)
		}
		if err := repo.Verify(top); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := repo.CompactDeltas("m", base.Version); err == nil {
		t.Fatal("merging the deltas of a full version succeeded")
	}
	merged, err := repo.CompactDeltas("m", top.Version)
	if err != nil {
		t.Fatal(err)
	}
	if merged.Kind != codec.KindDelta || merged.Parent != base.Version || merged.SameAs != top.Version || len(merged.Files) >= 16 {
		t.Fatalf("merged: kind %s parent %d same_as %d, %d files", merged.Kind, merged.Parent, merged.SameAs, len(merged.Files))
	}
	old, err := repo.Chain("m", top.Version)
	if err != nil {
		t.Fatal(err)
	}
	now, err := repo.Chain("m", merged.Version)
	if err != nil || len(now) != 2 {
		t.Fatalf("the merge's chain: %d versions, %v", len(now), err)
	}
	for p := range uint32(16) {
		for k := uint64(0); k < 6000; k++ {
			if partition.Of(k, 16) != p {
				continue
			}
			if a, b := resolveLayers(t, repo, old, p, k), resolveLayers(t, repo, now, p, k); !bytes.Equal(a, b) {
				t.Fatalf("key %d: % x in the chain, % x after the merge", k, a, b)
			}
		}
	}
	if resolveLayers(t, repo, now, partition.Of(3, 16), 3) != nil {
		t.Fatal("key 3, deleted by a delta, is back after the merge")
	}
	later, err := repo.PublishDelta("m", Delta{Upserts: &Sparse{Shape: shape, Keys: []uint64{7}, Values: []float32{1, 1, 1, 1, 1}}, Parent: top.Version})
	if err != nil || later.Parent != merged.Version {
		t.Fatalf("a delta on the compacted version: parent %d, %v; want the merge, %d", later.Parent, err, merged.Version)
	}
	if !pack {
		return
	}
	// A packed partition maps as a file of its own does.
	last := top.Files[len(top.Files)-1]
	pt, err := repo.MapPartitionCopy(top, last.Partition, t.TempDir())
	if err != nil || int64(pt.Count) != last.Keys {
		t.Fatalf("mapping packed partition %d: %v", last.Partition, err)
	}
	// A damaged section is found, and named by its partition.
	path := filepath.Join(repo.VersionDir("m", top.Version), last.Path)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[last.Offset+last.Size-1] ^= 1
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	repo.Manifests = nil
	if err := repo.Verify(top); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("partition %d at byte %d", last.Partition, last.Offset)) {
		t.Fatalf("a damaged section: %v", err)
	}
	if _, err := repo.ReadPartition(top, last.Partition); err == nil {
		t.Fatal("a damaged section was read")
	}
}

// resolveLayers is key k's record in partition p of chain, read through
// the layers that hold the partition (nil: deleted or absent).
func resolveLayers(t *testing.T, repo Repo, chain []*codec.Manifest, p uint32, k uint64) []byte {
	t.Helper()
	return resolve(t, repo, codec.Layers(chain, p), p, k)
}

// TestPublishFence: a delta whose fence refuses, asked under the lock
// just before the rename, publishes nothing and leaves nothing behind.
func TestPublishFence(t *testing.T) {
	repo := Repo{Dir: t.TempDir()}
	shape := model.Shape{Type: model.LR}
	if _, err := repo.Publish("m", &Sparse{Shape: shape, Keys: []uint64{1}, Values: []float32{1}}, 2, ""); err != nil {
		t.Fatal(err)
	}
	deposed := errors.New("not the leader")
	_, err := repo.PublishDelta("m", Delta{Upserts: &Sparse{Shape: shape, Keys: []uint64{2}, Values: []float32{2}}, Fence: func() error { return deposed }})
	if !errors.Is(err, deposed) {
		t.Fatalf("fenced publish: %v", err)
	}
	ents, _ := os.ReadDir(filepath.Join(repo.Dir, "m"))
	var names []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".lock") && !strings.HasPrefix(e.Name(), ".high") {
			names = append(names, e.Name())
		}
	}
	if strings.Join(names, " ") != "1" {
		t.Fatalf("after a fenced publish the model's directory holds %v", names)
	}
}
