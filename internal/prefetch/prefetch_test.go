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
}
