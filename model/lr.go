package model

// lr is logistic regression: z = bias + Σ w_i x_i, one value per key.
type lr struct{}

func (lr) check(Shape) error                                      { return nil }
func (lr) takes() []string                                        { return nil }
func (lr) width(Shape) int                                        { return 1 }
func (lr) fieldAware() bool                                       { return false }
func (lr) genDefaults(*Shape)                                     {}
func (lr) scorer(_ Shape, bias float64, _ *Dense) (Scorer, error) { return lrScorer{bias}, nil }

type lrScorer struct{ bias float64 }

func (l lrScorer) Score(out []float32, b *Batch, _ *Scratch) {
	shared := l.bias
	for i, u := range b.SharedPos {
		shared += float64(b.Vals[u]) * xval(b.SharedValues, i)
	}
	for r := range out {
		z := shared
		for i := b.RowSplits[r]; i < b.RowSplits[r+1]; i++ {
			z += float64(b.Vals[b.Pos[i]]) * xval(b.Values, int(i))
		}
		out[r] = sigmoid(z)
	}
}

func (lr) reference(_ Shape, bias float64, vec func(uint64) []float32, _ *Dense) func(Row) float64 {
	return func(row Row) float64 {
		z := bias
		for i, id := range row.IDs {
			if v := vec(id); v != nil {
				z += float64(v[0]) * row.Xs[i]
			}
		}
		return z
	}
}
