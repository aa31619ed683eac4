// Package prefetch asks the CPU to start loading a cache line without
// waiting for it. Go has no prefetch intrinsic; on amd64 this is one
// PREFETCHT0 instruction behind a call, elsewhere it does nothing.
//
// Why: a plain load of a line that is not needed yet still occupies the
// reorder buffer until it completes, so a few DRAM misses stall the core;
// a prefetch retires at once and the line arrives while other work runs.
package prefetch
