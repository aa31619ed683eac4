//go:build !amd64

package vec

const useAVX = false

func axpyAVX(y, x *float32, a float32, n int) { panic("vec: no assembly kernels on this platform") }
func dotAVX(x, y *float32, n int) float32     { panic("vec: no assembly kernels on this platform") }
