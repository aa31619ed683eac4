// Package hugemem allocates large read-mostly buffers outside the Go
// heap, backed by transparent huge pages where the kernel allows.
//
// Why: a shard table is hundreds of MB read at random. With 4 KiB pages
// almost every lookup also misses the TLB; 2 MiB pages remove most of
// those misses. Go's heap does not ask for huge pages, so tables are
// allocated here: an anonymous mapping with MADV_HUGEPAGE, returned to
// the kernel by a cleanup once its owner is unreachable, so no reader can
// ever touch unmapped memory.
package hugemem

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// Buffer owns a mapping. Bytes is valid only while the Buffer itself is
// reachable: once it is not, the mapping is unmapped and any slice of it
// that survived faults. Keep the *Buffer next to every view of Bytes
// (codec.Partition.Owner, shard.Table), never a bare slice.
type Buffer struct {
	Bytes []byte
}

// Alloc returns a zeroed buffer of n bytes. With n below 2 MiB, or if the
// mapping fails, it falls back to the Go heap.
func Alloc(n int) *Buffer {
	if n < 2<<20 {
		return &Buffer{Bytes: make([]byte, n)}
	}
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return &Buffer{Bytes: make([]byte, n)}
	}
	unix.Madvise(mem, unix.MADV_HUGEPAGE) // advice only: fine if refused
	b := &Buffer{Bytes: mem}
	runtime.AddCleanup(b, func(m []byte) { unix.Munmap(m) }, mem)
	return b
}

// String describes the buffer, for logs.
func (b *Buffer) String() string { return fmt.Sprintf("hugemem.Buffer(%d bytes)", len(b.Bytes)) }
