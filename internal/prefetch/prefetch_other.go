//go:build !amd64

package prefetch

// Line does nothing on this architecture.
func Line(addr uintptr) {}

// Range does nothing on this architecture.
func Range(addr, n uintptr) {}
