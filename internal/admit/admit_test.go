package admit

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestGateAdmitsUpToItsSize(t *testing.T) {
	g := NewGate(10, 0)
	a, err := g.Acquire(context.Background(), 6)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Acquire(context.Background(), 5); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("6+5 of 10 without a queue: %v, want overloaded", err)
	}
	b, err := g.Acquire(context.Background(), 4)
	if err != nil {
		t.Fatalf("6+4 of 10: %v", err)
	}
	a.Release()
	b.Release()
	// Heavier than the whole gate: runs alone rather than never.
	c, err := g.Acquire(context.Background(), 1000)
	if err != nil {
		t.Fatalf("weight over the size on an empty gate: %v", err)
	}
	if _, err := g.Acquire(context.Background(), 1); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("beside a clamped heavy request: %v, want overloaded", err)
	}
	c.Release()
	Ticket{}.Release() // a refused request's zero ticket
}

func TestGateQueue(t *testing.T) {
	g := NewGate(1, time.Hour)
	a, err := g.Acquire(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error)
	go func() {
		b, err := g.Acquire(context.Background(), 1)
		b.Release()
		got <- err
	}()
	for g.Waiting() == 0 { // the waiter is queued
		time.Sleep(time.Millisecond)
	}
	a.Release()
	if err := <-got; err != nil {
		t.Fatalf("queued request after a release: %v", err)
	}

	// The caller's context ends first: its error, not overload.
	hold, _ := g.Acquire(context.Background(), 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := g.Acquire(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled caller: %v", err)
	}
	// The queue time passes first: overload.
	short := NewGate(1, time.Millisecond)
	s, _ := short.Acquire(context.Background(), 1)
	if _, err := short.Acquire(context.Background(), 1); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("queue time passed: %v, want overloaded", err)
	}
	s.Release()
	hold.Release()
}

// TestGateRefusesAtOnceWhenTheQueueIsLong: once holders are known to hold
// for much longer than the queue time, a second waiter cannot be served
// in time and is refused without waiting (with an hour's queue time this
// test would otherwise not end).
func TestGateRefusesAtOnceWhenTheQueueIsLong(t *testing.T) {
	g := NewGate(1, time.Hour)
	g.hold.Store(int64(1000 * time.Hour)) // as if learnt from releases
	a, _ := g.Acquire(context.Background(), 1)
	queued := make(chan error)
	go func() {
		_, err := g.Acquire(context.Background(), 1) // the one waiter allowed
		queued <- err
	}()
	for g.Waiting() == 0 {
		time.Sleep(time.Millisecond)
	}
	if _, err := g.Acquire(context.Background(), 1); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("second waiter: %v, want overloaded", err)
	}
	a.Release()
	if err := <-queued; err != nil {
		t.Fatal(err)
	}
}

func TestReleaseLearnsHoldTime(t *testing.T) {
	g := NewGate(4, time.Millisecond)
	if g.hold.Load() != 0 {
		t.Fatal("hold known before any release")
	}
	a, _ := g.Acquire(context.Background(), 2)
	a.start = a.start.Add(-10 * time.Millisecond)
	a.Release()
	if h := g.hold.Load(); h < int64(5*time.Millisecond) { // 10 ms over weight 2
		t.Fatalf("hold per unit %v after a 10 ms hold of weight 2", time.Duration(h))
	}
}

// TestRefusing: Refusing says what Acquire would do at once: not while
// the gate has room or its queue has, yes when both are full.
func TestRefusing(t *testing.T) {
	g := NewGate(2, time.Hour)
	g.hold.Store(int64(1000 * time.Hour)) // one waiter allowed
	if g.Refusing(1, 0) {
		t.Fatal("empty gate refusing")
	}
	a, _ := g.Acquire(context.Background(), 1)
	if g.Refusing(1, 0) {
		t.Fatal("gate with room for one more refusing")
	}
	b, _ := g.Acquire(context.Background(), 1)
	if g.Refusing(1, 0) {
		t.Fatal("full gate with an empty queue refusing")
	}
	if !g.Refusing(1, 1) {
		t.Fatal("full gate with an empty queue, one coming for the one place, not refusing")
	}
	queued := make(chan error)
	go func() {
		_, err := g.Acquire(context.Background(), 1)
		queued <- err
	}()
	for g.Waiting() == 0 {
		time.Sleep(time.Millisecond)
	}
	if !g.Refusing(1, 0) {
		t.Fatal("full gate with a full queue not refusing")
	}
	if !g.Refusing(1, 1) {
		t.Fatal("full gate with a full queue and one more coming not refusing")
	}
	a.Release()
	if err := <-queued; err != nil {
		t.Fatal(err)
	}
	b.Release()
	if g.Refusing(2, 0) {
		t.Fatal("gate with one of two held refusing a weight of 2 with an empty queue")
	}
	if NewGate(1, 0).Refusing(2, 0) {
		t.Fatal("empty gate refusing a weight over its size (clamped: it runs alone)")
	}
}
