package prefetch

// Line starts loading the cache line holding addr into all cache levels.
//
//go:noescape
func Line(addr uintptr)

// Range starts loading every cache line of the n bytes at addr: one call
// for a record several lines wide.
//
//go:noescape
func Range(addr, n uintptr)
