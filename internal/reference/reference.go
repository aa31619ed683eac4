// Package reference scores requests the slow, obvious way: a map of
// weights and the pairwise FM sum Σ_{i<j} ⟨v_i, v_j⟩ x_i x_j, in float64.
// Tests compare the serving path against it; it shares no code with the
// router's scorer.
package reference

import (
	"math"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/loader"
)

// Model is a model held for reference scoring.
type Model struct {
	m    *loader.Sparse
	vecs map[uint64][]float32
}

// New indexes a model.
func New(m *loader.Sparse) *Model {
	r := &Model{m: m, vecs: map[uint64][]float32{}}
	for i, k := range m.Keys {
		r.vecs[k] = m.Values[i*m.Width() : (i+1)*m.Width()]
	}
	return r
}

// Score is the probability for one row of features (ids, xs).
func (r *Model) Score(ids []uint64, xs []float64) float64 {
	z := r.m.Bias
	for i, id := range ids {
		if v, ok := r.vecs[id]; ok {
			z += float64(v[0]) * xs[i]
		}
	}
	if r.m.Type == codec.TypeFM {
		for i := range ids {
			for j := i + 1; j < len(ids); j++ {
				vi, vj := r.vecs[ids[i]], r.vecs[ids[j]]
				if vi == nil || vj == nil {
					continue
				}
				dot := 0.0
				for f := 1; f < len(vi); f++ {
					dot += float64(vi[f]) * float64(vj[f])
				}
				z += dot * xs[i] * xs[j]
			}
		}
	}
	return 1 / (1 + math.Exp(-z))
}
