package bench

import (
	"context"
	"os"
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

func TestParseVmRSS(t *testing.T) {
	for _, tc := range []struct {
		status string
		want   int64 // -1: an error
	}{
		{"Name:\tx\nVmPeak:\t  9 kB\nVmRSS:\t    1234 kB\nRssAnon:\t 1 kB\n", 1234 << 10},
		{"VmRSS:\t0 kB", 0},
		{"Name:\tkthreadd\nThreads:\t1\n", -1},
		{"VmRSS:\t12 MB\n", -1},
		{"VmRSS:\t-12 kB\n", -1},
		{"VmRSS:\n", -1},
	} {
		got, err := parseVmRSS([]byte(tc.status))
		if (err != nil) != (tc.want < 0) || (err == nil && got != tc.want) {
			t.Errorf("%q: %d, %v; want %d", tc.status, got, err, tc.want)
		}
	}
}
