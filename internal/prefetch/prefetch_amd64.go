package prefetch

// Line starts loading the cache line holding addr into all cache levels.
//
//go:noescape
func Line(addr uintptr)
