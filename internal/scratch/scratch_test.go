package scratch

import (
	"runtime"
	"testing"
)

func TestList(t *testing.T) {
	made := 0
	l := New(1, func() *[]byte { made++; b := make([]byte, 0, 16); return &b }, func(b *[]byte) bool { return cap(*b) <= 1024 })
	a := l.Get()
	*a = append(*a, 1)
	l.Put(a)
	runtime.GC()
	runtime.GC()
	if b := l.Get(); b != a || made != 1 {
		t.Fatalf("after two collections: got a new value (made %d), want the one put back", made)
	}
	big := make([]byte, 4096)
	l.Put(&big)
	if b := l.Get(); b == &big {
		t.Fatal("kept a value keep refused")
	}
	// Past its bound, what is put back is dropped.
	n := cap(l.free)
	for range n + 5 {
		l.Put(l.new())
	}
	if len(l.free) != n {
		t.Fatalf("%d kept, bound %d", len(l.free), n)
	}
}
