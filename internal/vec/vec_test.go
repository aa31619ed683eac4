package vec

import (
	"math"
	"math/rand/v2"
	"testing"
)

// The kernels agree with the plain Go ones, for every length around the
// assembly's block sizes and at unaligned offsets.
func TestKernelsMatchGo(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for n := range 80 {
		for off := range 3 {
			x, y := make([]float32, n+off), make([]float32, n+off)
			for i := range x {
				x[i], y[i] = float32(rng.NormFloat64()), float32(rng.NormFloat64())
			}
			x, y = x[off:], y[off:]
			a := float32(rng.NormFloat64())
			want := append([]float32(nil), y...)
			axpyGo(want, a, x)
			got := append([]float32(nil), y...)
			Axpy(got, a, x)
			for i := range want {
				if math.Abs(float64(got[i]-want[i])) > 1e-6*(1+math.Abs(float64(want[i]))) {
					t.Fatalf("axpy n=%d off=%d: [%d] = %v, want %v", n, off, i, got[i], want[i])
				}
			}
			exact := 0.0
			for i := range x {
				exact += float64(x[i]) * float64(y[i])
			}
			if d := Dot(x, y); math.Abs(float64(d)-exact) > 1e-5*(1+float64(n)) {
				t.Fatalf("dot n=%d off=%d: %v, want %v", n, off, d, exact)
			}
		}
	}
	for n := range 80 {
		v := randSlice(rng, n)
		v = append(v, float32(math.Copysign(0, -1)), float32(math.Inf(-1)))
		want := append([]float32(nil), v...)
		reluGo(want)
		Relu(v)
		for i := range v {
			if v[i] != want[i] || v[i] < 0 {
				t.Fatalf("relu n=%d: [%d] = %v, want %v", n, i, v[i], want[i])
			}
		}
	}
	if !useAVX {
		t.Log("no AVX2+FMA here: the Go kernels were compared with themselves")
	}
}

func TestNoAllocation(t *testing.T) {
	x, y := make([]float32, 100), make([]float32, 100)
	if n := testing.AllocsPerRun(10, func() { Axpy(y, 2, x); _ = Dot(x, y) }); n != 0 {
		t.Errorf("%v allocations", n)
	}
}

func BenchmarkAxpy80(b *testing.B) {
	x, y := make([]float32, 80), make([]float32, 80)
	for b.Loop() {
		Axpy(y, 0.5, x)
	}
}

func BenchmarkDot80(b *testing.B) {
	x, y := make([]float32, 80), make([]float32, 80)
	for b.Loop() {
		Dot(x, y)
	}
}
