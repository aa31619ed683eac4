package router_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
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
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/shard"
)

// randomModel has ids 0..n-1 scaled by a large odd number (so they spread
// over 64 bits), plus id 0 and the maximum id.
func randomModel(typ string, dim, n int, seed uint64) *loader.Sparse {
	return randomShaped(model.Shape{Type: typ, Dim: dim}, n, seed)
}

// randomShaped is randomModel of any shape.
func randomShaped(s model.Shape, n int, seed uint64) *loader.Sparse {
	rng := rand.New(rand.NewPCG(seed, 1))
	m := &loader.Sparse{Shape: s, Bias: rng.Float64() - 0.5}
	for i := range n {
		m.Keys = append(m.Keys, uint64(i)*0x9e3779b97f4a7c15)
		for range s.Width() {
			m.Values = append(m.Values, float32(rng.NormFloat64()*0.3))
		}
	}
	m.Keys = append(m.Keys, math.MaxUint64)
	for range s.Width() {
		m.Values = append(m.Values, 0.25)
	}
	return m
}

// randomRequest draws rows from the model's ids, some absent ids and
// duplicates, with shared features; and random fields for a field-aware
// model.
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
	F := int32(max(m.Fields, 1))
	req := &router.Request{Model: name, RowSplits: []int64{0}}
	for range shared {
		req.SharedIDs = append(req.SharedIDs, pick())
		req.SharedValues = append(req.SharedValues, rng.Float32()*2)
		req.SharedFields = append(req.SharedFields, rng.Int32N(F))
	}
	for range rows {
		k := rng.IntN(perRow + 1)
		for range k {
			req.IDs = append(req.IDs, pick())
			req.Values = append(req.Values, rng.Float32()*2-1)
			req.Fields = append(req.Fields, rng.Int32N(F))
		}
		req.RowSplits = append(req.RowSplits, int64(len(req.IDs)))
	}
	if !m.FieldAware() && rng.IntN(2) == 0 {
		req.Fields, req.SharedFields = nil, nil // optional for other types
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
	for r, row := range req.ReferenceRows() {
		// Written as "not within" so a NaN score fails.
		if want := ref.ScoreRow(row); !(math.Abs(float64(resp.Scores[r])-want) <= 1e-5) {
			return fmt.Errorf("row %d: score %.7f, reference %.7f", r, resp.Scores[r], want)
		}
	}
	return nil
}

func TestPredictMatchesReference(t *testing.T) {
	repoDir := t.TempDir()
	repo := loader.Repo{Dir: repoDir}
	lr := randomModel(model.LR, 0, 5000, 1)
	fm := randomModel(model.FM, 6, 3000, 2)
	ffm := randomShaped(model.Shape{Type: model.FFM, Dim: 3, Fields: 5}, 3000, 3)
	if _, err := repo.Publish("lr", lr, 5, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Publish("fm", fm, 7, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Publish("ffm", ffm, 4, "test"); err != nil {
		t.Fatal(err)
	}
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 3, Replicas: 2, ScanInterval: time.Hour})
	rng := rand.New(rand.NewPCG(9, 9))
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		m    *loader.Sparse
	}{{"lr", lr}, {"fm", fm}, {"ffm", ffm}} {
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
	// A field-aware version needs fields, within its field count.
	for _, bad := range []struct {
		req  router.Request
		want string
	}{
		{router.Request{IDs: []uint64{1, 2}}, `missing input "fields"`},
		{router.Request{IDs: []uint64{1, 2}, Fields: []int32{0, 5}}, "fields[1] = 5 is outside 0..4"},
		{router.Request{IDs: []uint64{1, 2}, Fields: []int32{0, 1}, SharedIDs: []uint64{3}}, `missing input "shared_fields"`},
	} {
		bad.req.Model, bad.req.RowSplits = "ffm", []int64{0, 2}
		_, err = c.Router.Predict(ctx, &bad.req)
		if !errors.Is(err, router.ErrInvalidArgument) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("ffm %+v: %v, want invalid argument saying %q", bad.req, err, bad.want)
		}
	}

	// A new version rolls out; then losing a shard leaves a replica of
	// every partition, and answers stay right.
	lr2 := randomModel(model.LR, 0, 5000, 3)
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
	models := map[string]*loader.Sparse{
		"fm":  randomModel(model.FM, 16, 4000, 8),
		"ffm": randomShaped(model.Shape{Type: model.FFM, Fields: 4, Dim: 4}, 4000, 9),
		"dnn": randomShaped(model.Shape{Type: model.DNN, Fields: 4, Dim: 8, Pooling: "mean"}, 4000, 10),
	}
	models["dnn"].Dense = loader.GenDense(10, models["dnn"].DenseIn(), []int{16})
	for name, m := range models {
		for _, enc := range []string{"fp32", "fp16", "int8"} {
			if _, err := repo.PublishEncoded(name+"-"+enc, m, 4, enc, "test"); err != nil {
				t.Fatal(err)
			}
		}
	}
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 2, ScanInterval: time.Hour})
	rng := rand.New(rand.NewPCG(4, 4))
	// The bound of each row follows from the encodings' documented
	// per-factor error (docs/model-format.md): fp16 within 2^-11 of a
	// factor's magnitude, int8 within max|v|/254 of its record's largest
	// factor, fp32 exact. A pairwise term <a, b> x_i x_j (FM: a = v_i,
	// b = v_j; FFM: a = v_{i,f_j}, b = v_{j,f_i}) then moves by at most
	// Σ_f (|a_f| e(b)_f + |b_f| e(a)_f + e(a)_f e(b)_f) |x_i x_j|, and σ by
	// at most a quarter of what its argument moves.
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
	for _, name := range []string{"fm", "ffm", "dnn"} {
		m := models[name]
		ref := reference.New(m)
		w := m.Width()
		factors := map[uint64][]float32{}
		for i, k := range m.Keys {
			factors[k] = m.Values[i*w+1 : (i+1)*w]
		}
		// seg is the factors of v (or of its errors) a pair with a
		// feature of field g uses.
		seg := func(v []float64, g int32) []float64 {
			if !m.FieldAware() {
				return v
			}
			return v[int(g)*m.Dim : int(g+1)*m.Dim]
		}
		// A DNN's embeddings move each pooled value by at most the sum (or
		// mean) of its features' |x|·error; each layer moves its outputs by
		// at most |W| times what its inputs moved (ReLU moves nothing more).
		dnnBound := func(enc string, row model.Row) float64 {
			k := m.Dim
			du := make([]float64, m.DenseIn())
			count := make([]float64, m.Fields)
			for i, id := range row.IDs {
				f := int(row.Fields[i])
				count[f]++
				if v := factors[id]; v != nil {
					for j, e := range errOf(enc, v) {
						du[f*k+j] += math.Abs(row.Xs[i]) * e
					}
				}
			}
			for f, n := range count {
				for j := range k {
					if n > 0 {
						du[f*k+j] /= n
					}
				}
			}
			for _, l := range m.Dense.Layers {
				next := make([]float64, l.Out)
				for o := range l.Out {
					for i := range l.In {
						next[o] += math.Abs(float64(l.W[o*l.In+i])) * du[i]
					}
				}
				du = next
			}
			return du[0]/4 + 1e-5
		}
		rowBound := func(enc string, row model.Row) float64 {
			if m.HasDense() {
				return dnnBound(enc, row)
			}
			dz := 0.0
			for i := range row.IDs {
				vi := factors[row.IDs[i]]
				if vi == nil {
					continue
				}
				ai, ei := f64s(vi), errOf(enc, vi)
				for j := i + 1; j < len(row.IDs); j++ {
					vj := factors[row.IDs[j]]
					if vj == nil {
						continue
					}
					aj, ej := f64s(vj), errOf(enc, vj)
					a, ea := seg(ai, row.Fields[j]), seg(ei, row.Fields[j])
					b, eb := seg(aj, row.Fields[i]), seg(ej, row.Fields[i])
					term := 0.0
					for f := range a {
						term += math.Abs(a[f])*eb[f] + math.Abs(b[f])*ea[f] + ea[f]*eb[f]
					}
					dz += term * math.Abs(row.Xs[i]*row.Xs[j])
				}
			}
			return dz/4 + 1e-5 // float32 scores and sums
		}
		for _, enc := range []string{"fp32", "fp16", "int8"} {
			worst, sum, n := 0.0, 0.0, 0
			for range 5 {
				req := randomRequest(rng, name+"-"+enc, m, 200, 40, 20)
				if !m.FieldAware() {
					req.Fields, req.SharedFields = make([]int32, len(req.IDs)), make([]int32, len(req.SharedIDs))
				}
				resp, err := c.Router.Predict(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				for r := range req.Rows() {
					var row model.Row
					for i, id := range req.SharedIDs {
						row.IDs, row.Xs, row.Fields = append(row.IDs, id), append(row.Xs, float64(req.SharedValues[i])), append(row.Fields, req.SharedFields[i])
					}
					for i := req.RowSplits[r]; i < req.RowSplits[r+1]; i++ {
						row.IDs, row.Xs, row.Fields = append(row.IDs, req.IDs[i]), append(row.Xs, float64(req.Values[i])), append(row.Fields, req.Fields[i])
					}
					d := math.Abs(float64(resp.Scores[r]) - ref.ScoreRow(row))
					if math.IsNaN(d) {
						t.Fatalf("%s %s: row %d scored NaN", name, enc, r)
					}
					if b := rowBound(enc, row); d > b {
						t.Errorf("%s %s: row %d: |Δp| %.3g over its bound %.3g", name, enc, r, d, b)
					}
					worst, sum, n = math.Max(worst, d), sum+d, n+1
				}
			}
			t.Logf("%s %s factors: max |Δp| = %.2g, mean |Δp| = %.2g over %d rows (%s, up to 40 own and 20 shared features a row)", name, enc, worst, sum/float64(n), n, m.Shape)
		}
	}
}

func f64s(v []float32) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = float64(x)
	}
	return out
}

// TestRolloutNeverFails holds one shard back while it loads version 2:
// the others must keep version 1 (staged, not committed), every request
// must be answered by version 1 until the commit, and by version 2 after.
func TestRolloutNeverFails(t *testing.T) {
	repoDir := t.TempDir()
	repo := loader.Repo{Dir: repoDir}
	v1, v2 := randomModel(model.LR, 0, 3000, 11), randomModel(model.LR, 0, 3000, 12)
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
	out := &loader.Sparse{Shape: m.Shape, Bias: m.Bias}
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
	v1 := randomModel(model.FM, 4, 2000, 21)
	if _, err := repo.Publish("fm", v1, 5, "v1"); err != nil {
		t.Fatal(err)
	}
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 3, Replicas: 2, ScanInterval: time.Hour})
	rng := rand.New(rand.NewPCG(6, 6))
	// Requests draw from v1's ids plus ids the deltas add.
	added := &loader.Sparse{Shape: model.Shape{Type: model.FM, Dim: 4}}
	for i := range 300 {
		added.Keys = append(added.Keys, uint64(1_000_000+i))
		for range 5 {
			added.Values = append(added.Values, float32(rng.NormFloat64()*0.3))
		}
	}
	pool := &loader.Sparse{Shape: model.Shape{Type: model.FM, Dim: 4}, Keys: append(slices.Clone(v1.Keys), added.Keys...)}
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
	changed := &loader.Sparse{Shape: model.Shape{Type: model.FM, Dim: 4}}
	for i := range 100 {
		changed.Keys = append(changed.Keys, v1.Keys[i])
		for range 5 {
			changed.Values = append(changed.Values, float32(rng.NormFloat64()))
		}
	}
	up := &loader.Sparse{Shape: model.Shape{Type: model.FM, Dim: 4}, Keys: append(slices.Clone(changed.Keys), added.Keys...),
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
	back := &loader.Sparse{Shape: model.Shape{Type: model.FM, Dim: 4}, Keys: slices.Clone(v1.Keys[500:600]), Values: slices.Clone(v1.Values[500*5 : 600*5])}
	d3 := loader.Delta{Upserts: back, Deletes: slices.Clone(added.Keys[:150])}
	if _, err := repo.PublishDelta("fm", d3); err != nil {
		t.Fatal(err)
	}
	serves(3, applyDelta(want2, d3))

	// A full version replaces the whole chain.
	v4 := randomModel(model.FM, 4, 2000, 22)
	if _, err := repo.Publish("fm", v4, 5, "v4"); err != nil {
		t.Fatal(err)
	}
	serves(4, v4)
}
