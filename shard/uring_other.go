//go:build !linux

package shard

import (
	"errors"
	"time"
)

// ring is io_uring's, which only Linux has: elsewhere newRing fails,
// so disk reads are preads and no other method is ever called.
type ring struct {
	bufs     [][]byte
	spans    []*[]byte
	free     []int
	inflight int
	entries  int
}

func newRing(int) (*ring, error) { return nil, errors.New("io_uring: Linux only") }

func (rg *ring) close()                            {}
func (rg *ring) prep(fd int, off int64, n int) int { panic("io_uring: Linux only") }
func (rg *ring) enter(time.Duration) error         { panic("io_uring: Linux only") }
func (rg *ring) reap(done func(e int, res int32))  { panic("io_uring: Linux only") }
