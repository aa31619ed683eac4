package prefetch

import (
	"testing"
	"unsafe"
)

// Prefetching any address, even an unmapped one, must not fault.
func TestLine(t *testing.T) {
	b := make([]byte, 4096)
	Line(uintptr(unsafe.Pointer(&b[100])))
	Line(0)
	Line(^uintptr(0))
	Range(uintptr(unsafe.Pointer(&b[100])), 3000)
	Range(0, 0)
	Range(^uintptr(0)-100, 50)
}
