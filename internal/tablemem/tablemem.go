// Package tablemem provides the memory shard tables live in, outside the
// Go heap: either resident, anonymous memory backed by transparent huge
// pages, or a read-only mapping of a partition file whose pages the
// kernel faults in on demand and may evict. Map only a file nobody else
// writes (loader.MapPartitionCopy maps the shard's own copy): the mapping
// shows later writes, and a truncation turns reads into SIGBUS.
//
// Why resident memory uses huge pages: tables are hundreds of MB read at
// random; on this project's machines a dependent random read costs ~50 ns
// on 2 MiB pages and ~140–215 ns on 4 KiB pages (TLB misses under nested
// paging). Go's heap does not ask for huge pages.
//
// Why mapped memory exists: a partition larger than a shard's memory
// budget, or a new version loading next to the live one, can be served
// from the page cache: hot pages stay resident, cold ones go back to the
// disk, and nothing is ever copied twice.
//
// A Buffer is released by Free, when its owner knows nothing reads it any
// more, or else by a cleanup once it is unreachable; whichever comes
// first, once. Bytes is valid only
// while its *Buffer is reachable: keep the Buffer beside every view
// (codec.Partition.Owner, shard.Table), never a bare slice.
package tablemem

import (
	"fmt"
	"os"
	"runtime"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Buffer owns table memory.
type Buffer struct {
	Bytes []byte
	// Mapped is true for a file mapping, false for resident memory.
	Mapped bool
	// File is the mapped file, kept open for reads that should not fault
	// (pread from many goroutines overlaps disk reads; page faults do not).
	File *os.File
	// region is what Free and the cleanup release; nil for heap memory.
	region *region
}

// region is a mapping (and its file) released exactly once.
type region struct {
	mem   []byte
	file  *os.File
	freed atomic.Bool
}

func (r *region) free() {
	if r.freed.CompareAndSwap(false, true) {
		unix.Munmap(r.mem)
		if r.file != nil {
			r.file.Close()
		}
	}
}

// Free releases the memory now rather than when the Buffer becomes
// unreachable: the caller guarantees that nothing reads Bytes or File
// any more (reading after Free faults). Heap memory is left to the
// garbage collector. Free may be called more than once.
func (b *Buffer) Free() {
	if b.region != nil {
		b.region.free()
	}
}

// Freed reports whether Free released the memory (always false for heap
// memory).
func (b *Buffer) Freed() bool { return b.region != nil && b.region.freed.Load() }

// managed gives b a region released by Free or, failing that, by a
// cleanup once b is unreachable.
func managed(b *Buffer) *Buffer {
	b.region = &region{mem: b.Bytes, file: b.File}
	runtime.AddCleanup(b, (*region).free, b.region)
	return b
}

// Alloc returns n zeroed resident bytes. Below 2 MiB, or if the mapping
// fails, it falls back to the Go heap.
func Alloc(n int) *Buffer {
	if n < 2<<20 {
		return &Buffer{Bytes: make([]byte, n)}
	}
	mem, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return &Buffer{Bytes: make([]byte, n)}
	}
	unix.Madvise(mem, unix.MADV_HUGEPAGE) // advice only: fine if refused
	return managed(&Buffer{Bytes: mem})
}

// Map maps size bytes of the file at path read-only and keeps it open.
// Reads fault pages in from the page cache or the disk; the kernel may
// evict them again under memory pressure. Readahead is turned off:
// lookups are random.
func Map(path string, size int64) (*Buffer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tablemem: %w", err)
	}
	if size == 0 {
		f.Close()
		return &Buffer{Mapped: true}, nil
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("tablemem: mapping %s: %w", path, err)
	}
	unix.Madvise(mem, unix.MADV_RANDOM)
	return managed(&Buffer{Bytes: mem, Mapped: true, File: f}), nil
}
