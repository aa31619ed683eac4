package model

// fm is a factorization machine: z = bias + Σ w_i x_i + Σ_{i<j} ⟨v_i,
// v_j⟩ x_i x_j, with dim factors per key after the weight. The scorer
// uses the O(k·n) form ½ Σ_f [(Σ_i v_if x_i)² − Σ_i v_if² x_i²].
type fm struct{}

func (fm) check(s Shape) error { return checkRange("dim", s.Dim, 1, MaxDim) }
func (fm) takes() []string     { return []string{"dim"} }
func (fm) width(s Shape) int   { return 1 + s.Dim }
func (fm) fieldAware() bool    { return false }
func (fm) genDefaults(s *Shape) {
	if s.Dim == 0 {
		s.Dim = 8
	}
}
func (fm) scorer(s Shape, bias float64, _ *Dense) (Scorer, error) {
	return fmScorer{bias: bias, dim: s.Dim}, nil
}

type fmScorer struct {
	bias float64
	dim  int
}

// fmAcc holds the running sums of one FM evaluation; sum and sq have dim
// entries each.
type fmAcc struct {
	lin     float64
	sum, sq []float64
}

func (a *fmAcc) add(v []float32, x float64) {
	a.lin += float64(v[0]) * x
	for f, vf := range v[1:] {
		t := float64(vf) * x
		a.sum[f] += t
		a.sq[f] += t * t
	}
}

func (m fmScorer) Score(out []float32, b *Batch, s *Scratch) {
	dim, w := m.dim, 1+m.dim
	buf := s.float64s(4 * dim)
	shared := fmAcc{sum: buf[0:dim], sq: buf[dim : 2*dim]}
	clear(buf[:2*dim])
	for i, u := range b.SharedPos {
		shared.add(b.Vals[int(u)*w:int(u+1)*w], xval(b.SharedValues, i))
	}
	row := fmAcc{sum: buf[2*dim : 3*dim], sq: buf[3*dim : 4*dim]}
	for r := range out {
		row.lin = shared.lin
		copy(row.sum, shared.sum)
		copy(row.sq, shared.sq)
		for i := b.RowSplits[r]; i < b.RowSplits[r+1]; i++ {
			u := int(b.Pos[i])
			row.add(b.Vals[u*w:(u+1)*w], xval(b.Values, int(i)))
		}
		z := m.bias + row.lin
		for f := range dim {
			z += 0.5 * (row.sum[f]*row.sum[f] - row.sq[f])
		}
		out[r] = sigmoid(z)
	}
}

// reference is the pairwise sum, as written.
func (fm) reference(_ Shape, bias float64, vec func(uint64) []float32, _ *Dense) func(Row) float64 {
	return pairwise(bias, vec,
		func(vi, _ []float32, _, _ int32) []float32 { return vi[1:] },
		func(_, vj []float32, _, _ int32) []float32 { return vj[1:] })
}

// pairwise is a reference scorer: the linear terms, and for each pair
// i < j of a row's features, the dot product of a(i, j) and b(i, j) (two
// of their factors, chosen by the type) times x_i x_j.
func pairwise(bias float64, vec func(uint64) []float32, a, b func(vi, vj []float32, fi, fj int32) []float32) func(Row) float64 {
	return func(row Row) float64 {
		z := lr{}.reference(Shape{}, bias, vec, nil)(row)
		field := func(i int) int32 {
			if row.Fields == nil {
				return 0
			}
			return row.Fields[i]
		}
		for i := range row.IDs {
			for j := i + 1; j < len(row.IDs); j++ {
				vi, vj := vec(row.IDs[i]), vec(row.IDs[j])
				if vi == nil || vj == nil {
					continue
				}
				x, y := a(vi, vj, field(i), field(j)), b(vi, vj, field(i), field(j))
				dot := 0.0
				for f := range x {
					dot += float64(x[f]) * float64(y[f])
				}
				z += dot * row.Xs[i] * row.Xs[j]
			}
		}
		return z
	}
}
