//go:build !amd64

package vec

const (
	useAVX    = false
	useAVX512 = false
	useF16C   = false
)

func axpyAVX(y, x *float32, a float32, n int) { panic("vec: no assembly kernels on this platform") }
func dotAVX(x, y *float32, n int) float32     { panic("vec: no assembly kernels on this platform") }

func tile12x32(x *float32, ldx int, w *float32, ldw int, y *float32, ldy int, k int) {
	panic("vec: no assembly kernels on this platform")
}

func tile6x16(x *float32, ldx int, w *float32, ldw int, y *float32, ldy int, k int) {
	panic("vec: no assembly kernels on this platform")
}

func reluAVX(v *float32, n int) { panic("vec: no assembly kernels on this platform") }

func fromHalfAVX(dst *float32, src *byte, n int) { panic("vec: no assembly kernels on this platform") }
func fromInt8AVX(dst *float32, src *byte, scale float32, n int) {
	panic("vec: no assembly kernels on this platform")
}
