package shard

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// An io_uring of our own, by hand: the few calls it takes (set up, map,
// submit reads, wait with a timeout) are less code than a library's
// abstractions over them, and no Go io_uring library is in the module
// proxy's list here. What it buys (BenchmarkDiskReads, this project's
// VM: 4 KiB reads at random places in a 1 GiB file, page cache dropped,
// 64 in flight): 81–100k reads a second from one goroutine, against
// 27–30k from 64 goroutines in pread; an earlier experiment measured a
// quarter of the CPU a read.

// The kernel's structures (include/uapi/linux/io_uring.h).
type uringSQOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type uringCQOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFD uint32
	resv                                                                   [3]uint32
	sq                                                                     uringSQOffsets
	cq                                                                     uringCQOffsets
}

type uringGeteventsArg struct {
	sigmask     uint64
	sigmaskSize uint32
	minWaitUsec uint32
	ts          uint64
}

const (
	uringOpRead        = 22 // IORING_OP_READ
	uringOffSQEs       = 0x10000000
	uringFeatSingleMap = 1 << 0
	uringFeatExtArg    = 1 << 8
	uringEnterGetev    = 1 << 0
	uringEnterExtArg   = 1 << 3
	sqeSize            = 64
	cqeSize            = 16
)

// ring is one io_uring with a buffer per entry; one goroutine uses it
// at a time (ringPool hands it out).
type ring struct {
	fd                int
	ringMem, sqes     []byte // the mapped rings; the mapped entries
	sqTail, sqMask    *uint32
	sqArray           []uint32
	cqHead, cqTail    *uint32
	cqMask            uint32
	cqes              []byte
	entries           int
	bufs              [][]byte  // bufs[e]: what entry e's read goes into
	spans             []*[]byte // spans[e]: bufs[e] if it is spanBufs', to go back there
	tail, unsubmitted uint32
	inflight          int
	free              []int // entries with no read in flight
	// enter's wait, kept where the kernel reads it (pointers to them
	// are passed as integers).
	arg uringGeteventsArg
	ts  struct{ sec, nsec int64 } // __kernel_timespec
}

func newRing(entries int) (*ring, error) {
	var p uringParams
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	rg := &ring{fd: int(fd), entries: int(p.sqEntries)}
	if p.features&uringFeatSingleMap == 0 || p.features&uringFeatExtArg == 0 {
		rg.close()
		return nil, errors.New("io_uring: the kernel lacks single-mmap rings or waits with a timeout (Linux 5.11)")
	}
	size := max(p.sq.array+p.sqEntries*4, p.cq.cqes+p.cqEntries*cqeSize)
	var err error
	if rg.ringMem, err = unix.Mmap(rg.fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		rg.close()
		return nil, fmt.Errorf("io_uring: mapping its rings: %w", err)
	}
	if rg.sqes, err = unix.Mmap(rg.fd, uringOffSQEs, int(p.sqEntries*sqeSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		rg.close()
		return nil, fmt.Errorf("io_uring: mapping its entries: %w", err)
	}
	u32 := func(off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&rg.ringMem[off])) }
	rg.sqTail, rg.sqMask = u32(p.sq.tail), u32(p.sq.ringMask)
	rg.sqArray = unsafe.Slice(u32(p.sq.array), p.sqEntries)
	rg.cqHead, rg.cqTail, rg.cqMask = u32(p.cq.head), u32(p.cq.tail), *u32(p.cq.ringMask)
	rg.cqes = rg.ringMem[p.cq.cqes : p.cq.cqes+p.cqEntries*cqeSize]
	rg.tail = atomic.LoadUint32(rg.sqTail)
	rg.bufs, rg.spans = make([][]byte, rg.entries), make([]*[]byte, rg.entries)
	for e := range rg.entries {
		rg.free = append(rg.free, e)
	}
	return rg, nil
}

func (rg *ring) close() {
	if rg.sqes != nil {
		unix.Munmap(rg.sqes)
	}
	if rg.ringMem != nil {
		unix.Munmap(rg.ringMem)
	}
	unix.Close(rg.fd)
}

// prep puts a read of n bytes of fd at off in a free entry, to go with
// the next enter, and returns the entry. The entry's buffer is the
// ring's, kept referenced until the read completes: the kernel writes
// into it after the call that submitted it has returned (the Go heap
// does not move).
func (rg *ring) prep(fd int, off int64, n int) int {
	e := rg.free[len(rg.free)-1]
	rg.free = rg.free[:len(rg.free)-1]
	if cap(rg.bufs[e]) < n {
		if n > spanGap && n <= spanMax {
			rg.spans[e] = spanBufs.Get().(*[]byte)
			rg.bufs[e] = *rg.spans[e]
		} else {
			rg.bufs[e] = make([]byte, max(n, 1024))
		}
	}
	buf := rg.bufs[e][:n]
	idx := rg.tail & *rg.sqMask
	sqe := rg.sqes[idx*sqeSize : (idx+1)*sqeSize]
	clear(sqe)
	sqe[0] = uringOpRead
	*(*int32)(unsafe.Pointer(&sqe[4])) = int32(fd)
	*(*uint64)(unsafe.Pointer(&sqe[8])) = uint64(off)
	*(*uint64)(unsafe.Pointer(&sqe[16])) = uint64(uintptr(unsafe.Pointer(&buf[0])))
	*(*uint32)(unsafe.Pointer(&sqe[24])) = uint32(n)
	*(*uint64)(unsafe.Pointer(&sqe[32])) = uint64(e)
	rg.sqArray[idx] = idx
	rg.tail++
	atomic.StoreUint32(rg.sqTail, rg.tail) // the entry is written before the kernel sees the tail move
	rg.unsubmitted++
	rg.inflight++
	return e
}

// enter submits what prep put and waits up to wait for a completion (no
// wait if wait ≤ 0).
func (rg *ring) enter(wait time.Duration) error {
	until := time.Now().Add(wait)
	for {
		var flags, minComplete, arg, argSize uintptr
		if left := time.Until(until); wait > 0 && left > 0 {
			rg.ts.sec, rg.ts.nsec = int64(left/time.Second), int64(left%time.Second)
			rg.arg = uringGeteventsArg{ts: uint64(uintptr(unsafe.Pointer(&rg.ts)))}
			flags, minComplete = uringEnterGetev|uringEnterExtArg, 1
			arg, argSize = uintptr(unsafe.Pointer(&rg.arg)), unsafe.Sizeof(rg.arg)
		} else if rg.unsubmitted == 0 {
			return nil // waited its time
		}
		n, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(rg.fd), uintptr(rg.unsubmitted), minComplete, flags, arg, argSize)
		switch errno {
		case 0:
			if n == 0 && rg.unsubmitted > 0 {
				return errors.New("io_uring_enter submitted none of its reads")
			}
			rg.unsubmitted -= uint32(n)
			return nil
		case unix.ETIME:
			return nil
		case unix.EINTR: // again, for what is left of wait
		case unix.EAGAIN, unix.EBUSY:
			// Out of kernel resources for now: again a little later,
			// within wait.
			if time.Until(until) <= 0 {
				return nil
			}
			time.Sleep(100 * time.Microsecond)
		default:
			return fmt.Errorf("io_uring_enter: %w", errno)
		}
	}
}

// unprep takes back the reads prep put that enter has not submitted
// (the kernel reads the submission queue only within enter), and
// returns how many.
func (rg *ring) unprep() int {
	n := int(rg.unsubmitted)
	for k := range rg.unsubmitted {
		idx := (rg.tail - 1 - k) & *rg.sqMask
		rg.free = append(rg.free, int(*(*uint64)(unsafe.Pointer(&rg.sqes[idx*sqeSize+32]))))
	}
	rg.tail -= rg.unsubmitted
	atomic.StoreUint32(rg.sqTail, rg.tail)
	rg.inflight -= n
	rg.unsubmitted = 0
	return n
}

// reap calls done(entry, result) for each completed read, and frees its
// entry once done returns.
func (rg *ring) reap(done func(e int, res int32)) {
	head := atomic.LoadUint32(rg.cqHead)
	for tail := atomic.LoadUint32(rg.cqTail); head != tail; head++ {
		c := rg.cqes[(head&rg.cqMask)*cqeSize:]
		e := int(*(*uint64)(unsafe.Pointer(&c[0])))
		res := *(*int32)(unsafe.Pointer(&c[8]))
		rg.inflight--
		done(e, res)
		rg.free = append(rg.free, e)
	}
	atomic.StoreUint32(rg.cqHead, head)
}
