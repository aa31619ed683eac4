package loader

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"
)

// TestThrottle: while serving, reads take their turns (a 4 MiB read at 2
// MiB/s cannot finish at once); not serving, or nil, they do not wait;
// a done context ends a wait with its error.
func TestThrottle(t *testing.T) {
	data := bytes.Repeat([]byte{7}, 4<<20)
	read := func(th *Throttle) (time.Duration, error) {
		t0 := time.Now()
		got, err := io.ReadAll(th.reader(bytes.NewReader(data)))
		if err == nil && !bytes.Equal(got, data) {
			t.Fatal("read back other bytes")
		}
		return time.Since(t0), err
	}
	th := NewThrottle(context.Background(), 2<<20)
	if _, err := read(th); err != nil { // not serving: no waiting
		t.Fatal(err)
	}
	if tokens := th.lim.Tokens(); tokens < throttleChunk-1 {
		t.Fatalf("a read while not serving took turns: %v left", tokens)
	}
	// Serving, at 8 MiB/s with a burst of 1 MiB: 4 MiB cannot be read in
	// less than 3/8 s (a lower bound: a limiter is never faster).
	th = NewThrottle(context.Background(), 8<<20)
	th.SetServing(true)
	if took, err := read(th); err != nil || took < 370*time.Millisecond {
		t.Fatalf("4 MiB at 8 MiB/s in %v (%v)", took, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	th = NewThrottle(ctx, 1<<20)
	th.SetServing(true)
	cancel()
	if _, err := read(th); !errors.Is(err, context.Canceled) {
		t.Fatalf("a read under a cancelled throttle: %v", err)
	}
	var none *Throttle
	none.SetServing(true)
	if _, err := read(none); err != nil {
		t.Fatal(err)
	}
}
