// Package scratch keeps per-request scratch memory for reuse across
// garbage collections.
//
// sync.Pool drops what it holds within two collections, and a busy
// router or shard collects every few tens of milliseconds (its requests
// make garbage it does not own: decoded tensors, gRPC's buffers). Its
// pooled scratch — hundreds of KiB per request, grown to fit — was then
// allocated, zeroed and faulted in again every hundred requests or so. A
// List keeps up to a bound of them instead, and lets the owner refuse to
// keep one grown too large by an outsized request.
package scratch

import "runtime"

// List is a bounded free list of *T. Safe for concurrent use.
type List[T any] struct {
	free chan *T
	new  func() *T
	keep func(*T) bool
}

// New keeps up to perCPU scratch values per CPU (at least 8); newT makes
// one, and keep, if not nil, says whether one put back is worth keeping.
func New[T any](perCPU int, newT func() *T, keep func(*T) bool) *List[T] {
	return &List[T]{free: make(chan *T, max(8, perCPU*runtime.GOMAXPROCS(0))), new: newT, keep: keep}
}

// Get returns a kept value, or a new one.
func (l *List[T]) Get() *T {
	select {
	case x := <-l.free:
		return x
	default:
		return l.new()
	}
}

// Put keeps x for a later Get, unless the list is full or keep refuses
// it.
func (l *List[T]) Put(x *T) {
	if l.keep != nil && !l.keep(x) {
		return
	}
	select {
	case l.free <- x:
	default:
	}
}
