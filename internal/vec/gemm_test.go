package vec

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// Gemm agrees with a float64 triple loop, on shapes around the kernel's
// 6×16 blocks, with strides wider than the blocks.
func TestGemm(t *testing.T) {
	rng := rand.New(rand.NewPCG(2, 2))
	for _, c := range [][3]int{{1, 1, 1}, {6, 16, 1}, {6, 16, 7}, {7, 17, 5}, {12, 32, 40}, {13, 50, 33}, {200, 256, 320}, {5, 15, 3}} {
		rows, cols, k := c[0], c[1], c[2]
		ldx, ldw, ldy := k+3, cols+5, cols+2
		x, w, y := randSlice(rng, rows*ldx), randSlice(rng, k*ldw), randSlice(rng, rows*ldy)
		want := make([]float64, len(y))
		for i := range y {
			want[i] = float64(y[i])
		}
		for r := range rows {
			for col := range cols {
				for i := range k {
					want[r*ldy+col] += float64(x[r*ldx+i]) * float64(w[i*ldw+col])
				}
			}
		}
		Gemm(y, ldy, x, ldx, w, ldw, rows, cols, k)
		for r := range rows {
			for col := range ldy {
				got, exp := float64(y[r*ldy+col]), want[r*ldy+col]
				if math.Abs(got-exp) > 1e-5*(1+float64(k)) {
					t.Fatalf("%v: y[%d][%d] = %v, want %v", c, r, col, got, exp)
				}
			}
		}
	}
}

func randSlice(rng *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(rng.NormFloat64())
	}
	return s
}

// BenchmarkGemm reports GFLOP/s (2 per multiply-add) for a DNN's layers
// on a rank200 batch: 200 rows, 320 → 256 → 128.
func BenchmarkGemm(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 3))
	for _, c := range [][3]int{{200, 256, 320}, {200, 128, 256}} {
		rows, cols, k := c[0], c[1], c[2]
		x, w, y := randSlice(rng, rows*k), randSlice(rng, k*cols), make([]float32, rows*cols)
		for _, kernel := range []string{"asm", "go"} {
			b.Run(fmt.Sprintf("%dx%dx%d/%s", rows, k, cols, kernel), func(b *testing.B) {
				if kernel == "asm" && !useAVX {
					b.Skip("no AVX2+FMA")
				}
				for b.Loop() {
					if kernel == "asm" {
						Gemm(y, cols, x, k, w, cols, rows, cols, k)
					} else {
						gemmGo(y, cols, x, k, w, cols, rows, cols, k)
					}
				}
				b.ReportMetric(2*float64(rows*cols*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}
