package model

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// randBatch is a request of rows rows over ids 0..n-1 (some the model
// lacks: vec returns nil for ids ≥ held), with random values and fields.
type randModel struct {
	shape Shape
	bias  float64
	recs  map[uint64][]float32
	dense *Dense
}

// randDense is a dense part from in inputs through hidden layers to one
// output.
func randDense(rng *rand.Rand, in int, hidden ...int) *Dense {
	d := &Dense{}
	for _, out := range append(hidden, 1) {
		l := Layer{In: in, Out: out, W: make([]float32, in*out), B: make([]float32, out)}
		for i := range l.W {
			l.W[i] = float32(rng.NormFloat64() / math.Sqrt(float64(in)))
		}
		for i := range l.B {
			l.B[i] = float32(rng.NormFloat64() * 0.1)
		}
		d.Layers = append(d.Layers, l)
		in = out
	}
	return d
}

func newRandModel(rng *rand.Rand, s Shape, held int, hidden ...int) *randModel {
	m := &randModel{shape: s, bias: rng.Float64() - 0.5, recs: map[uint64][]float32{}}
	if s.HasDense() {
		m.dense = randDense(rng, s.DenseIn(), hidden...)
	}
	for id := range uint64(held) {
		v := make([]float32, s.Width())
		for j := range v {
			v[j] = float32(rng.NormFloat64() * 0.2)
		}
		m.recs[id] = v
	}
	return m
}

func (m *randModel) vec(id uint64) []float32 { return m.recs[id] }

type randReq struct {
	ids, shared []uint64
	b           Batch
}

// request builds a batch with distinct-id numbering (the router's job).
func (m *randModel) request(rng *rand.Rand, rows, perRow, shared, idSpace int, withValues bool) *randReq {
	rq := &randReq{}
	F := max(m.shape.Fields, 1)
	idx := map[uint64]int32{}
	number := func(id uint64) int32 {
		u, ok := idx[id]
		if !ok {
			u = int32(len(idx))
			idx[id] = u
			rec := m.recs[id]
			if rec == nil {
				rec = make([]float32, m.shape.Width())
			}
			rq.b.Vals = append(rq.b.Vals, rec...)
		}
		return u
	}
	for range shared {
		id := uint64(rng.IntN(idSpace))
		rq.shared = append(rq.shared, id)
		rq.b.SharedPos = append(rq.b.SharedPos, number(id))
		rq.b.SharedFields = append(rq.b.SharedFields, int32(rng.IntN(F)))
		if withValues {
			rq.b.SharedValues = append(rq.b.SharedValues, float32(rng.Float64()*2))
		}
	}
	rq.b.RowSplits = []int64{0}
	for range rows * m.shape.DenseInputs {
		rq.b.Dense = append(rq.b.Dense, float32(rng.NormFloat64()))
	}
	for range rows {
		for range rng.IntN(perRow + 1) {
			id := uint64(rng.IntN(idSpace))
			rq.ids = append(rq.ids, id)
			rq.b.Pos = append(rq.b.Pos, number(id))
			rq.b.Fields = append(rq.b.Fields, int32(rng.IntN(F)))
			if withValues {
				rq.b.Values = append(rq.b.Values, float32(rng.Float64()*2))
			}
		}
		rq.b.RowSplits = append(rq.b.RowSplits, int64(len(rq.ids)))
	}
	return rq
}

// row is row r with the shared features, for the reference.
func (rq *randReq) row(r int) Row {
	var row Row
	x := func(vs []float32, i int) float64 {
		if vs == nil {
			return 1
		}
		return float64(vs[i])
	}
	for i := rq.b.RowSplits[r]; i < rq.b.RowSplits[r+1]; i++ {
		row.IDs = append(row.IDs, rq.ids[i])
		row.Xs = append(row.Xs, x(rq.b.Values, int(i)))
		row.Fields = append(row.Fields, rq.b.Fields[i])
	}
	for i, id := range rq.shared {
		row.IDs = append(row.IDs, id)
		row.Xs = append(row.Xs, x(rq.b.SharedValues, i))
		row.Fields = append(row.Fields, rq.b.SharedFields[i])
	}
	if D := len(rq.b.Dense) / max(len(rq.b.RowSplits)-1, 1); len(rq.b.Dense) > 0 {
		row.Dense = rq.b.Dense[r*D : (r+1)*D]
	}
	return row
}

func TestScorersMatchReference(t *testing.T) {
	shapes := []struct {
		s      Shape
		hidden []int
	}{
		{Shape{Type: LR}, nil},
		{Shape{Type: FM, Dim: 4}, nil},
		{Shape{Type: FFM, Dim: 3, Fields: 5}, nil},
		{Shape{Type: FFM, Dim: 1, Fields: 1}, nil},
		{Shape{Type: FFM, Dim: 8, Fields: 20}, nil},
		{Shape{Type: DNN, Dim: 4, Fields: 3, Pooling: "sum"}, []int{16}},
		{Shape{Type: DNN, Dim: 4, Fields: 3, Pooling: "mean"}, []int{16}},
		{Shape{Type: DNN, Dim: 8, Fields: 6, Pooling: "sum", DenseInputs: 5}, []int{64, 32}},
		{Shape{Type: DNN, Dim: 3, Fields: 7, Pooling: "mean", DenseInputs: 2}, []int{37, 5}},
		{Shape{Type: DNN, Dim: 2, Fields: 2, Pooling: "sum"}, nil}, // one layer: in → 1
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range shapes {
		s := c.s
		t.Run(s.String(), func(t *testing.T) {
			m := newRandModel(rng, s, 300, c.hidden...)
			sc, err := s.Scorer(m.bias, m.dense)
			if err != nil {
				t.Fatal(err)
			}
			ref, err := s.Reference(m.bias, m.vec, m.dense)
			if err != nil {
				t.Fatal(err)
			}
			var scratch Scratch
			for _, c := range []struct{ rows, perRow, shared int }{{1, 0, 0}, {5, 12, 0}, {20, 30, 25}, {3, 2, 60}, {50, 6, 1}, {250, 4, 6}} {
				for _, withValues := range []bool{false, true} {
					rq := m.request(rng, c.rows, c.perRow, c.shared, 400, withValues)
					if err := s.CheckRequest(&rq.b, len(rq.ids), len(rq.shared)); err != nil {
						t.Fatal(err)
					}
					out := make([]float32, c.rows)
					sc.Score(out, &rq.b, &scratch)
					for r := range out {
						want := ref.Score(rq.row(r))
						if d := math.Abs(float64(out[r]) - want); !(d <= 1e-6) {
							t.Fatalf("%+v values %v row %d: score %v, reference %v", c, withValues, r, out[r], want)
						}
					}
				}
			}
		})
	}
}

func TestScoreAllocationFree(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, s := range []Shape{{Type: LR}, {Type: FM, Dim: 8}, {Type: FFM, Dim: 4, Fields: 20}, {Type: DNN, Dim: 16, Fields: 20, Pooling: "mean", DenseInputs: 3}} {
		m := newRandModel(rng, s, 1000, 256, 128)
		sc, _ := s.Scorer(m.bias, m.dense)
		rq := m.request(rng, 200, 100, 400, 2000, true)
		out := make([]float32, 200)
		var scratch Scratch
		sc.Score(out, &rq.b, &scratch)
		if n := testing.AllocsPerRun(10, func() { sc.Score(out, &rq.b, &scratch) }); n != 0 {
			t.Errorf("%s: %v allocations per Score", s, n)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, c := range []struct {
		s      Shape
		header string // "" for valid
		msg    string
	}{
		{Shape{Type: LR}, "", ""},
		{Shape{Type: FM, Dim: 8}, "", ""},
		{Shape{Type: FFM, Dim: 4, Fields: 20, MaxRowFeatures: 300}, "", ""},
		{Shape{Type: "svm"}, "type", `unknown model type "svm"`},
		{Shape{Type: LR, Dim: 2}, "dim", "takes no dim"},
		{Shape{Type: FM, Dim: 4, Fields: 3}, "fields", "takes no fields"},
		{Shape{Type: FM}, "dim", "dim 0 outside 1..1024"},
		{Shape{Type: FM, Dim: 1025}, "dim", "outside"},
		{Shape{Type: FFM, Dim: 4}, "fields", "fields 0 outside"},
		{Shape{Type: FFM, Dim: 1024, Fields: 1024}, "fields", "too large"},
		{Shape{Type: FFM, Dim: 4, Fields: 2, MaxRowFeatures: -1}, "max_row_features", "outside"},
		{Shape{Type: LR, MaxRowFeatures: 5}, "max_row_features", "takes no max_row_features"},
	} {
		err := c.s.Validate()
		if c.header == "" {
			if err != nil {
				t.Errorf("%+v: %v", c.s, err)
			}
			continue
		}
		var se *Error
		if !errors.As(err, &se) || se.Header != c.header || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%+v: error %v, want header %q and %q", c.s, err, c.header, c.msg)
		}
	}
}

func TestCheckRequest(t *testing.T) {
	ffm := Shape{Type: FFM, Dim: 2, Fields: 3, MaxRowFeatures: 2}
	splits := []int64{0, 2, 3}
	for _, c := range []struct {
		s        Shape
		b        Batch
		nnz, shr int
		want     string // "" for accepted
	}{
		{Shape{Type: LR}, Batch{RowSplits: splits}, 3, 1, ""},
		{Shape{Type: FM, Dim: 2}, Batch{RowSplits: splits, Fields: []int32{-7}}, 3, 0, ""}, // ignored
		{ffm, Batch{RowSplits: splits, Fields: []int32{0, 1, 2}}, 3, 0, ""},
		{ffm, Batch{RowSplits: splits, Fields: []int32{0, 1, 2}, SharedFields: []int32{2}}, 3, 1, ""},
		{ffm, Batch{RowSplits: splits}, 3, 0, `missing input "fields"`},
		{ffm, Batch{RowSplits: splits, Fields: []int32{0, 1}}, 3, 0, `"fields" has 2 elements for 3 features`},
		{ffm, Batch{RowSplits: splits, Fields: []int32{0, 3, 1}}, 3, 0, "fields[1] = 3 is outside 0..2"},
		{ffm, Batch{RowSplits: splits, Fields: []int32{0, 1, 2}}, 3, 2, `missing input "shared_fields"`},
		{ffm, Batch{RowSplits: splits, Fields: []int32{0, 1, 2}, SharedFields: []int32{1}}, 3, 0, `"shared_fields" has 1 elements for 0 features`},
		{ffm, Batch{RowSplits: splits, Fields: []int32{0, 1, 2}, SharedFields: []int32{-1}}, 3, 1, "shared_fields[0] = -1"},
		{ffm, Batch{RowSplits: []int64{0, 3}, Fields: []int32{0, 1, 2}}, 3, 0, "row 0 has 3 features; this ffm version takes at most 2"},
	} {
		err := c.s.CheckRequest(&c.b, c.nnz, c.shr)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s %+v: %v", c.s, c.b, err)
		case c.want != "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s %+v: error %v, want %q", c.s, c.b, err, c.want)
		}
	}
}

func TestSetHeader(t *testing.T) {
	var s Shape
	for _, h := range [][2]string{{"type", "ffm"}, {"fields", "20"}, {"dim", "4"}, {"max_row_features", "300"}} {
		if ok, err := s.SetHeader(h[0], h[1]); !ok || err != nil {
			t.Fatalf("%v: %v %v", h, ok, err)
		}
	}
	if want := (Shape{Type: FFM, Dim: 4, Fields: 20, MaxRowFeatures: 300}); s != want {
		t.Fatalf("got %+v, want %+v", s, want)
	}
	if ok, _ := s.SetHeader("bias", "1"); ok {
		t.Error("bias is not a shape header")
	}
	for _, h := range [][2]string{{"type", "svm"}, {"dim", "0"}, {"fields", "x"}, {"dim", "-3"}} {
		if ok, err := s.SetHeader(h[0], h[1]); !ok || err == nil {
			t.Errorf("%v accepted", h)
		}
	}
}
