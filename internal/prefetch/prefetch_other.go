//go:build !amd64

package prefetch

// Line does nothing on this architecture.
func Line(addr uintptr) {}
