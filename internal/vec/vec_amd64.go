package vec

import "golang.org/x/sys/cpu"

// useAVX: the assembly kernels need AVX2 and FMA; tile12x32 needs
// AVX-512 as well.
var (
	useAVX    = cpu.X86.HasAVX2 && cpu.X86.HasFMA
	useAVX512 = useAVX && cpu.X86.HasAVX512F
	useF16C   = useAVX && cpu.X86.HasF16C
)

//go:noescape
func axpyAVX(y, x *float32, a float32, n int)

//go:noescape
func dotAVX(x, y *float32, n int) float32

// tile6x16 adds x[0:6][0:k] · w[0:k][0:16] to y[0:6][0:16] (strides in
// elements).
//
//go:noescape
func tile12x32(x *float32, ldx int, w *float32, ldw int, y *float32, ldy int, k int)

//go:noescape
func tile6x16(x *float32, ldx int, w *float32, ldw int, y *float32, ldy int, k int)

//go:noescape
func reluAVX(v *float32, n int)

// fromHalfAVX converts n halves (n a multiple of 8) at src to float32s at
// dst.
//
//go:noescape
func fromHalfAVX(dst *float32, src *byte, n int)

// fromInt8AVX sets n float32s (n a multiple of 8) at dst to the int8s at
// src times scale.
//
//go:noescape
func fromInt8AVX(dst *float32, src *byte, scale float32, n int)
