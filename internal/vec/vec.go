// Package vec holds the float32 kernels the router's scorers run per
// request: y += a·x, x·y and (for dense layers) a matrix product. On
// amd64 with AVX2 and FMA they are Go assembly; elsewhere, and as the
// reference the assembly is tested against, plain Go.
//
// They are written here rather than taken from a BLAS: a cgo BLAS would
// make every build of Cumulus need a C toolchain and the library, and
// these few kernels, on short vectors with no allocation, are the hot
// path's own.
package vec

// Axpy adds a·x to y: y[i] += a·x[i] for i < len(x). y must be at least
// as long as x.
func Axpy(y []float32, a float32, x []float32) {
	if len(x) == 0 {
		return
	}
	_ = y[len(x)-1]
	if useAVX {
		axpyAVX(&y[0], &x[0], a, len(x))
		return
	}
	axpyGo(y, a, x)
}

// Dot is Σ x[i]·y[i] over i < len(x). y must be at least as long as x.
func Dot(x, y []float32) float32 {
	if len(x) == 0 {
		return 0
	}
	_ = y[len(x)-1]
	if useAVX {
		return dotAVX(&x[0], &y[0], len(x))
	}
	return dotGo(x, y)
}

func axpyGo(y []float32, a float32, x []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] += a * v
	}
}

func dotGo(x, y []float32) float32 {
	y = y[:len(x)]
	var s float32
	for i, v := range x {
		s += v * y[i]
	}
	return s
}

// Relu sets every negative element of v to zero.
func Relu(v []float32) {
	if len(v) == 0 {
		return
	}
	if useAVX {
		reluAVX(&v[0], len(v))
		return
	}
	reluGo(v)
}

func reluGo(v []float32) {
	for i, x := range v {
		if x < 0 {
			v[i] = 0
		}
	}
}
