package golden_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/cumulus-serving/cumulus/internal/golden"
	"github.com/cumulus-serving/cumulus/internal/reference"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/router"
)

func TestParseRefuses(t *testing.T) {
	ok := `{"inputs":[{"name":"ids","datatype":"INT64","shape":[2],"data":[1,2]},{"name":"row_splits","datatype":"INT64","shape":[3],"data":[0,1,2]}]`
	for _, c := range []struct{ file, want string }{
		{"", "no requests"},
		{"\n\n", "no requests"},
		{"{", "line 1"},
		{ok + `}` + "\n" + `[1]`, "line 2"},
		{ok + `,"want":[0.5]}`, `"want" must be an array of 2 numbers`},
		{ok + `,"want":["x","y"]}`, `"want"[0] is "x", not a number`},
		{ok + `,"want":[0.5,null]}`, `"want"[1] is null, not a number`},
		{ok + `,"labels":[null,1]}`, `"labels"[0] is null, not a number`},
		{ok + `,"labels":[0,2]}`, `labels are 0 or 1`},
		{`{"inputs":[{"name":"ids","datatype":"INT64","shape":[1],"data":[1]}]}`, `missing input "row_splits"`},
		{`{"inputs":[{"name":"idz","datatype":"INT64","shape":[1],"data":[1]}]}`, `unknown input "idz"`},
		{`{"inputs":[{"name":"ids","datatype":"INT64","shape":[2],"data":[1,2]},{"name":"row_splits","datatype":"INT64","shape":[2],"data":[0,3]}]}`, "row_splits"},
	} {
		_, err := golden.Parse([]byte(c.file), "m", router.Limits{})
		if !errors.Is(err, golden.ErrFormat) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error naming %q", c.file, err, c.want)
		}
	}
	many := strings.Repeat(ok+"}\n", golden.MaxRequests)
	if _, err := golden.Parse([]byte(many), "m", router.Limits{}); err != nil {
		t.Fatalf("%d requests: %v", golden.MaxRequests, err)
	}
	if _, err := golden.Parse([]byte(many+ok+"}"), "m", router.Limits{}); !errors.Is(err, golden.ErrFormat) || !strings.Contains(err.Error(), "more than 10000 requests") {
		t.Fatalf("one request too many: %v", err)
	}
	set, err := golden.Parse([]byte("\n"+ok+`,"want":[0.25,0.75],"labels":[1,0]}`+"\n"), "m", router.Limits{})
	if err != nil || len(set.Cases) != 1 || set.Cases[0].Line != 2 || !slices.Equal(set.Cases[0].Want, []float64{0.25, 0.75}) ||
		set.Rows() != 2 || set.RequireWant() != nil || set.RequireLabels() != nil {
		t.Fatalf("%+v %v", set, err)
	}
	if err := set.RequireLabels(); err != nil {
		t.Fatal(err)
	}
	// Labels [1, 0]: scores 0.5 and 0.25 lose ln 2 and ln(4/3).
	ll, err := set.LogLoss([]float32{0.5, 0.25})
	if want := (math.Ln2 + math.Log(4.0/3)) / 2; err != nil || math.Abs(ll-want) > 1e-6 {
		t.Fatalf("log-loss %v (%v), want %v", ll, err, want)
	}
	if ll, _ := set.LogLoss([]float32{0, 1}); math.IsInf(ll, 0) || ll < 30 {
		t.Fatalf("confident misses cost %v: clamped, large and finite", ll)
	}
}

func randomSparse(s model.Shape, n int, seed uint64) *loader.Sparse {
	rng := rand.New(rand.NewPCG(seed, 1))
	m := &loader.Sparse{Shape: s, Bias: rng.Float64() - 0.5}
	for i := range n {
		m.Keys = append(m.Keys, uint64(i)*0x9e3779b97f4a7c15)
		for range s.Width() {
			m.Values = append(m.Values, float32(rng.NormFloat64()*0.3))
		}
	}
	return m
}

func randomRequests(rng *rand.Rand, m *loader.Sparse, n int) []*router.Request {
	var out []*router.Request
	for range n {
		req := &router.Request{Model: "m", RowSplits: []int64{0}}
		for range 3 {
			req.SharedIDs = append(req.SharedIDs, m.Keys[rng.IntN(len(m.Keys))])
			req.SharedValues = append(req.SharedValues, rng.Float32())
		}
		for range 1 + rng.IntN(6) {
			for range rng.IntN(6) {
				req.IDs = append(req.IDs, m.Keys[rng.IntN(len(m.Keys))])
				req.Values = append(req.Values, rng.Float32()*2-1)
			}
			req.IDs = append(req.IDs, rng.Uint64()) // absent
			req.Values = append(req.Values, 1)
			req.RowSplits = append(req.RowSplits, int64(len(req.IDs)))
		}
		out = append(out, req)
	}
	return out
}

func file(t *testing.T, reqs []*router.Request, want func(i int) []float64) []byte {
	b, err := golden.Lines(reqs, want, golden.None)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkWants compares a version's golden file with ref's scores.
func checkWants(t *testing.T, repo loader.Repo, v uint64, reqs []*router.Request, ref *reference.Model, keep map[int][]float64) {
	t.Helper()
	chain, err := repo.Chain("m", v)
	if err != nil {
		t.Fatal(err)
	}
	b, err := repo.Golden(chain[0])
	if err != nil || b == nil {
		t.Fatalf("version %d's golden file: %v", v, err)
	}
	set, err := golden.Parse(b, "m", router.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if err := set.RequireWant(); err != nil || len(set.Cases) != len(reqs) {
		t.Fatalf("%v, %d cases", err, len(set.Cases))
	}
	for i, c := range set.Cases {
		if k := keep[i]; k != nil {
			if !slices.Equal(c.Want, k) {
				t.Fatalf("version %d line %d: want %v, the given %v kept", v, c.Line, c.Want, k)
			}
			continue
		}
		for r, row := range reqs[i].ReferenceRows() {
			if d := math.Abs(c.Want[r] - ref.ScoreRow(row)); !(d < 1e-12) {
				t.Fatalf("version %d line %d row %d: want %v, reference %v", v, c.Line, r, c.Want[r], ref.ScoreRow(row))
			}
		}
	}
}

// TestPublishedWants: a version published with golden requests holds
// them with the reference scorer's wants (given ones kept); a delta's
// are scored again on its chain: its upserts, deletions, new bias and
// the parent's records.
func TestPublishedWants(t *testing.T) {
	repo := loader.Repo{Dir: t.TempDir()}
	shape := model.Shape{Type: model.FM, Dim: 4}
	v1 := randomSparse(shape, 500, 1)
	reqs := randomRequests(rand.New(rand.NewPCG(2, 2)), v1, 8)
	given := map[int][]float64{3: make([]float64, reqs[3].Rows())}
	for i := range given[3] {
		given[3][i] = 0.125
	}
	set, err := golden.Parse(file(t, reqs, func(i int) []float64 { return given[i] }), "m", router.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	set.KeepWant = true
	if _, err := repo.PublishSpec(loader.Spec{Name: "m", Partitions: 3, Golden: set}, v1); err != nil {
		t.Fatal(err)
	}
	checkWants(t, repo, 1, reqs, reference.New(v1), given)

	// A delta: change 50 features, delete 50, new bias; its golden
	// requests are version 1's, scored again (the given want too).
	up := &loader.Sparse{Shape: shape}
	merged := &loader.Sparse{Shape: shape, Bias: 0.75}
	w := shape.Width()
	for i, k := range v1.Keys {
		switch {
		case i%10 == 0:
			up.Keys = append(up.Keys, k)
			for j := range w {
				up.Values = append(up.Values, float32(j)*0.1-0.2)
			}
			merged.Keys, merged.Values = append(merged.Keys, k), append(merged.Values, up.Values[len(up.Values)-w:]...)
		case i%10 == 1:
		default:
			merged.Keys, merged.Values = append(merged.Keys, k), append(merged.Values, v1.Values[i*w:(i+1)*w]...)
		}
	}
	var deletes []uint64
	for i, k := range v1.Keys {
		if i%10 == 1 {
			deletes = append(deletes, k)
		}
	}
	chain, _ := repo.Chain("m", 1)
	b, _ := repo.Golden(chain[0])
	parent, err := golden.Parse(b, "m", router.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	bias := 0.75
	m2, err := repo.PublishDelta("m", loader.Delta{Upserts: up, Deletes: deletes, Bias: &bias, Golden: parent})
	if err != nil {
		t.Fatal(err)
	}
	checkWants(t, repo, m2.Version, reqs, reference.New(merged), nil)
	// A delta published with no golden requests has none: its parent's
	// want the parent's scores.
	m3, err := repo.PublishDelta("m", loader.Delta{Deletes: deletes[:1]})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := repo.Golden(m3); b != nil || err != nil {
		t.Fatalf("delta without golden requests: %d bytes, %v", len(b), err)
	}
}
