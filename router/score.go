package router

import (
	"math"

	"github.com/cumulus-serving/cumulus/codec"
)

// Scoring. vals holds, for each distinct id u, width floats at
// vals[u*width:]: the linear weight, then FM factors; zero for ids the
// model lacks. pos maps each feature occurrence to its distinct id.
//
// LR: z = bias + Σ w_i x_i.
// FM: z = bias + Σ w_i x_i + ½ Σ_f [(Σ_i v_if x_i)² − Σ_i v_if² x_i²],
// the O(k·n) form of Σ_{i<j} ⟨v_i, v_j⟩ x_i x_j.
// The shared features' sums are computed once and added to every row.
// Accumulation is in float64. Score = σ(z).

// score writes the score of each of req's rows into out, from the values
// w holds for the request's distinct ids.
func (vr *versionRoute) score(out []float32, w *work, req *Request) {
	switch vr.typ {
	case codec.TypeLR:
		scoreLR(out, vr.bias, w.vals, req, w.sharedPos, w.pos)
	case codec.TypeFM:
		w.fmBuf = resize(w.fmBuf, 4*vr.dim)
		scoreFM(out, vr.bias, vr.dim, w.vals, req, w.sharedPos, w.pos, w.fmBuf)
	}
}

func sigmoid(z float64) float32 { return float32(1 / (1 + math.Exp(-z))) }

func xval(vs []float32, i int) float64 {
	if vs == nil {
		return 1
	}
	return float64(vs[i])
}

func scoreLR(out []float32, bias float64, vals []float32, req *Request, sharedPos, pos []int32) {
	shared := bias
	for i, u := range sharedPos {
		shared += float64(vals[u]) * xval(req.SharedValues, i)
	}
	for r := range out {
		z := shared
		for i := req.RowSplits[r]; i < req.RowSplits[r+1]; i++ {
			z += float64(vals[pos[i]]) * xval(req.Values, int(i))
		}
		out[r] = sigmoid(z)
	}
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

func scoreFM(out []float32, bias float64, dim int, vals []float32, req *Request, sharedPos, pos []int32, buf []float64) {
	w := 1 + dim
	shared := fmAcc{sum: buf[0:dim], sq: buf[dim : 2*dim]}
	clear(buf[:2*dim])
	for i, u := range sharedPos {
		shared.add(vals[int(u)*w:int(u+1)*w], xval(req.SharedValues, i))
	}
	row := fmAcc{sum: buf[2*dim : 3*dim], sq: buf[3*dim : 4*dim]}
	for r := range out {
		row.lin = shared.lin
		copy(row.sum, shared.sum)
		copy(row.sq, shared.sq)
		for i := req.RowSplits[r]; i < req.RowSplits[r+1]; i++ {
			u := int(pos[i])
			row.add(vals[u*w:(u+1)*w], xval(req.Values, int(i)))
		}
		z := bias + row.lin
		for f := range dim {
			z += 0.5 * (row.sum[f]*row.sum[f] - row.sq[f])
		}
		out[r] = sigmoid(z)
	}
}
