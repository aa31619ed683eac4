// Package reference holds a whole model in a map and scores rows with
// model's reference scorer (pairwise sums as the formulas are written,
// in float64). Tests compare the serving path against it; it shares no
// code with the router's scorers.
package reference

import (
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
)

// Model is a model held for reference scoring.
type Model struct {
	vecs map[uint64][]float32
	ref  *model.Reference
}

// New indexes a model.
func New(m *loader.Sparse) *Model {
	r := &Model{vecs: map[uint64][]float32{}}
	w := m.Width()
	for i, k := range m.Keys {
		r.vecs[k] = m.Values[i*w : (i+1)*w]
	}
	ref, err := m.Shape.Reference(m.Bias, func(id uint64) []float32 { return r.vecs[id] }, m.Dense)
	if err != nil {
		panic("reference: " + err.Error()) // tests build valid models
	}
	r.ref = ref
	return r
}

// Score is the probability for one row of features (ids, xs), all of
// field 0.
func (r *Model) Score(ids []uint64, xs []float64) float64 {
	return r.ref.Score(model.Row{IDs: ids, Xs: xs, Fields: make([]int32, len(ids))})
}

// ScoreRow is the probability for one row: its own and the shared
// features, with their values and fields.
func (r *Model) ScoreRow(row model.Row) float64 { return r.ref.Score(row) }
