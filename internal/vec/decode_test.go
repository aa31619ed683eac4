package vec

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// sameFloat compares bit for bit, NaNs by being NaN (converting a
// signalling NaN may quiet it).
func sameFloat(a, b float32) bool {
	if a != a || b != b {
		return a != a && b != b
	}
	return math.Float32bits(a) == math.Float32bits(b)
}

// TestFromHalfEveryValue: every one of the 65,536 halves converts as the
// Go twin converts it, at every length around the kernel's blocks and
// from unaligned bytes.
func TestFromHalfEveryValue(t *testing.T) {
	src := make([]byte, 2*65536+1)
	for i := range 65536 {
		binary.LittleEndian.PutUint16(src[1+2*i:], uint16(i))
	}
	got, want := make([]float32, 65536), make([]float32, 65536)
	FromHalf(got, src[1:])
	fromHalfGo(want, src[1:])
	for i := range got {
		if !sameFloat(got[i], want[i]) {
			t.Fatalf("half %#04x: %v, the Go twin %v", i, got[i], want[i])
		}
	}
	rng := rand.New(rand.NewPCG(1, 1))
	for n := range 80 {
		off := rng.IntN(65536 - n)
		g, w := make([]float32, n), make([]float32, n)
		FromHalf(g, src[1+2*off:])
		fromHalfGo(w, src[1+2*off:])
		for i := range g {
			if !sameFloat(g[i], w[i]) {
				t.Fatalf("length %d, element %d: %v, the Go twin %v", n, i, g[i], w[i])
			}
		}
	}
}

// TestFromInt8MatchesGo: every int8 under scales large, small and
// subnormal, at every length around the kernel's blocks.
func TestFromInt8MatchesGo(t *testing.T) {
	src := make([]byte, 257)
	for i := range 256 {
		src[1+i] = byte(i)
	}
	rng := rand.New(rand.NewPCG(2, 2))
	scales := []float32{0, 1, 1.0 / 127, 0.3 / 127, math.MaxFloat32 / 128, math.SmallestNonzeroFloat32, 1e-39}
	for range 20 {
		scales = append(scales, float32(rng.NormFloat64())/127)
	}
	for _, s := range scales {
		g, w := make([]float32, 256), make([]float32, 256)
		FromInt8(g, src[1:], s)
		fromInt8Go(w, src[1:], s)
		for i := range g {
			if !sameFloat(g[i], w[i]) {
				t.Fatalf("scale %g, q %d: %v, the Go twin %v", s, int8(i), g[i], w[i])
			}
		}
	}
	for n := range 80 {
		off := rng.IntN(256 - n)
		g, w := make([]float32, n), make([]float32, n)
		FromInt8(g, src[1+off:], 0.01)
		fromInt8Go(w, src[1+off:], 0.01)
		for i := range g {
			if !sameFloat(g[i], w[i]) {
				t.Fatalf("length %d, element %d: %v, the Go twin %v", n, i, g[i], w[i])
			}
		}
	}
}

func TestDecodersAllocateNothing(t *testing.T) {
	src, dst := make([]byte, 200), make([]float32, 100)
	if n := testing.AllocsPerRun(100, func() { FromHalf(dst, src); FromInt8(dst, src, 0.5) }); n != 0 {
		t.Errorf("%v allocations", n)
	}
}
