package router_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/internal/devcluster/devclustertest"
	"github.com/cumulus-serving/cumulus/internal/reference"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/shard"
)

// randomModel has ids 0..n-1 scaled by a large odd number (so they spread
// over 64 bits), plus id 0 and the maximum id.
func randomModel(typ string, dim, n int, seed uint64) *loader.Sparse {
	rng := rand.New(rand.NewPCG(seed, 1))
	m := &loader.Sparse{Type: typ, Dim: dim, Bias: rng.Float64() - 0.5}
	for i := range n {
		m.Keys = append(m.Keys, uint64(i)*0x9e3779b97f4a7c15)
		for range 1 + dim {
			m.Values = append(m.Values, float32(rng.NormFloat64()*0.3))
		}
	}
	m.Keys = append(m.Keys, math.MaxUint64)
	for range 1 + dim {
		m.Values = append(m.Values, 0.25)
	}
	return m
}

// randomRequest draws rows from the model's ids, some absent ids and
// duplicates, with shared features.
func randomRequest(rng *rand.Rand, name string, m *loader.Sparse, rows, perRow, shared int) *router.Request {
	pick := func() uint64 {
		switch rng.IntN(10) {
		case 0:
			return rng.Uint64() // almost surely absent
		case 1:
			return math.MaxUint64
		default:
			return m.Keys[rng.IntN(len(m.Keys))]
		}
	}
	req := &router.Request{Model: name, RowSplits: []int64{0}}
	for range shared {
		req.SharedIDs = append(req.SharedIDs, pick())
		req.SharedValues = append(req.SharedValues, rng.Float32()*2)
	}
	for range rows {
		k := rng.IntN(perRow + 1)
		for range k {
			req.IDs = append(req.IDs, pick())
			req.Values = append(req.Values, rng.Float32()*2-1)
		}
		req.RowSplits = append(req.RowSplits, int64(len(req.IDs)))
	}
	return req
}

func checkScores(t *testing.T, ref *reference.Model, req *router.Request, resp *router.Response) {
	t.Helper()
	if err := scoresMatch(ref, req, resp); err != nil {
		t.Fatal(err)
	}
}

// scoresMatch compares every row's score with the reference model's.
func scoresMatch(ref *reference.Model, req *router.Request, resp *router.Response) error {
	if len(resp.Scores) != req.Rows() {
		return fmt.Errorf("%d scores for %d rows", len(resp.Scores), req.Rows())
	}
	for r := range req.Rows() {
		var ids []uint64
		var xs []float64
		for i, id := range req.SharedIDs {
			x := 1.0
			if req.SharedValues != nil {
				x = float64(req.SharedValues[i])
			}
			ids, xs = append(ids, id), append(xs, x)
		}
		for i := req.RowSplits[r]; i < req.RowSplits[r+1]; i++ {
			x := 1.0
			if req.Values != nil {
				x = float64(req.Values[i])
			}
			ids, xs = append(ids, req.IDs[i]), append(xs, x)
		}
		// Written as "not within" so a NaN score fails.
		if want := ref.Score(ids, xs); !(math.Abs(float64(resp.Scores[r])-want) <= 1e-5) {
			return fmt.Errorf("row %d: score %.7f, reference %.7f", r, resp.Scores[r], want)
		}
	}
	return nil
}

func TestPredictMatchesReference(t *testing.T) {
	repoDir := t.TempDir()
	repo := loader.Repo{Dir: repoDir}
	lr := randomModel(codec.TypeLR, 0, 5000, 1)
	fm := randomModel(codec.TypeFM, 6, 3000, 2)
	if _, err := repo.Publish("lr", lr, 5, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Publish("fm", fm, 7, "test"); err != nil {
		t.Fatal(err)
	}
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 3, Replicas: 2, ScanInterval: time.Hour})
	rng := rand.New(rand.NewPCG(9, 9))
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		m    *loader.Sparse
	}{{"lr", lr}, {"fm", fm}} {
		ref := reference.New(tc.m)
		for _, shape := range [][3]int{{1, 1, 0}, {200, 50, 40}, {17, 3, 0}, {50, 0, 5}} {
			req := randomRequest(rng, tc.name, tc.m, shape[0], shape[1], shape[2])
			resp, err := c.Router.Predict(ctx, req)
			if err != nil {
				t.Fatalf("%s %v: %v", tc.name, shape, err)
			}
			if resp.Version != 1 || resp.Model != tc.name {
				t.Fatalf("answered by %s v%d", resp.Model, resp.Version)
			}
			checkScores(t, ref, req, resp)
		}
		// Values omitted mean 1.0.
		req := randomRequest(rng, tc.name, tc.m, 20, 10, 3)
		req.Values, req.SharedValues = nil, nil
		resp, err := c.Router.Predict(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		checkScores(t, ref, req, resp)
	}

	// Errors keep their codes, and the router keeps serving.
	_, err := c.Router.Predict(ctx, &router.Request{Model: "nope", RowSplits: []int64{0, 0}})
	if !errors.Is(err, router.ErrNotFound) {
		t.Errorf("unknown model: %v", err)
	}
	_, err = c.Router.Predict(ctx, &router.Request{Model: "lr", Version: 9, RowSplits: []int64{0, 0}})
	if !errors.Is(err, router.ErrNotFound) {
		t.Errorf("unknown version: %v", err)
	}
	_, err = c.Router.Predict(ctx, &router.Request{Model: "lr", IDs: []uint64{1}, RowSplits: []int64{0, 2}})
	if !errors.Is(err, router.ErrInvalidArgument) {
		t.Errorf("bad row_splits: %v", err)
	}

	// A new version rolls out; then losing a shard leaves a replica of
	// every partition, and answers stay right.
	lr2 := randomModel(codec.TypeLR, 0, 5000, 3)
	if _, err := repo.Publish("lr", lr2, 5, "test"); err != nil {
		t.Fatal(err)
	}
	c.Manager.Rescan()
	testenv.Eventually(t, 30*time.Second, func() error {
		if s, _ := c.Router.Model("lr"); s.Live != 2 {
			return errors.New("lr v2 not live")
		}
		return nil
	})
	// Requests flow while shard 0 goes away and its partitions' other
	// replicas take over: none may fail.
	ref2 := reference.New(lr2)
	req := randomRequest(rng, "lr", lr2, 100, 20, 10)
	tr := startTraffic(t, c.Router, req, func(resp *router.Response) error { return scoresMatch(ref2, req, resp) })
	tr.await(t, 5)
	c.Shards[0].Close()
	// Until the manager has reassigned shard 0's partitions and every
	// assigned replica holds them.
	tr.until(t, func() error {
		a := assignment(t, c, "lr")
		for p, reps := range a.Replicas {
			if len(reps) != 2 || slices.Contains(reps, "shard-0") {
				return fmt.Errorf("partition %d on %v", p, reps)
			}
			for _, id := range reps {
				s := c.Shards[slices.IndexFunc(c.Shards, func(s *shard.Shard) bool { return s.ID() == id })]
				if !slices.ContainsFunc(s.Loaded(), func(l topo.Loaded) bool { return l.Version == 2 && slices.Contains(l.Have, uint32(p)) }) {
					return fmt.Errorf("%s does not hold partition %d yet", id, p)
				}
			}
		}
		return nil
	})
	tr.await(t, 20)
	if n, err := tr.Stop(); err != nil {
		t.Fatalf("after %d answered: %v", n, err)
	}
}

func TestValidate(t *testing.T) {
	nan := float32(math.NaN())
	cases := map[string]router.Request{
		"no model":        {RowSplits: []int64{0}},
		"empty batch":     {Model: "m", RowSplits: []int64{0}},
		"no splits":       {Model: "m"},
		"bad start":       {Model: "m", IDs: []uint64{1}, RowSplits: []int64{1, 1}},
		"bad end":         {Model: "m", IDs: []uint64{1, 2}, RowSplits: []int64{0, 1}},
		"decreasing":      {Model: "m", IDs: []uint64{1, 2}, RowSplits: []int64{0, 2, 1, 2}},
		"values length":   {Model: "m", IDs: []uint64{1}, Values: []float32{1, 2}, RowSplits: []int64{0, 1}},
		"nan":             {Model: "m", IDs: []uint64{1}, Values: []float32{nan}, RowSplits: []int64{0, 1}},
		"inf shared":      {Model: "m", SharedIDs: []uint64{1}, SharedValues: []float32{float32(math.Inf(1))}, RowSplits: []int64{0, 0}},
		"shared len":      {Model: "m", SharedIDs: []uint64{1}, SharedValues: []float32{}, RowSplits: []int64{0, 0}},
		"too many rows":   {Model: "m", RowSplits: make([]int64, 12)},
		"too many ids":    {Model: "m", IDs: make([]uint64, 11), RowSplits: []int64{0, 11}},
		"negative splits": {Model: "m", IDs: []uint64{1}, RowSplits: []int64{0, -1, 1}},
	}
	for name, req := range cases {
		if err := req.Validate(router.Limits{MaxRows: 10, MaxIDs: 10}); !errors.Is(err, router.ErrInvalidArgument) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	ok := router.Request{Model: "m", IDs: []uint64{1, 2}, RowSplits: []int64{0, 0, 2}}
	if err := ok.Validate(router.Limits{}); err != nil {
		t.Errorf("valid request refused: %v", err)
	}
}

// TestQuantizedScores serves one FM model stored three ways and measures
// how far fp16 and int8 factors move the scores from the fp32 reference.
func TestQuantizedScores(t *testing.T) {
	repoDir := t.TempDir()
	repo := loader.Repo{Dir: repoDir}
	fm := randomModel(codec.TypeFM, 16, 4000, 8)
	for _, enc := range []string{"fp32", "fp16", "int8"} {
		if _, err := repo.PublishEncoded("fm-"+enc, fm, 4, enc, "test"); err != nil {
			t.Fatal(err)
		}
	}
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 2, ScanInterval: time.Hour})
	ref := reference.New(fm)
	rng := rand.New(rand.NewPCG(4, 4))
	// The bound of each row follows from the encodings' documented
	// per-factor error (docs/model-format.md): fp16 within 2^-11 of a
	// factor's magnitude, int8 within max|v|/254 of its record's largest
	// factor, fp32 exact. A pairwise term <v_i, v_j> x_i x_j then moves by
	// at most Σ_f (|v_if| e_jf + |v_jf| e_if + e_if e_jf) |x_i x_j|, and
	// σ by at most a quarter of what its argument moves.
	factors := map[uint64][]float32{}
	for i, k := range fm.Keys {
		factors[k] = fm.Values[i*17+1 : (i+1)*17]
	}
	errOf := func(enc string, v []float32) []float64 {
		e := make([]float64, len(v))
		big := 0.0
		for _, x := range v {
			big = math.Max(big, math.Abs(float64(x)))
		}
		for f, x := range v {
			switch enc {
			case "fp16":
				e[f] = math.Abs(float64(x))*math.Exp2(-11) + math.Exp2(-25)
			case "int8":
				e[f] = big/254 + 1e-7*big
			}
		}
		return e
	}
	rowBound := func(enc string, ids []uint64, xs []float64) float64 {
		dz := 0.0
		for i := range ids {
			vi := factors[ids[i]]
			if vi == nil {
				continue
			}
			ei := errOf(enc, vi)
			for j := i + 1; j < len(ids); j++ {
				vj := factors[ids[j]]
				if vj == nil {
					continue
				}
				ej := errOf(enc, vj)
				term := 0.0
				for f := range vi {
					term += math.Abs(float64(vi[f]))*ej[f] + math.Abs(float64(vj[f]))*ei[f] + ei[f]*ej[f]
				}
				dz += term * math.Abs(xs[i]*xs[j])
			}
		}
		return dz/4 + 1e-5 // float32 scores and sums
	}
	for _, enc := range []string{"fp32", "fp16", "int8"} {
		worst, sum, n := 0.0, 0.0, 0
		for range 5 {
			req := randomRequest(rng, "fm-"+enc, fm, 200, 40, 20)
			resp, err := c.Router.Predict(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			for r := range req.Rows() {
				var ids []uint64
				var xs []float64
				for i, id := range req.SharedIDs {
					ids, xs = append(ids, id), append(xs, float64(req.SharedValues[i]))
				}
				for i := req.RowSplits[r]; i < req.RowSplits[r+1]; i++ {
					ids, xs = append(ids, req.IDs[i]), append(xs, float64(req.Values[i]))
				}
				d := math.Abs(float64(resp.Scores[r]) - ref.Score(ids, xs))
				if math.IsNaN(d) {
					t.Fatalf("%s: row %d scored NaN", enc, r)
				}
				if b := rowBound(enc, ids, xs); d > b {
					t.Errorf("%s: row %d: |Δp| %.3g over its bound %.3g", enc, r, d, b)
				}
				worst, sum, n = math.Max(worst, d), sum+d, n+1
			}
		}
		t.Logf("%s factors: max |Δp| = %.2g, mean |Δp| = %.2g over %d rows (dim 16, 60 features a row)", enc, worst, sum/float64(n), n)
	}
}

// TestRolloutNeverFails holds one shard back while it loads version 2:
// the others must keep version 1 (staged, not committed), every request
// must be answered by version 1 until the commit, and by version 2 after.
func TestRolloutNeverFails(t *testing.T) {
	repoDir := t.TempDir()
	repo := loader.Repo{Dir: repoDir}
	v1, v2 := randomModel(codec.TypeLR, 0, 3000, 11), randomModel(codec.TypeLR, 0, 3000, 12)
	if _, err := repo.Publish("lr", v1, 6, "v1"); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 3, ScanInterval: time.Hour,
		Shard: func(i int, o *shard.Options) {
			if i == 2 {
				o.BeforeLoad = func(ctx context.Context, _ string, version uint64, _ uint32) error {
					if version == 2 {
						select {
						case <-release:
						case <-ctx.Done():
							return ctx.Err()
						}
					}
					return nil
				}
			}
		}})
	// Registered after the cluster's own cleanup, so it runs first: a
	// failing test must not leave shard 2 blocked while the cluster stops.
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	if _, err := repo.Publish("lr", v2, 6, "v2"); err != nil {
		t.Fatal(err)
	}
	c.Manager.Rescan()
	rng := rand.New(rand.NewPCG(5, 5))
	req := randomRequest(rng, "lr", v1, 50, 20, 5)
	ref1, ref2 := reference.New(v1), reference.New(v2)
	// Shards 0 and 1 load version 2 while shard 2 is held; wait until
	// they hold all of theirs, then keep asking.
	testenv.Eventually(t, 30*time.Second, func() error {
		for _, s := range c.Shards[:2] {
			held := false
			for _, l := range s.Loaded() {
				held = held || l.Version == 2 && len(l.Have) == 2
			}
			if !held {
				return errors.New("shards 0 and 1 have not loaded version 2")
			}
		}
		return nil
	})
	for range 50 {
		resp, err := c.Router.Predict(context.Background(), req)
		if err != nil {
			t.Fatalf("request failed mid-rollout: %v", err)
		}
		if resp.Version != 1 {
			t.Fatalf("answered by version %d before the commit", resp.Version)
		}
		checkScores(t, ref1, req, resp)
	}
	// Through the commit and the retirement of version 1, requests sent
	// back to back are all answered, by one version or the other.
	var sawV2 atomic.Bool
	tr := startTraffic(t, c.Router, req, func(resp *router.Response) error {
		if resp.Version == 1 {
			return scoresMatch(ref1, req, resp)
		}
		sawV2.Store(true)
		return scoresMatch(ref2, req, resp)
	})
	tr.await(t, 5)
	unblock()
	tr.until(t, func() error {
		if !sawV2.Load() {
			return errors.New("version 2 not live yet")
		}
		return nil
	})
	tr.await(t, 20)
	if n, err := tr.Stop(); err != nil {
		t.Fatalf("after %d answered: %v", n, err)
	}
}

// applyDelta is the plain meaning of a delta: change or add the upserted
// features, remove the deleted ones, take the new bias.
func applyDelta(m *loader.Sparse, d loader.Delta) *loader.Sparse {
	w := m.Width()
	vals := map[uint64][]float32{}
	for i, k := range m.Keys {
		vals[k] = m.Values[i*w : (i+1)*w]
	}
	if d.Upserts != nil {
		for i, k := range d.Upserts.Keys {
			vals[k] = d.Upserts.Values[i*w : (i+1)*w]
		}
	}
	for _, k := range d.Deletes {
		delete(vals, k)
	}
	out := &loader.Sparse{Type: m.Type, Dim: m.Dim, Bias: m.Bias}
	if d.Bias != nil {
		out.Bias = *d.Bias
	}
	for k, v := range vals {
		out.Keys = append(out.Keys, k)
		out.Values = append(out.Values, v...)
	}
	return out
}

func TestDeltaVersions(t *testing.T) {
	repoDir := t.TempDir()
	repo := loader.Repo{Dir: repoDir}
	v1 := randomModel(codec.TypeFM, 4, 2000, 21)
	if _, err := repo.Publish("fm", v1, 5, "v1"); err != nil {
		t.Fatal(err)
	}
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 3, Replicas: 2, ScanInterval: time.Hour})
	rng := rand.New(rand.NewPCG(6, 6))
	// Requests draw from v1's ids plus ids the deltas add.
	added := &loader.Sparse{Type: codec.TypeFM, Dim: 4}
	for i := range 300 {
		added.Keys = append(added.Keys, uint64(1_000_000+i))
		for range 5 {
			added.Values = append(added.Values, float32(rng.NormFloat64()*0.3))
		}
	}
	pool := &loader.Sparse{Type: codec.TypeFM, Dim: 4, Keys: append(slices.Clone(v1.Keys), added.Keys...)}
	serves := func(version uint64, want *loader.Sparse) {
		t.Helper()
		c.Manager.Rescan()
		ref := reference.New(want)
		testenv.Eventually(t, 30*time.Second, func() error {
			req := randomRequest(rng, "fm", pool, 100, 30, 10)
			resp, err := c.Router.Predict(context.Background(), req)
			if err != nil {
				return err
			}
			if resp.Version != version {
				return fmt.Errorf("answered by version %d, want %d", resp.Version, version)
			}
			checkScores(t, ref, req, resp)
			return nil
		})
	}
	// v2: change 100 features, add 300, delete 200, new bias.
	changed := &loader.Sparse{Type: codec.TypeFM, Dim: 4}
	for i := range 100 {
		changed.Keys = append(changed.Keys, v1.Keys[i])
		for range 5 {
			changed.Values = append(changed.Values, float32(rng.NormFloat64()))
		}
	}
	up := &loader.Sparse{Type: codec.TypeFM, Dim: 4, Keys: append(slices.Clone(changed.Keys), added.Keys...),
		Values: append(slices.Clone(changed.Values), added.Values...)}
	bias := 0.75
	d2 := loader.Delta{Upserts: up, Deletes: slices.Clone(v1.Keys[500:700]), Bias: &bias}
	m2, err := repo.PublishDelta("fm", d2)
	if err != nil || m2.Kind != codec.KindDelta || m2.Parent != 1 {
		t.Fatalf("delta v2: %+v, %v", m2, err)
	}
	want2 := applyDelta(v1, d2)
	serves(2, want2)

	// v3 on v2: delete what v2 added, bring back what v2 deleted.
	back := &loader.Sparse{Type: codec.TypeFM, Dim: 4, Keys: slices.Clone(v1.Keys[500:600]), Values: slices.Clone(v1.Values[500*5 : 600*5])}
	d3 := loader.Delta{Upserts: back, Deletes: slices.Clone(added.Keys[:150])}
	if _, err := repo.PublishDelta("fm", d3); err != nil {
		t.Fatal(err)
	}
	serves(3, applyDelta(want2, d3))

	// A full version replaces the whole chain.
	v4 := randomModel(codec.TypeFM, 4, 2000, 22)
	if _, err := repo.Publish("fm", v4, 5, "v4"); err != nil {
		t.Fatal(err)
	}
	serves(4, v4)
}
