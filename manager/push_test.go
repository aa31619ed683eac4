package manager

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/partition"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
)

var pushT0 = time.Date(2026, 11, 27, 8, 0, 0, 0, time.UTC)

func testLimits() PushLimits {
	return PushLimits{Window: time.Second, WindowBytes: 1 << 20, InFlight: 1 << 16, ProducerTTL: time.Hour, MaxProducers: 3}
}

func batch(producer string, seq uint64, ids []uint64, values []float32, deletes ...uint64) *PushBatch {
	return &PushBatch{Model: "m", Producer: producer, Sequence: seq, IDs: ids, Values: values, Deletes: deletes}
}

// TestPushSequences replays the answers a producer's sequences get: the
// next one applied, a duplicate of a sealed or of a pending batch
// answered without applying it, any other refused naming the expected.
func TestPushSequences(t *testing.T) {
	l := newPushLog(testLimits(), 1, 8)
	now := pushT0
	w1, dup, err := l.offer(batch("a", 1, []uint64{1}, []float32{1}), 0, now)
	if err != nil || dup || w1 == nil {
		t.Fatalf("first batch: %v %v %v", w1, dup, err)
	}
	w, dup, err := l.offer(batch("a", 1, []uint64{1}, []float32{9}), 0, now)
	if err != nil || !dup || w != w1 {
		t.Fatalf("retry of a pending batch: want its window as a duplicate, got %v %v %v", w, dup, err)
	}
	_, _, err = l.offer(batch("a", 3, []uint64{1}, []float32{1}), 0, now)
	var se *SequenceError
	if !errors.As(err, &se) || se.Expected != 2 || !errors.Is(err, ErrSequence) {
		t.Fatalf("gap: want a SequenceError expecting 2, got %v", err)
	}
	if _, _, err := l.offer(batch("a", 2, []uint64{2}, []float32{2}), 0, now); err != nil {
		t.Fatal(err)
	}
	if l.due(now.Add(999 * time.Millisecond)) {
		t.Fatal("due before the window is over")
	}
	if !l.due(now.Add(time.Second)) {
		t.Fatal("not due once the window is over")
	}
	taken := l.take()
	ids, values, _ := taken.contents()
	if len(ids) != 2 || len(values) != 2 {
		t.Fatalf("window holds %v %v", ids, values)
	}
	// While it is sealed, the producer goes on into a new window.
	w3, _, err := l.offer(batch("a", 3, []uint64{3}, []float32{3}), 0, now)
	if err != nil || w3 == taken {
		t.Fatalf("batch during sealing: %v (same window: %v)", err, w3 == taken)
	}
	l.sealed(taken, 7, nil)
	<-taken.done
	if taken.version != 7 || taken.err != nil {
		t.Fatalf("answer %d %v", taken.version, taken.err)
	}
	if w, dup, err := l.offer(batch("a", 2, nil, nil), 0, now); w != nil || !dup || err != nil {
		t.Fatalf("retry of a sealed batch: want an immediate duplicate, got %v %v %v", w, dup, err)
	}
	// The state's mark counts: a producer new to this leader, sealed by
	// the one before, resumes after its mark.
	l2 := newPushLog(testLimits(), 1, 8)
	if _, dup, err := l2.offer(batch("a", 5, nil, nil), 5, now); !dup || err != nil {
		t.Fatalf("a new leader took sequence 5 (sealed before) as %v %v", dup, err)
	}
	if _, _, err := l2.offer(batch("a", 7, nil, nil), 5, now); !errors.As(err, &se) || se.Expected != 6 {
		t.Fatalf("a new leader: want 6 expected, got %v", err)
	}
}

// TestPushWindowMerges checks last-wins per id across batches and
// producers, deletions, and what the window counts.
func TestPushWindowMerges(t *testing.T) {
	l := newPushLog(testLimits(), 2, 8)
	for _, b := range []*PushBatch{
		batch("a", 1, []uint64{1, 2, 3}, []float32{1, 1, 2, 2, 3, 3}),
		batch("b", 1, []uint64{2}, []float32{20, 20}, 3),
		batch("a", 2, []uint64{3, 4}, []float32{30, 30, 4, 4}, 1),
	} {
		if _, _, err := l.offer(b, 0, pushT0); err != nil {
			t.Fatal(err)
		}
	}
	w := l.take()
	ids, values, deletes := w.contents()
	got := map[uint64][]float32{}
	for i, id := range ids {
		got[id] = values[2*i : 2*i+2]
	}
	want := map[uint64][]float32{2: {20, 20}, 3: {30, 30}, 4: {4, 4}}
	if fmt.Sprint(got) != fmt.Sprint(want) || !slices.Equal(deletes, []uint64{1}) {
		t.Fatalf("window holds %v, deletes %v; want %v, deletes [1]", got, deletes, want)
	}
	if w.marks["a"] != 2 || w.marks["b"] != 1 {
		t.Fatalf("marks %v", w.marks)
	}
	if w.bytes < 5*rowBytes {
		t.Fatalf("window counts %d bytes for 5 ids", w.bytes)
	}
}

// TestPushBounds checks the bounds: a window sealed early past its
// bytes, a producer's bytes in flight, the producers kept, and idle
// producers forgotten.
func TestPushBounds(t *testing.T) {
	lim := testLimits()
	lim.WindowBytes = 1000
	l := newPushLog(lim, 1, 8)
	ids := make([]uint64, 100)
	for i := range ids {
		ids[i] = uint64(i)
	}
	if _, _, err := l.offer(batch("a", 1, ids, make([]float32, 100)), 0, pushT0); err != nil {
		t.Fatal(err)
	}
	if !l.due(pushT0) {
		t.Fatal("a window past its bytes is not due at once")
	}
	big := make([]uint64, 6000)
	if _, _, err := l.offer(batch("a", 2, big, make([]float32, 6000)), 0, pushT0); !errors.Is(err, ErrBusy) {
		t.Fatalf("over the in-flight bound: %v", err)
	}
	// A batch over the bound alone is refused too: what counts is what
	// it weighs in the window, deletions' rows included, not its
	// encoding (a deletion of a small id is two bytes of protobuf).
	if _, _, err := l.offer(batch("z", 1, nil, nil, big...), 0, pushT0); !errors.Is(err, ErrBusy) {
		t.Fatalf("a first batch of 6,000 deletions, over the bound: %v", err)
	}
	// The open window is bounded too: twice what seals it at once (a's
	// 100 rows are past it already).
	if _, _, err := l.offer(batch("w", 1, []uint64{1}, []float32{1}), 0, pushT0); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "open window") {
		t.Fatalf("into a window of %d bytes (sealed at %d): %v", l.open.bytes, lim.WindowBytes, err)
	}
	delete(l.producers, "w")
	if len(l.producers) != 1 {
		t.Fatalf("producers %v: refused batches hold a place", l.producers)
	}
	l.sealed(l.take(), 1, nil)
	for _, p := range []string{"y", "b"} {
		if _, _, err := l.offer(batch(p, 1, nil, nil), 0, pushT0); err != nil {
			t.Fatal(err)
		}
	}
	// Full (at most 3): a fourth takes the place of the one idle the
	// longest (a, sealed; y's and b's batches are in the open window),
	// and a fifth finds every one with a batch in flight.
	if _, _, err := l.offer(batch("c", 1, nil, nil), 0, pushT0.Add(time.Minute)); err != nil {
		t.Fatalf("a fourth producer, one of three idle: %v", err)
	}
	if _, ok := l.producers["a"]; ok {
		t.Fatal("the producer idle the longest kept its place")
	}
	if _, ok := l.producers["b"]; !ok {
		t.Fatal("a producer with a batch in flight was forgotten")
	}
	if _, _, err := l.offer(batch("d", 1, nil, nil), 0, pushT0.Add(time.Minute)); !errors.Is(err, ErrBusy) {
		t.Fatalf("a fifth producer, every place in flight: %v", err)
	}
	// a resumes from its sealed mark in the state.
	if w, dup, err := l.offer(batch("a", 1, nil, nil), 1, pushT0.Add(time.Minute)); err != nil || !dup || w != nil {
		t.Fatalf("a, forgotten by the log, resending its sealed batch: %v %v %v; want a duplicate answered at once", w, dup, err)
	}
}

// TestPushSealFails checks that a window that cannot be published fails
// the open window after it, and that producers resume from their sealed
// marks.
func TestPushSealFails(t *testing.T) {
	l := newPushLog(testLimits(), 1, 8)
	l.offer(batch("a", 1, []uint64{1}, []float32{1}), 0, pushT0)
	l.sealed(l.take(), 3, nil)
	l.offer(batch("a", 2, []uint64{1}, []float32{2}), 0, pushT0)
	w := l.take()
	w2, _, _ := l.offer(batch("a", 3, []uint64{1}, []float32{3}), 0, pushT0)
	l.sealed(w, 0, errors.New("disk full"))
	<-w2.done
	if w.err == nil || w2.err == nil {
		t.Fatalf("answers %v, %v: both should fail", w.err, w2.err)
	}
	var se *SequenceError
	if _, _, err := l.offer(batch("a", 3, nil, nil), 0, pushT0); !errors.As(err, &se) || se.Expected != 2 {
		t.Fatalf("after a failed seal: want 2 expected, got %v", err)
	}
	if p := l.producers["a"]; p.inFlight != 0 {
		t.Fatalf("%d bytes still counted in flight", p.inFlight)
	}
	l.fail(errors.New("deposed"))
}

func TestPushBatchCheck(t *testing.T) {
	for _, c := range []struct {
		b    *PushBatch
		want string
	}{
		{batch("", 1, nil, nil), "producer"},
		{batch("a/b", 1, nil, nil), "producer"},
		{batch("a", 0, nil, nil), "sequence 0"},
		{batch("a", 1, []uint64{1}, []float32{1}), "values per id"},
		{batch("a", 1, []uint64{1}, []float32{1, float32(math.NaN())}), "finite"},
		{batch("a", 1, []uint64{1}, []float32{float32(math.Inf(1)), 0}), "finite"},
		{batch("a", 1, []uint64{1}, []float32{1, 2}, 1), "both upserted and deleted"},
	} {
		err := c.b.Check(2)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: got %v, want ErrInvalid naming %q", c.b, err, c.want)
		}
	}
	if err := batch("trainer-0.x:1", 1, []uint64{1}, []float32{1, 2}, 2).Check(2); err != nil {
		t.Fatal(err)
	}
}

// TestTrimMarks checks the bound on a model's marks: by age relative to
// the newest, then by count.
func TestTrimMarks(t *testing.T) {
	marks := map[string]codec.PushMark{}
	for i := range 6 {
		marks[fmt.Sprint("p", i)] = codec.PushMark{Seq: 1, At: pushT0.Add(time.Duration(i) * time.Hour)}
	}
	trimMarks(marks, 4*time.Hour, 3)
	var kept []string
	for p := range marks {
		kept = append(kept, p)
	}
	slices.Sort(kept)
	if fmt.Sprint(kept) != "[p3 p4 p5]" {
		t.Fatalf("kept %v", kept)
	}
}

// TestPushHeldMerge checks what a held model's pending delta holds: the
// windows merged in order (later rows win, deletions included), the
// marks of all, and compacted to one row per id between seals.
func TestPushHeldMerge(t *testing.T) {
	l := newPushLog(testLimits(), 1, 8)
	l.offer(batch("a", 1, []uint64{1, 2}, []float32{1, 2}), 0, pushT0)
	first := l.take().compacted()
	l.offer(batch("b", 1, []uint64{2, 3}, []float32{20, 30}, 1), 0, pushT0)
	w := l.take()
	m := merged(first, w)
	ids, values, deletes := m.contents()
	got := map[uint64]float32{}
	for i, id := range ids {
		got[id] = values[i]
	}
	if fmt.Sprint(got) != "map[2:20 3:30]" || !slices.Equal(deletes, []uint64{1}) || m.marks["a"] != 1 || m.marks["b"] != 1 {
		t.Fatalf("merged: %v, deletes %v, marks %v", got, deletes, m.marks)
	}
	c := m.compacted()
	if len(c.ids) != 3 || c.bytes >= m.bytes {
		t.Fatalf("compacted: %d rows, %d bytes (merged: %d)", len(c.ids), c.bytes, m.bytes)
	}
	// The same contents, the deletion still one.
	cids, cvalues, cdeletes := c.contents()
	cgot := map[uint64]float32{}
	for i, id := range cids {
		cgot[id] = cvalues[i]
	}
	if fmt.Sprint(cgot) != fmt.Sprint(got) || !slices.Equal(cdeletes, deletes) {
		t.Fatalf("compacted holds %v, deletes %v; merged %v, deletes %v", cgot, cdeletes, got, deletes)
	}
	l.held = &heldPushes{rows: m.compacted()}
	l.offer(batch("a", 2, []uint64{9}, []float32{9}), 0, pushT0)
	if l.heldBytes() != l.held.rows.bytes+l.open.bytes {
		t.Fatal("heldBytes counts neither the pending rows nor the open window")
	}
}

// contents is what w holds: the upserted ids with their values, and the
// deleted ids, the last row of each id winning (by partition, then
// newest first), as the seal merges them.
func (w *pushWindow) contents() (ids []uint64, values []float32, deletes []uint64) {
	s := w.split()
	for t := range s.touched {
		pi, pv, pd := s.last(t)
		ids, values, deletes = append(ids, pi...), append(values, pv...), append(deletes, pd...)
	}
	return ids, values, deletes
}

// TestWindowSplit checks the seal's merge of random windows against a
// reference: each partition's rows are its own ids, and the last row of
// each id wins, a deletion included.
func TestWindowSplit(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct {
		partitions uint32
		rows, ids  int
	}{{1, 0, 1}, {1, 50, 10}, {7, 500, 100}, {64, 5000, 1 << 20}} {
		const width = 2
		w := &pushWindow{width: width, partitions: c.partitions}
		want := map[uint64][]float32{} // nil: deleted
		for range c.rows {
			id := rng.Uint64N(uint64(c.ids)) * 0x9e3779b97f4a7c15 // spread over every digit
			if rng.IntN(4) == 0 {
				w.apply(&PushBatch{Deletes: []uint64{id}})
				want[id] = nil
				continue
			}
			v := []float32{rng.Float32(), rng.Float32()}
			w.apply(&PushBatch{IDs: []uint64{id}, Values: v})
			want[id] = v
		}
		split := w.delta()
		got := map[uint64][]float32{}
		for i, p := range split.Touched {
			if i > 0 && p <= split.Touched[i-1] {
				t.Fatalf("partitions %v not ascending", split.Touched)
			}
			ids, values, deletes := split.Rows(p)
			for k, id := range slices.Concat(ids, deletes) {
				if q := partition.Of(id, c.partitions); q != p {
					t.Fatalf("id %d given in partition %d is of %d", id, p, q)
				}
				if _, ok := got[id]; ok {
					t.Fatalf("id %d given twice", id)
				}
				got[id] = nil
				if k < len(ids) {
					got[id] = values[k*width : (k+1)*width]
				}
			}
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%d rows in %d partitions: merged %d ids, want %d (or values differ)", c.rows, c.partitions, len(got), len(want))
		}
	}
}

// BenchmarkSeal seals windows of a million rows (20 batches of 50,000
// ids of 10M, LR) as packed deltas of a model in 1,024 partitions: the
// window's merge and the delta's files.
//
//	go test -run '^$' -bench Seal -benchtime 20x ./manager
func BenchmarkSeal(b *testing.B) {
	repo := loader.Repo{Dir: b.TempDir(), Manifests: loader.NewManifestCache()} // as the manager has
	shape := model.Shape{Type: model.LR}
	full, err := repo.Generate(loader.GenSpec{Name: "m", Shape: shape, Params: 100000, Partitions: 1024, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	parent := full.Version
	for b.Loop() {
		b.StopTimer()
		l := newPushLog(PushLimits{Window: time.Second, WindowBytes: 1 << 30, InFlight: 1 << 30, ProducerTTL: time.Hour, MaxProducers: 1}, 1, 1024)
		for seq := range 20 {
			ids, values := make([]uint64, 50000), make([]float32, 50000)
			for i := range ids {
				ids[i], values[i] = rng.Uint64N(10_000_000), float32(seq)
			}
			if _, _, err := l.offer(&PushBatch{Model: "m", Producer: "p", Sequence: uint64(seq + 1), IDs: ids, Values: values}, 0, pushT0); err != nil {
				b.Fatal(err)
			}
		}
		w := l.take()
		if len(w.ids) != 1_000_000 {
			b.Fatalf("window of %d rows", len(w.ids))
		}
		b.StartTimer()
		m, err := repo.PublishDelta("m", loader.Delta{Split: w.delta(), Parent: parent, ParentChecked: true, Pack: true})
		if err != nil {
			b.Fatal(err)
		}
		parent = m.Version
		if len(m.Files) != 1024 || m.Files[0].Keys == 0 {
			b.Fatalf("a window of a million rows wrote %d partitions", len(m.Files))
		}
	}
}

// TestValidateSealed: a delta this manager sealed is not read back while
// its files are as it wrote them; once they change, it is verified (and
// the damage found).
func TestValidateSealed(t *testing.T) {
	repo := loader.Repo{Dir: t.TempDir()}
	shape := model.Shape{Type: model.LR}
	if _, err := repo.Generate(loader.GenSpec{Name: "m", Shape: shape, Params: 1000, Partitions: 8, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	d, err := repo.PublishDelta("m", loader.Delta{Upserts: &loader.Sparse{Shape: shape, Keys: []uint64{1, 2, 3}, Values: []float32{1, 2, 3}}, Pack: true})
	if err != nil {
		t.Fatal(err)
	}
	v := Validate{Model: "m", Version: d.Version}
	dir := repo.VersionDir("m", d.Version)
	fp := fingerprint(dir)
	got := validate(repo, v, fp, new(codec.IdentityCache))
	if got.Err != "" || len(got.Gates) != 1 || got.Gates[0].Outcome != "passed" || !strings.Contains(got.Gates[0].Reason, "sealed by this manager") || got.Info == nil {
		t.Fatalf("a sealed delta: %+v", got)
	}
	// Damaged after sealing: its fingerprint changes, and it is read.
	p := filepath.Join(dir, d.Files[0].Path)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-1] ^= 1
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	repo.Manifests = nil
	if got := validate(repo, v, fp, new(codec.IdentityCache)); got.Err == "" {
		t.Fatalf("a sealed delta damaged since: %+v", got)
	}
}

// TestQuickScanChained: a quick scan lists a version gone from the state
// that a kept chain needs by its fingerprint, as a full scan does, so
// the chain check finds it unchanged and validates nothing again. (It
// listed the whole state entry, and every quick scan, one a sealed
// push, had every such version read again.)
func TestQuickScanChained(t *testing.T) {
	ms := &ModelState{Name: "m", Floor: 5, Chained: map[uint64]string{3: chainedEntry("fp3", []string{"a", "b"})}}
	view := &State{Models: map[string]*ModelState{"m": ms}}
	for _, quick := range []bool{true, false} {
		mode, f := scanModes(view, quick)("m", 3)
		if quick && (mode != scanKnownPrint || f == nil || f.Files != "fp3") {
			t.Fatalf("quick: mode %v, found %+v; want the fingerprint fp3", mode, f)
		}
		if !quick && mode != scanPrint {
			t.Fatalf("full: mode %v; want scanPrint", mode)
		}
	}
	if acts := ms.checkChains(map[uint64]string{3: "fp3"}); len(acts) != 0 {
		t.Fatalf("an unchanged chained version: %v; want nothing validated", acts)
	}
	if acts := ms.checkChains(map[uint64]string{3: "fp3-changed"}); len(acts) != 1 {
		t.Fatalf("a changed chained version: %v; want it validated", acts)
	}
}
