package router

import (
	"math/rand/v2"
	"testing"

	"github.com/cumulus-serving/cumulus/model"
)

// The router's own per-request work — its checks, dedup and scoring —
// allocates nothing once its pooled buffers have grown, for every type.
func TestHotPathAllocs(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	req := &Request{Model: "m", RowSplits: []int64{0}}
	for range 200 {
		for range 100 {
			req.IDs = append(req.IDs, rng.Uint64N(5000))
			req.Values = append(req.Values, 1)
			req.Fields = append(req.Fields, rng.Int32N(20))
		}
		req.RowSplits = append(req.RowSplits, int64(len(req.IDs)))
	}
	for range 400 {
		req.SharedIDs = append(req.SharedIDs, rng.Uint64N(5000))
		req.SharedFields = append(req.SharedFields, rng.Int32N(20))
	}
	dnn := model.Shape{Type: model.DNN, Dim: 16, Fields: 20, Pooling: "mean"}
	in := dnn.DenseIn()
	dense := &model.Dense{Layers: []model.Layer{
		{In: in, Out: 64, W: make([]float32, in*64), B: make([]float32, 64)},
		{In: 64, Out: 1, W: make([]float32, 64), B: make([]float32, 1)},
	}}
	for _, shape := range []model.Shape{{Type: model.LR}, {Type: model.FM, Dim: 8}, {Type: model.FFM, Dim: 4, Fields: 20}, dnn} {
		var d *model.Dense
		if shape.HasDense() {
			d = dense
		}
		scorer, err := shape.Scorer(0.1, d)
		if err != nil {
			t.Fatal(err)
		}
		vr := &versionRoute{model: "m", shape: shape, scorer: scorer}
		w := &work{}
		out := make([]float32, req.Rows())
		run := func() {
			if err := vr.check(w, req); err != nil {
				t.Fatal(err)
			}
			w.dedup(req)
			w.vals = resize(w.vals, len(w.ids.uniq)*shape.Width())
			vr.score(out, w)
		}
		run()
		if n := testing.AllocsPerRun(20, run); n != 0 {
			t.Errorf("%s: check, dedup and scoring allocated %.1f times per request, want 0", shape, n)
		}
		if len(w.ids.uniq) > 5000 {
			t.Errorf("%d distinct ids from a 5000-id space", len(w.ids.uniq))
		}
	}
}

func TestIDIndex(t *testing.T) {
	var x idIndex
	for round := range 3 {
		x.reset(10)
		ids := []uint64{0, 7, ^uint64(0), 7, 0, 42}
		want := []int32{0, 1, 2, 1, 0, 3}
		for i, id := range ids {
			if got := x.index(id); got != want[i] {
				t.Fatalf("round %d: index(%d) = %d, want %d", round, id, got, want[i])
			}
		}
		if len(x.uniq) != 4 {
			t.Fatalf("round %d: %d distinct, want 4", round, len(x.uniq))
		}
	}
}

// The table grows while it fills: every id keeps its number through the
// doublings, and a later small request reuses the grown table.
func TestIDIndexGrows(t *testing.T) {
	var x idIndex
	rng := rand.New(rand.NewPCG(3, 4))
	for round, n := range []int{40, 100_000, 7} {
		x.reset(n / 10) // far fewer expected than come
		ids := make([]uint64, n)
		for i := range ids {
			ids[i] = rng.Uint64()
		}
		for i, id := range ids {
			if got := x.index(id); got != int32(i) {
				t.Fatalf("round %d: new id %d numbered %d", round, i, got)
			}
		}
		for i, id := range ids {
			if got := x.index(id); got != int32(i) {
				t.Fatalf("round %d: id %d numbered %d the second time", round, i, got)
			}
		}
		if len(x.uniq) != n || int(x.mask+1)*2/3 < n {
			t.Fatalf("round %d: %d distinct in a table of %d", round, len(x.uniq), x.mask+1)
		}
	}
}
