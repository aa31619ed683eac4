package model

// ffm is a field-aware factorization machine: each feature i has a field
// f_i and, per field g, a latent vector v_{i,g} of dim factors, stored
// after the weight field by field (field 0's dim values first):
//
//	z = bias + Σ_i w_i x_i + Σ_{i<j} ⟨v_{i,f_j}, v_{j,f_i}⟩ x_i x_j
//
// over a row's own and shared features.
type ffm struct{}

func (ffm) check(s Shape) error {
	if err := checkRange("dim", s.Dim, 1, MaxDim); err != nil {
		return err
	}
	if err := checkRange("fields", s.Fields, 1, MaxFields); err != nil {
		return err
	}
	if 1+s.Fields*s.Dim > MaxWidth || s.Fields*s.Fields*s.Dim > MaxFieldSums {
		return shapeErr("fields", "ffm with %d fields of dim %d is too large (fields·dim ≤ %d, fields²·dim ≤ %d)", s.Fields, s.Dim, MaxWidth-1, MaxFieldSums)
	}
	if s.MaxRowFeatures != 0 {
		return checkRange("max_row_features", s.MaxRowFeatures, 1, 1<<20)
	}
	return nil
}

func (ffm) takes() []string   { return []string{"dim", "fields", "max_row_features"} }
func (ffm) width(s Shape) int { return 1 + s.Fields*s.Dim }
func (ffm) fieldAware() bool  { return true }
func (ffm) genDefaults(s *Shape) {
	if s.Dim == 0 {
		s.Dim = 4
	}
	if s.Fields == 0 {
		s.Fields = 8
	}
}

func (ffm) scorer(s Shape, bias float64) Scorer {
	return ffmScorer{bias: bias, k: s.Dim, F: s.Fields}
}

// ffmScorer computes the pair sum through per-field sums, in float64.
// For a set of features, let S[f][g] = Σ_{i: f_i=f} v_{i,g} x_i (a dim
// vector). Then
//
//	Σ_{i<j} ⟨v_{i,f_j}, v_{j,f_i}⟩ x_i x_j = ½ (Σ_{f,g} ⟨S[f][g], S[g][f]⟩ − Σ_i |v_{i,f_i}|² x_i²)
//
// The shared features' sums A and pair sum are computed once per
// request. Each row sums its own features into B, over the fields it
// has (P); its pairs with the shared features are Σ_{f∈P, g} ⟨B[f][g],
// A[g][f]⟩. A row costs fields·dim per feature plus |P|·(fields + |P|)·
// dim, whatever the number of shared features.
type ffmScorer struct {
	bias float64
	k, F int
}

// fieldSums is one set of per-field sums: sums[f*F*k + g*k:][:k] is
// S[f][g]; rows lists the fields f whose S[f] is in use (the others are
// stale), in first-seen order.
type fieldSums struct {
	sums []float64
	used []bool
	rows []int32
	diag float64 // Σ_i |v_{i,f_i}|² x_i²
	lin  float64 // Σ_i w_i x_i
}

func (fs *fieldSums) reset() {
	for _, f := range fs.rows {
		fs.used[f] = false
	}
	fs.rows, fs.diag, fs.lin = fs.rows[:0], 0, 0
}

// add adds feature v (a record) with field f and value x.
func (fs *fieldSums) add(v []float32, f int32, x float64, k, F int) {
	row := fs.sums[int(f)*F*k : int(f+1)*F*k]
	if !fs.used[f] {
		fs.used[f] = true
		fs.rows = append(fs.rows, f)
		clear(row)
	}
	fs.lin += float64(v[0]) * x
	for j, vj := range v[1 : 1+F*k] {
		row[j] += float64(vj) * x
	}
	own := v[1+int(f)*k : 1+int(f+1)*k]
	sq := 0.0
	for _, vj := range own {
		sq += float64(vj) * float64(vj)
	}
	fs.diag += sq * x * x
}

// cross is Σ_{f∈a.rows, g∈b.rows} ⟨a.S[f][g], b.S[g][f]⟩.
func cross(a, b *fieldSums, k, F int) float64 {
	z := 0.0
	for _, f := range a.rows {
		for _, g := range b.rows {
			x := a.sums[(int(f)*F+int(g))*k:][:k]
			y := b.sums[(int(g)*F+int(f))*k:][:k]
			for j := range x {
				z += x[j] * y[j]
			}
		}
	}
	return z
}

func (m ffmScorer) Score(out []float32, b *Batch, s *Scratch) {
	k, F, w := m.k, m.F, 1+m.F*m.k
	buf := s.float64s(2 * F * F * k)
	var sh, row fieldSums
	sh.sums, row.sums = buf[:F*F*k], buf[F*F*k:]
	used := s.bools(2 * F)
	sh.used, row.used = used[:F], used[F:]
	clear(used)
	rows := s.int32s(2 * F)
	sh.rows, row.rows = rows[:0:F], rows[F:F:2*F]
	for i, u := range b.SharedPos {
		sh.add(b.Vals[int(u)*w:int(u+1)*w], b.SharedFields[i], xval(b.SharedValues, i), k, F)
	}
	shared := m.bias + sh.lin + 0.5*(cross(&sh, &sh, k, F)-sh.diag)
	for r := range out {
		row.reset()
		for i := b.RowSplits[r]; i < b.RowSplits[r+1]; i++ {
			u := int(b.Pos[i])
			row.add(b.Vals[u*w:(u+1)*w], b.Fields[i], xval(b.Values, int(i)), k, F)
		}
		z := shared + row.lin + cross(&row, &sh, k, F) + 0.5*(cross(&row, &row, k, F)-row.diag)
		out[r] = sigmoid(z)
	}
}

// reference is the pairwise sum, as written.
func (ffm) reference(s Shape, bias float64, vec func(uint64) []float32) func(Row) float64 {
	k := s.Dim
	return func(row Row) float64 {
		z := lr{}.reference(Shape{}, bias, vec)(row)
		for i := range row.IDs {
			for j := i + 1; j < len(row.IDs); j++ {
				vi, vj := vec(row.IDs[i]), vec(row.IDs[j])
				if vi == nil || vj == nil {
					continue
				}
				fi, fj := int(row.Fields[i]), int(row.Fields[j])
				a := vi[1+fj*k : 1+(fj+1)*k] // v_{i,f_j}
				c := vj[1+fi*k : 1+(fi+1)*k] // v_{j,f_i}
				dot := 0.0
				for f := range a {
					dot += float64(a[f]) * float64(c[f])
				}
				z += dot * row.Xs[i] * row.Xs[j]
			}
		}
		return z
	}
}
