package vec

import "golang.org/x/sys/cpu"

// useAVX: the assembly kernels need AVX2 and FMA.
var useAVX = cpu.X86.HasAVX2 && cpu.X86.HasFMA

//go:noescape
func axpyAVX(y, x *float32, a float32, n int)

//go:noescape
func dotAVX(x, y *float32, n int) float32
