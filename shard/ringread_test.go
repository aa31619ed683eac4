package shard

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"
)

// TestRingGivesUp: reads through io_uring that never complete (from a
// pipe nobody writes) end with the caller's deadline, the lookup
// returning at once with DeadlineExceeded and calling no step after;
// once the reads do complete, their turns come back and the ring goes
// back to the pool to be lent again.
func TestRingGivesUp(t *testing.T) {
	p, err := rings()
	if err != nil {
		t.Skipf("the kernel refuses io_uring here: %v", err)
	}
	rd, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	defer wr.Close()
	r := NewColdReads(4)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	returned := make(chan struct{})
	stepped := 0
	err = p.readAll(ctx, r, rd, 10, func(i int, data []byte) (int64, int, error) {
		select {
		case <-returned:
			t.Errorf("step %d called after readAll returned", i)
		default:
		}
		if data == nil {
			stepped++
			return 0, 8, nil
		}
		return 0, 0, nil
	})
	close(returned)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("readAll: %v, want DeadlineExceeded", err)
	}
	if stepped != 4 || len(r.slots) != 4 {
		t.Fatalf("%d items begun, %d turns held: want 4 and 4 (the turns bound the reads in flight)", stepped, len(r.slots))
	}
	p.mu.Lock()
	idle := len(p.idle)
	p.mu.Unlock()
	// The 4 reads complete: their turns are given back and the ring is
	// lent again.
	if _, err := wr.Write(make([]byte, 32)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.mu.Lock()
		back := len(p.idle) > idle
		p.mu.Unlock()
		if back && len(r.slots) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10s after the reads completed: %d turns still held, ring back in the pool: %v", len(r.slots), back)
		}
		time.Sleep(time.Millisecond)
	}
}
