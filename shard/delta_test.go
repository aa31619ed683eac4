package shard

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/codec"
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
		if (v2.views[p] != nil) != (p == touched) || v1.views[p] != nil {
			t.Errorf("partition %d: views %v (version 1) and %v (version 2); want a view where the delta has a file, only", p, v1.views[p], v2.views[p])
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

// TestViewsThroughABranch: deltas on a base, a rollback and a delta on
// the older version (a branch); every kept version answers its own
// chain's values through one overlay per partition. Once the abandoned
// branch's big delta is dropped, the overlay is rebuilt without it and
// its memory given back, and the versions left answer as before.
func TestViewsThroughABranch(t *testing.T) {
	const parts = 2
	cli := testenv.Etcd(t)
	repo := loader.Repo{Dir: t.TempDir()}
	if _, err := repo.Publish("m", bigLR(100_000, 1), parts, ""); err != nil {
		t.Fatal(err)
	}
	want := map[uint64]map[uint64]float32{1: {}}
	for k := uint64(1); k <= 100_000; k++ {
		want[1][k] = float32(k % 101)
	}
	// publish a delta on parent: upserts of keys lo..hi to v, deletions of dels.
	publish := func(parent uint64, lo, hi uint64, v float32, dels []uint64) uint64 {
		up := &loader.Sparse{Shape: model.Shape{Type: model.LR}}
		for k := lo; k <= hi; k++ {
			up.Keys, up.Values = append(up.Keys, k), append(up.Values, v)
		}
		m, err := repo.PublishDelta("m", loader.Delta{Upserts: up, Deletes: dels, Parent: parent})
		if err != nil {
			t.Fatal(err)
		}
		w := maps.Clone(want[parent])
		for k := lo; k <= hi; k++ {
			w[k] = v
		}
		for _, k := range dels {
			delete(w, k)
		}
		want[m.Version] = w
		return m.Version
	}
	v2 := publish(1, 1, 1000, -2, []uint64{5000, 5001})
	v3 := publish(v2, 1, 60_000, -3, []uint64{70_000}) // big: abandoned below
	v4 := publish(v2, 500, 1500, -4, []uint64{9})      // on v2, after a rollback from v3
	v5 := publish(v4, 5000, 5000, -5, nil)             // writes a deleted key again
	s, err := Start(context.Background(), Options{ID: "s1", Repo: repo, Etcd: cli, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	keys := []uint64{1, 5, 7, 9, 70_000, 499, 500, 1000, 1001, 1500, 1501, 4999, 5000, 5001, 59_999, 60_000, 60_001, 99_999, 100_000, 100_001}
	check := func(vs ...uint64) {
		t.Helper()
		for _, v := range vs {
			ks := slices.Clone(keys)
			r, err := lookup(s, v, parts, ks)
			if err != nil {
				t.Fatalf("version %d: %v", v, err)
			}
			k := 0
			for i, key := range ks {
				w, ok := want[v][key]
				if r.Found(i) != ok || ok && r.Value(k, 0) != w {
					t.Errorf("version %d, key %d: found %v, want %v (%v)", v, key, r.Found(i), ok, w)
				}
				if r.Found(i) {
					k++
				}
			}
		}
	}
	held := func(vs ...uint64) func() error {
		return func() error {
			for _, v := range vs {
				ver := s.snap.Load().get("m", v)
				for p := range parts {
					if ver == nil || ver.layers[p] == nil {
						return fmt.Errorf("version %d partition %d not loaded", v, p)
					}
				}
			}
			return nil
		}
	}
	putMap(t, cli, repo, parts, v5, 0, v4, v3, v2, 1)
	testenv.Eventually(t, 10*time.Second, held(v5, v4, v3, v2, 1))
	check(v5, v4, v3, v2, 1)
	snap := s.snap.Load()
	for p := range parts {
		ov := snap.get("m", v5).views[p].ov
		for _, v := range []uint64{v4, v3, v2} {
			if x := snap.get("m", v).views[p]; x == nil || x.ov != ov {
				t.Fatalf("partition %d: version %d does not read the overlay version %d reads", p, v, v5)
			}
		}
	}
	before := s.overlayBytes.Load()
	putMap(t, cli, repo, parts, v5, 0, v4, v2, 1)
	testenv.Eventually(t, 10*time.Second, func() error {
		if s.snap.Load().get("m", v3) != nil {
			return errors.New("version 3 still held")
		}
		if after := s.overlayBytes.Load(); after >= before/2 {
			return fmt.Errorf("overlays hold %d bytes after the big delta went, %d before: not rebuilt without it", after, before)
		}
		return nil
	})
	check(v5, v4, v2, 1)
	// Everything on the base goes: so do its overlays.
	putMap(t, cli, repo, parts, 1, 0)
	testenv.Eventually(t, 10*time.Second, func() error {
		if n := s.overlayBytes.Load(); n != 0 {
			putMap(t, cli, repo, parts, 1, 0)
			return fmt.Errorf("overlays hold %d bytes with no delta held", n)
		}
		return nil
	})
	check(1)
}

// TestStackFile: a stack's tables are found by file version (the base,
// each delta), and a version the stack lacks is not.
func TestStackFile(t *testing.T) {
	base := &Table{fv: 1}
	var deltas []*Table
	for v := uint64(40); v >= 3; v -= 3 {
		deltas = append(deltas, &Table{fv: v})
	}
	for _, stack := range [][]*Table{{base}, append(slices.Clone(deltas), base)} {
		for _, want := range stack {
			if got := stackFile(stack, want.fv); got != want {
				t.Fatalf("a stack of %d: file version %d found %v", len(stack), want.fv, got)
			}
		}
		for _, v := range []uint64{0, 2, 5, 41, 100} {
			if got := stackFile(stack, v); got != nil {
				t.Fatalf("a stack of %d: file version %d (not in it) found %v", len(stack), v, got)
			}
		}
	}
	if stackFile(nil, 1) != nil {
		t.Fatal("an empty stack found a table")
	}
	// Through a snapshot: version 40 holds its own file on top; version 7
	// (older, no file for partition 1) is searched for the rest; version
	// 41 is held by none.
	older := []*Table{deltas[len(deltas)-2], deltas[len(deltas)-1], base} // 7, 4, 1
	snap := &snapshot{models: map[string]map[uint64]*version{"m": {
		40: {layers: [][]*Table{{base}, append(slices.Clone(deltas), base)}},
		7:  {layers: [][]*Table{{base}, older}},
	}}}
	for _, want := range append(slices.Clone(deltas), base) {
		if got := snap.file("m", want.fv, 1); got != want {
			t.Fatalf("partition 1, file version %d: found %v", want.fv, got)
		}
	}
	if snap.file("m", 41, 1) != nil || snap.file("m", 40, 0) != nil || snap.file("m", 40, 2) != nil || snap.file("x", 40, 1) != nil {
		t.Fatal("a file no stack holds was found")
	}
}

// TestDeltaOnDiskBase: a version over budget, a full version and a delta
// on it, is served from disk whole but for its delta, which stays
// resident and is read through the overlay: rewritten keys answer the
// delta's values, deleted ones are absent, new ones present, the rest the
// base's, read from disk or its value cache. FM, so every value goes the
// way wide records do (LR answers from the weights found). Four
// partitions, so a lookup reads ahead (readAhead) the keys of all of
// them that reach a base on disk, then answers from what it read.
func TestDeltaOnDiskBase(t *testing.T) {
	const parts = 4
	cli := testenv.Etcd(t)
	repo := loader.Repo{Dir: t.TempDir()}
	shape := model.Shape{Type: model.FM, Dim: 2}
	row := func(v float32) []float32 { return []float32{v, v / 2, -v} }
	base := &loader.Sparse{Shape: shape}
	want := map[uint64][]float32{}
	for k := uint64(1); k <= 200_000; k++ {
		base.Keys = append(base.Keys, k)
		base.Values = append(base.Values, row(float32(k%101))...)
		want[k] = row(float32(k % 101))
	}
	if _, err := repo.Publish("m", base, parts, ""); err != nil {
		t.Fatal(err)
	}
	up := &loader.Sparse{Shape: shape}
	for k := uint64(10); k <= 5000; k += 10 {
		up.Keys = append(up.Keys, k)
		up.Values = append(up.Values, row(-float32(k))...)
		want[k] = row(-float32(k))
	}
	for k := uint64(500_001); k <= 500_100; k++ {
		up.Keys = append(up.Keys, k)
		up.Values = append(up.Values, row(3)...)
		want[k] = row(3)
	}
	var dels []uint64
	for k := uint64(15); k <= 5000; k += 100 {
		dels = append(dels, k)
		delete(want, k)
	}
	if _, err := repo.PublishDelta("m", loader.Delta{Upserts: up, Deletes: dels}); err != nil {
		t.Fatal(err)
	}
	s, err := Start(context.Background(), Options{ID: "s1", Repo: repo, Etcd: cli, MemoryBudget: 256 << 10, HotInterval: 20 * time.Millisecond, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	putMap(t, cli, repo, parts, 2, 0)
	keys := make([]uint64, 0, 12000)
	for k := uint64(1); k <= 6000; k++ {
		keys = append(keys, k, 500_000+k%200)
	}
	sections := sectionsOf(keys, parts)
	request := codec.AppendLookupRequest(nil, "m", 2, sections)
	check := func() error {
		raw, err := s.Lookup(context.Background(), request)
		if err != nil {
			return err
		}
		var r codec.LookupResponse
		if err := r.Decode(raw, len(keys), 3, codec.EncFP32); err != nil {
			return err
		}
		i, v := 0, 0
		for _, sec := range sections {
			for _, k := range sec.Keys {
				w, ok := want[k]
				if r.Found(i) != ok {
					return fmt.Errorf("key %d: found %v, want %v", k, r.Found(i), ok)
				}
				if ok {
					for d := range w {
						if got := r.Value(v, d); got != w[d] {
							return fmt.Errorf("key %d value %d: %v, want %v", k, d, got, w[d])
						}
					}
					v++
				}
				i++
			}
		}
		return nil
	}
	// Read ahead before the first lookup, the caches cold: every
	// partition's keys that no delta holds, each with the base's value
	// (or absent), none a delta holds, in one readAhead.
	var ver *version
	testenv.Eventually(t, 20*time.Second, func() error {
		if ver = s.snap.Load().get("m", 2); ver == nil {
			return errors.New("version 2 not loaded yet")
		}
		for p := range parts {
			if l := ver.layers[p]; len(l) != 2 || !l[1].Mapped || l[0].Mapped || ver.views[p] == nil {
				return fmt.Errorf("partition %d: want a resident delta, read through a view, on a base from disk: %d layers, view %v", p, len(l), ver.views[p] != nil)
			}
		}
		return nil
	})
	sc := new(scratch)
	if err := sc.req.Decode(request); err != nil {
		t.Fatal(err)
	}
	if err := sc.readAhead(context.Background(), ver); err != nil {
		t.Fatal(err)
	}
	inDelta := map[uint64]bool{}
	for _, k := range append(slices.Clone(up.Keys), dels...) {
		inDelta[k] = true
	}
	read := map[uint32]int{}
	for _, rd := range sc.ahead.reads {
		read[partition.Of(sc.ahead.keys[rd.g], parts)]++
	}
	if len(read) != parts {
		t.Fatalf("read ahead from %d partitions, want all %d (%d keys read)", len(read), parts, len(sc.ahead.reads))
	}
	for g, k := range sc.ahead.keys {
		if inDelta[k] {
			t.Fatalf("key %d, held by the delta, was read ahead", k)
		}
		w, ok := want[k]
		if got := sc.ahead.out[g] >= 0; got != ok {
			t.Fatalf("key %d read ahead: found %v, want %v", k, got, ok)
		}
		for d := range w {
			if got := math.Float32frombits(binary.LittleEndian.Uint32(sc.ahead.vals[12*g+4*d:])); got != w[d] {
				t.Fatalf("key %d read ahead, value %d: %v, want %v", k, d, got, w[d])
			}
		}
	}
	reach := 0
	for _, k := range keys {
		if !inDelta[k] {
			reach++
		}
	}
	if len(sc.ahead.keys) != reach {
		t.Fatalf("%d keys looked up ahead, want the %d no delta holds", len(sc.ahead.keys), reach)
	}
	sc.ahead.reset()
	// A request naming a partition the shard does not hold fails before
	// anything is read from disk.
	reads := testutil.ToFloat64(s.metrics.diskReads)
	unheld := append([]codec.Section{{Partition: parts + 3, Keys: keys[:1]}}, sections...)
	if _, err := s.Lookup(context.Background(), codec.AppendLookupRequest(nil, "m", 2, unheld)); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a partition not held: %v, want FailedPrecondition", err)
	}
	if n := testutil.ToFloat64(s.metrics.diskReads); n != reads {
		t.Fatalf("a lookup refused for a partition not held read %v keys from disk", n-reads)
	}
	testenv.Eventually(t, 10*time.Second, check)
	// Again once the base's cache has learned the keys.
	testenv.Eventually(t, 10*time.Second, func() error {
		if err := check(); err != nil {
			t.Fatal(err)
		}
		if c := ver.layers[0][1].cache.Load(); c == nil || c.Len() < len(c.hs)/2 {
			return errors.New("the base's cache has not learned yet")
		}
		return nil
	})
	if err := check(); err != nil {
		t.Fatal(err)
	}
}

// TestDeltaResidentOverBudget: a delta is loaded resident even when the
// budget has no room for it (its base and it both over it): mapped, each
// partition of each delta of a chain held a file open.
func TestDeltaResidentOverBudget(t *testing.T) {
	s, cli, repo := diskShardParts(t, 1, 4)
	up := &loader.Sparse{Shape: model.Shape{Type: model.LR}}
	for k := uint64(1); k <= 20000; k++ {
		up.Keys = append(up.Keys, 7*k)
		up.Values = append(up.Values, -1)
	}
	if _, err := repo.PublishDelta("m", loader.Delta{Upserts: up}); err != nil {
		t.Fatal(err)
	}
	putMap(t, cli, repo, 4, 2, 0)
	testenv.Eventually(t, 20*time.Second, func() error {
		ver := s.snap.Load().get("m", 2)
		if ver == nil {
			return errors.New("version 2 not loaded yet")
		}
		for p, l := range ver.layers {
			if len(l) != 2 {
				return fmt.Errorf("partition %d: %d layers", p, len(l))
			}
			if l[0].Mapped || !l[1].Mapped {
				t.Fatalf("partition %d: delta mapped %v, base mapped %v; want a resident delta on a base from disk", p, l[0].Mapped, l[1].Mapped)
			}
		}
		return nil
	})
	keys := []uint64{7, 8, 14, 999}
	r, err := lookup(s, 2, 4, keys) // (reorders keys as answered)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range keys {
		want := float32(k % 1000)
		if k%7 == 0 {
			want = -1
		}
		if !r.Found(i) || r.Value(i, 0) != want {
			t.Fatalf("key %d: %v (found %v), want %v", k, r.Value(i, 0), r.Found(i), want)
		}
	}
}
