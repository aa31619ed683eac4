package bench

import (
	"context"
	"os"
	"runtime"
	"testing"
	"time"
)

func TestReadRSSOwnProcess(t *testing.T) {
	rss, err := ReadRSS(os.Getpid())
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	if rss <= 0 {
		t.Fatalf("rss %d", rss)
	}
	r := WatchRSS(context.Background(), os.Getpid(), time.Millisecond, 0, func() {})
	if r.Err != nil || r.Before <= 0 || r.Peak <= 0 || r.After <= 0 || r.Samples < 1 {
		t.Fatalf("%+v", r)
	}
}

// TestReadRSSInBytes: procfs reports VmRSS in bytes; the Go heap in use is
// part of it, so a figure in kB would be far below it.
func TestReadRSSInBytes(t *testing.T) {
	keep := make([]byte, 64<<20)
	for i := range keep {
		keep[i] = 1
	}
	rss, err := ReadRSS(os.Getpid())
	if err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	if rss < int64(len(keep)) {
		t.Fatalf("rss %d bytes with %d bytes touched", rss, len(keep))
	}
	runtime.KeepAlive(keep)
}
