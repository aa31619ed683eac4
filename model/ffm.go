package model

import "github.com/cumulus-serving/cumulus/internal/vec"

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

func (ffm) scorer(s Shape, bias float64, _ *Dense) (Scorer, error) {
	return ffmScorer{bias: bias, k: s.Dim, F: s.Fields}, nil
}

// ffmScorer computes the pair sum through per-field sums. For a set of
// features, let S[f][g] = Σ_{i: f_i=f} v_{i,g} x_i (a dim vector). Then
//
//	Σ_{i<j} ⟨v_{i,f_j}, v_{j,f_i}⟩ x_i x_j = ½ (Σ_{f,g} ⟨S[f][g], S[g][f]⟩ − Σ_i |v_{i,f_i}|² x_i²)
//
// The shared features' sums A and their pair sum are computed once per
// request, and A transposed (T[f][g] = A[g][f]). Each row sums its own
// features into B, over the fields it has (P); its pairs with the shared
// features are Σ_{f∈P} ⟨B[f], T[f]⟩, one dot product of fields·dim per
// field. A row costs fields·dim per feature (one vec.Axpy) plus |P|·
// (fields + |P|)·dim, whatever the number of shared features. Sums are
// float32 (as a trainer's forward pass), each row's terms added in
// float64.
type ffmScorer struct {
	bias float64
	k, F int
}

// fieldSums is one set of per-field sums: sums[f*F*k:][:F*k] is S[f],
// S[f][g] at offset g*k; rows lists the fields f whose S[f] is in use
// (the others are stale), in first-seen order.
type fieldSums struct {
	sums []float32
	used []bool
	rows []int32
	diag float64 // Σ_i |v_{i,f_i}|² x_i²
	lin  float64 // Σ_i w_i x_i
}

// addAll adds each feature i in [lo, hi) of b's own (shared: b's shared)
// features, lin and diag summed in registers rather than through fs.
func (fs *fieldSums) addAll(b *Batch, shared bool, lo, hi int, k, F int) {
	w := 1 + F*k
	pos, fields, values := b.Pos, b.Fields, b.Values
	if shared {
		pos, fields, values = b.SharedPos, b.SharedFields, b.SharedValues
	}
	lin, diag := fs.lin, fs.diag
	for i := lo; i < hi; i++ {
		u := int(pos[i])
		l, d := fs.add(b.Vals[u*w:(u+1)*w], fields[i], x32(values, i), k, F)
		lin += l
		diag += d
	}
	fs.lin, fs.diag = lin, diag
}

func (fs *fieldSums) reset() {
	for _, f := range fs.rows {
		fs.used[f] = false
	}
	fs.rows, fs.diag, fs.lin = fs.rows[:0], 0, 0
}

// add adds feature v (a record) with field f and value x to the sums,
// and returns its terms of lin and diag.
func (fs *fieldSums) add(v []float32, f int32, x float32, k, F int) (lin, diag float64) {
	n := F * k
	row := fs.sums[int(f)*n : int(f+1)*n]
	if !fs.used[f] {
		fs.used[f] = true
		fs.rows = append(fs.rows, f)
		clear(row)
	}
	vec.Axpy(row, x, v[1:1+n])
	var sq float32
	for _, o := range v[1+int(f)*k : 1+int(f+1)*k] {
		sq += o * o
	}
	return float64(v[0]) * float64(x), float64(sq) * float64(x) * float64(x)
}

// pairs is Σ_{f,g∈fs.rows} ⟨S[f][g], S[g][f]⟩: each unordered pair of
// fields once (the sum is symmetric), inline (dim is short: a call per
// product would cost more than the product).
func (fs *fieldSums) pairs(k, F int) float64 {
	z := 0.0
	for a, f := range fs.rows {
		for _, g := range fs.rows[a:] {
			x := fs.sums[(int(f)*F+int(g))*k:][:k]
			y := fs.sums[(int(g)*F+int(f))*k:][:k]
			var d float32
			for j := range x {
				d += x[j] * y[j]
			}
			if f != g {
				d *= 2
			}
			z += float64(d)
		}
	}
	return z
}

func (m ffmScorer) Score(out []float32, b *Batch, s *Scratch) {
	k, F := m.k, m.F
	n := F * k
	buf := s.float32s(3 * F * n)
	var sh, row fieldSums
	sh.sums, row.sums = buf[:F*n], buf[F*n:2*F*n]
	tr := buf[2*F*n:] // T, zero where the shared features have no field
	used := s.bools(2 * F)
	sh.used, row.used = used[:F], used[F:]
	clear(used)
	rows := s.int32s(2 * F)
	sh.rows, row.rows = rows[:0:F], rows[F:F:2*F]
	sh.addAll(b, true, 0, len(b.SharedPos), k, F)
	clear(tr)
	for _, g := range sh.rows {
		for f := range F {
			copy(tr[(f*F+int(g))*k:][:k], sh.sums[(int(g)*F+f)*k:][:k])
		}
	}
	shared := m.bias + sh.lin + 0.5*(sh.pairs(k, F)-sh.diag)
	for r := range out {
		row.reset()
		row.addAll(b, false, int(b.RowSplits[r]), int(b.RowSplits[r+1]), k, F)
		cross := 0.0
		for _, f := range row.rows {
			cross += float64(vec.Dot(row.sums[int(f)*n:][:n], tr[int(f)*n:][:n]))
		}
		z := shared + row.lin + cross + 0.5*(row.pairs(k, F)-row.diag)
		out[r] = sigmoid(z)
	}
}

// reference is the pairwise sum, as written: ⟨v_{i,f_j}, v_{j,f_i}⟩.
func (ffm) reference(s Shape, bias float64, vec func(uint64) []float32, _ *Dense) func(Row) float64 {
	k := s.Dim
	return pairwise(bias, vec,
		func(vi, _ []float32, _, fj int32) []float32 { return vi[1+int(fj)*k : 1+int(fj+1)*k] },
		func(_, vj []float32, fi, _ int32) []float32 { return vj[1+int(fi)*k : 1+int(fi+1)*k] })
}
