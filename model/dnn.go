package model

import (
	"math"

	"github.com/cumulus-serving/cumulus/internal/vec"
)

// dnn is embedding + MLP, with an optional wide part. Each key has a
// linear weight (0 when the model has no wide part) and an embedding of
// dim values. For each row and field f, pooled_f = Σ x_i·e_i over the
// row's and the shared features of field f (pooling "sum"), or that sum
// over their count ("mean"; zeros for a field with none). The fields'
// pooled vectors, then DenseInputs continuous features, go through the
// dense layers (ReLU after each but the last, which has one output):
//
//	p = σ(bias + Σ_i w_i x_i + mlp(pooled_0, …, pooled_{F-1}, dense))
type dnn struct{}

func (dnn) check(s Shape) error {
	if err := checkRange("dim", s.Dim, 1, MaxDim); err != nil {
		return err
	}
	if err := checkRange("fields", s.Fields, 1, MaxFields); err != nil {
		return err
	}
	if s.Pooling != "sum" && s.Pooling != "mean" {
		return shapeErr("pooling", "a dnn model needs pooling sum or mean (it has %q)", s.Pooling)
	}
	if s.DenseInputs != 0 {
		if err := checkRange("dense", s.DenseInputs, 1, MaxLayerWidth); err != nil {
			return err
		}
	}
	if s.DenseIn() > MaxLayerWidth {
		return shapeErr("fields", "dnn with %d fields of dim %d and %d dense inputs has %d inputs; at most %d", s.Fields, s.Dim, s.DenseInputs, s.DenseIn(), MaxLayerWidth)
	}
	return nil
}

// DenseIn is the number of inputs a DNN's first dense layer takes:
// fields·dim pooled values, then the continuous features.
func (s Shape) DenseIn() int { return s.Fields*s.Dim + s.DenseInputs }

func (dnn) takes() []string   { return []string{"dim", "fields", "pooling", "dense"} }
func (dnn) width(s Shape) int { return 1 + s.Dim }
func (dnn) fieldAware() bool  { return true }
func (dnn) genDefaults(s *Shape) {
	if s.Dim == 0 {
		s.Dim = 16
	}
	if s.Fields == 0 {
		s.Fields = 8
	}
	if s.Pooling == "" {
		s.Pooling = "sum"
	}
}

// dnnLayer is a dense layer as the scorer multiplies it: its weights
// transposed ([in][out], so that rows of a batch multiply it with
// vec.Gemm), or, for a one-output layer, its weight row.
type dnnLayer struct {
	in, out int
	wt      []float32
	b       []float32
}

func (dnn) scorer(s Shape, bias float64, d *Dense) (Scorer, error) {
	return &dnnScorer{bias: bias, k: s.Dim, F: s.Fields, D: s.DenseInputs, mean: s.Pooling == "mean", layers: d.layers()}, nil
}

// layers are d's layers as the scorer multiplies them, made on first use
// and shared by every scorer of d: a router builds its scorers at every
// routing table, and versions (deltas) share a dense part.
func (d *Dense) layers() []dnnLayer {
	d.once.Do(func() {
		for _, l := range d.Layers {
			dl := dnnLayer{in: l.In, out: l.Out, b: l.B, wt: l.W}
			if l.Out > 1 {
				dl.wt = make([]float32, l.In*l.Out)
				for o := range l.Out {
					for i := range l.In {
						dl.wt[i*l.Out+o] = l.W[o*l.In+i]
					}
				}
			}
			d.prepared = append(d.prepared, dl)
		}
	})
	return d.prepared
}

type dnnScorer struct {
	bias    float64
	k, F, D int
	mean    bool
	layers  []dnnLayer
}

// dnnChunk is how many rows go through the layers at once: the
// scratch is a few chunks' inputs and activations, however many rows a
// request has.
const dnnChunk = 96

// Score pools each row's features into a row of U, runs the rows through
// the layers with vec.Gemm, dnnChunk at a time, and adds the wide part.
// The shared features' pooled values go through the first layer once per
// request (base): a row's input to it is its difference from the shared
// one, non-zero only in the fields the row has features in and the
// continuous features, and only those columns are multiplied (per block
// of vec.RowBlock rows).
func (m *dnnScorer) Score(out []float32, b *Batch, s *Scratch) {
	k, F, D, w := m.k, m.F, m.D, 1+m.k
	in := F*k + D
	rows := len(out)
	blk := vec.RowBlock()
	C := dnnChunk / blk * blk
	widest := 0
	for _, l := range m.layers {
		widest = max(widest, l.out)
	}
	buf := s.float32s(in + C*in + 2*C*widest + widest)
	shared, buf := buf[:in], buf[in:] // the shared features' input: pooled fields, zero dense part
	u, buf := buf[:C*in], buf[C*in:]  // each row's difference from it
	h0buf, buf := buf[:C*widest], buf[C*widest:]
	h1buf, base := buf[:C*widest], buf[C*widest:]
	clear(shared)
	counts := s.int32s(2 * F)
	sharedN, rowN := counts[:F], counts[F:]
	clear(sharedN)
	used := s.bools(F)
	lin := s.float64s(C) // each row's bias and wide part

	sharedLin := m.bias
	for i, p := range b.SharedPos {
		rec := b.Vals[int(p)*w : int(p+1)*w]
		x := x32(b.SharedValues, i)
		f := b.SharedFields[i]
		sharedLin += float64(rec[0]) * float64(x)
		vec.Axpy(shared[int(f)*k:int(f+1)*k], x, rec[1:])
		sharedN[f]++
	}
	if m.mean {
		for f, n := range sharedN {
			if n > 1 {
				scale(shared[f*k:(f+1)*k], 1/float32(n))
			}
		}
	}
	// The first layer's base: b + W·shared, once.
	l0 := m.layers[0]
	copy(base[:l0.out], l0.b)
	multiply(base, shared, in, l0, 0, in, 1)
	for c0 := 0; c0 < rows; c0 += C {
		n := min(C, rows-c0)
		R := (n + blk - 1) / blk * blk
		clear(u[:R*in])
		for r := range n {
			ur := u[r*in : (r+1)*in]
			clear(rowN)
			z := sharedLin
			for i := b.RowSplits[c0+r]; i < b.RowSplits[c0+r+1]; i++ {
				p := int(b.Pos[i])
				rec := b.Vals[p*w : (p+1)*w]
				x := x32(b.Values, int(i))
				f := b.Fields[i]
				z += float64(rec[0]) * float64(x)
				vec.Axpy(ur[int(f)*k:int(f+1)*k], x, rec[1:])
				rowN[f]++
			}
			if m.mean {
				// pooled = (shared sum + row sum) / (shared count + row
				// count); ur holds the row sum, shared the shared mean.
				for f, nr := range rowN {
					if nr == 0 {
						continue
					}
					all := float32(nr + sharedN[f])
					sh, d := shared[f*k:(f+1)*k], ur[f*k:(f+1)*k]
					for j := range d {
						d[j] = (sh[j]*float32(sharedN[f])+d[j])/all - sh[j]
					}
				}
			}
			copy(ur[F*k:], b.Dense[(c0+r)*D:(c0+r+1)*D])
			lin[r] = z
		}
		h0, h1 := h0buf, h1buf
		// Each row adds W·(its difference) to the base, over the columns
		// some row of its block uses.
		l := l0
		for r := range R {
			copy(h0[r*l.out:(r+1)*l.out], base[:l.out])
		}
		for r0 := 0; r0 < R; r0 += blk {
			clear(used)
			for r := r0; r < min(r0+blk, n); r++ {
				for i := b.RowSplits[c0+r]; i < b.RowSplits[c0+r+1]; i++ {
					used[b.Fields[i]] = true
				}
			}
			for f := 0; f < F; {
				if !used[f] {
					f++
					continue
				}
				g := f
				for g < F && used[g] {
					g++
				}
				multiply(h0[r0*l.out:], u[r0*in+f*k:], in, l, f*k, (g-f)*k, blk)
				f = g
			}
			if D > 0 {
				multiply(h0[r0*l.out:], u[r0*in+F*k:], in, l, F*k, D, blk)
			}
		}
		// The other layers, each on the one before's ReLU.
		for _, next := range m.layers[1:] {
			vec.Relu(h0[:R*l.out])
			for r := range R {
				copy(h1[r*next.out:(r+1)*next.out], next.b)
			}
			multiply(h1, h0, l.out, next, 0, l.out, R)
			h0, h1, l = h1, h0, next
		}
		for r := range n {
			out[c0+r] = sigmoid(lin[r] + float64(h0[r]))
		}
	}
}

// multiply adds layer l's product with its inputs [c, c+n) of rows rows
// (x, row stride ldx, starting at input c) to h (row stride l.out): a
// matrix product, or dot products for a one-output layer.
func multiply(h, x []float32, ldx int, l dnnLayer, c, n, rows int) {
	if l.out == 1 {
		for r := range rows {
			h[r] += vec.Dot(x[r*ldx:r*ldx+n], l.wt[c:c+n])
		}
		return
	}
	vec.Gemm(h, l.out, x, ldx, l.wt[c*l.out:], l.out, rows, l.out, n)
}

func scale(v []float32, a float32) {
	for i := range v {
		v[i] *= a
	}
}

// reference pools and multiplies in float64, as the formulas are
// written, with the layers as stored ([out][in]).
func (dnn) reference(s Shape, bias float64, vecOf func(uint64) []float32, d *Dense) func(Row) float64 {
	k, F := s.Dim, s.Fields
	return func(row Row) float64 {
		z := bias
		pooled := make([]float64, F*k+s.DenseInputs)
		count := make([]int, F)
		for i, id := range row.IDs {
			f := int(row.Fields[i])
			count[f]++
			e := vecOf(id)
			if e == nil {
				continue
			}
			z += float64(e[0]) * row.Xs[i]
			for j := range k {
				pooled[f*k+j] += float64(e[1+j]) * row.Xs[i]
			}
		}
		if s.Pooling == "mean" {
			for f, n := range count {
				for j := range k {
					if n > 0 {
						pooled[f*k+j] /= float64(n)
					}
				}
			}
		}
		for j, x := range row.Dense {
			pooled[F*k+j] = float64(x)
		}
		h := pooled
		for n, l := range d.Layers {
			next := make([]float64, l.Out)
			for o := range l.Out {
				a := float64(l.B[o])
				for i := range l.In {
					a += float64(l.W[o*l.In+i]) * h[i]
				}
				if n < len(d.Layers)-1 {
					a = math.Max(a, 0)
				}
				next[o] = a
			}
			h = next
		}
		return z + h[0]
	}
}
