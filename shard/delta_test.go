package shard

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cumulus-serving/cumulus/internal/partition"
	"github.com/cumulus-serving/cumulus/internal/tablemem"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
)

// TestDeltaSharesUnchangedPartitions: a one-key delta (format 2) is
// loaded by reading its one file; its other partitions are its parent's
// tables, shared, not copies. Dropping the parent frees none of them
// (the delta still serves them); dropping the delta too frees them all,
// once.
func TestDeltaSharesUnchangedPartitions(t *testing.T) {
	const parts = 4
	cli := testenv.Etcd(t)
	repo := loader.Repo{Dir: t.TempDir()}
	full := func(scale float32) *loader.Sparse { return bigLR(800_000, scale) }
	if _, err := repo.Publish("m", full(1), parts, ""); err != nil {
		t.Fatal(err)
	}
	const changed = uint64(77)
	d, err := repo.PublishDelta("m", loader.Delta{Upserts: &loader.Sparse{Shape: model.Shape{Type: model.LR}, Keys: []uint64{changed}, Values: []float32{-5}}})
	if err != nil {
		t.Fatal(err)
	}
	touched := partition.Of(changed, parts)
	if len(d.Files) != 1 || d.Files[0].Partition != touched {
		t.Fatalf("one-key delta has files for %v, want partition %d only", d.Touched(), touched)
	}
	s, err := Start(context.Background(), Options{ID: "s1", Repo: repo, Etcd: cli, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	holdsAll := func(v uint64) func() error {
		return func() error {
			ver := s.snap.Load().get("m", v)
			for p := range parts {
				if ver == nil || ver.layers[p] == nil {
					return fmt.Errorf("version %d partition %d not loaded", v, p)
				}
			}
			return nil
		}
	}
	putMap(t, cli, repo, parts, 1, 0)
	testenv.Eventually(t, 10*time.Second, holdsAll(1))
	loads := testutil.ToFloat64(s.metrics.loads)
	putMap(t, cli, repo, parts, 2, 0, 1)
	testenv.Eventually(t, 10*time.Second, holdsAll(2))
	if got := testutil.ToFloat64(s.metrics.loads) - loads; got != 1 {
		t.Errorf("the one-key delta cost %v partition loads, want 1", got)
	}
	snap := s.snap.Load()
	v1, v2 := snap.get("m", 1), snap.get("m", 2)
	var bufs []*tablemem.Buffer
	for p := range uint32(parts) {
		base := v1.layers[p][0]
		bufs = append(bufs, base.owner.(*tablemem.Buffer))
		switch l := v2.layers[p]; {
		case p == touched && (len(l) != 2 || l[1] != base || l[0].fv != 2):
			t.Errorf("touched partition %d: stack %v, want the delta's table over the parent's", p, l)
		case p != touched && (len(l) != 1 || l[0] != base):
			t.Errorf("unchanged partition %d: stack %v, want the parent's table, shared", p, l)
		}
		if v2.ids[p] != v1.ids[p] && p != touched {
			t.Errorf("unchanged partition %d: identity %s, want the parent's %s", p, v2.ids[p], v1.ids[p])
		}
	}
	keys := []uint64{changed, 78, 5, 600_001}
	r, err := lookup(s, 2, parts, keys)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		want := float32(k % 101)
		if k == changed {
			want = -5
		}
		if !r.Found(i) || r.Value(i, 0) != want {
			t.Errorf("version 2, key %d: %v, want %v", k, r.Value(i, 0), want)
		}
	}

	// The parent goes: everything it held is still the delta's.
	putMap(t, cli, repo, parts, 2, 0)
	testenv.Eventually(t, 10*time.Second, func() error {
		if s.snap.Load().get("m", 1) != nil {
			return errors.New("version 1 still held")
		}
		return nil
	})
	if _, err := lookup(s, 2, parts, keys); err != nil {
		t.Fatal(err)
	}
	for p, b := range bufs {
		if b.Freed() {
			t.Fatalf("partition %d's base freed while version 2 serves it", p)
		}
	}

	// A new full version replaces both: every old table is freed.
	if _, err := repo.Publish("m", full(2), parts, ""); err != nil {
		t.Fatal(err)
	}
	putMap(t, cli, repo, parts, 3, 0)
	testenv.Eventually(t, 10*time.Second, func() error {
		for p, b := range bufs {
			if !b.Freed() {
				putMap(t, cli, repo, parts, 3, 0) // any news: the loader reclaims on its next pass
				return fmt.Errorf("partition %d's old base not freed", p)
			}
		}
		return nil
	})
}
