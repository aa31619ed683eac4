package bench

import (
	"os"
	"testing"
	"time"
)

func TestReadCPUTicksOwnProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skipf("no /proc here: %v", err)
	}
	if _, err := ReadCPUTicks(os.Getpid()); err != nil {
		t.Fatal(err)
	}
	if tick := ClockTick(); tick <= 0 || tick > time.Second {
		t.Fatalf("tick %s", tick)
	}
}

func TestParseStatCPU(t *testing.T) {
	for _, tc := range []struct {
		stat string
		want int64 // -1: an error
	}{
		{"4242 (cumulus) S 1 4242 4242 0 -1 4194560 9000 0 0 0 150 25 0 0 20 0 12 0 100 0 0\n", 175},
		// A name with spaces and parentheses.
		{"7 (a) b (c)) R 1 7 7 0 -1 0 0 0 0 0 3 4 0 0 20 0 1 0 1 0 0", 7},
		{"7 (x) R 1 7 7 0 -1 0 0 0 0 0 3", -1},
		{"7 (x) R 1 7 7 0 -1 0 0 0 0 0 3 -4 0", -1},
		{"no name here", -1},
	} {
		got, err := parseStatCPU([]byte(tc.stat))
		if (err != nil) != (tc.want < 0) || (err == nil && got != tc.want) {
			t.Errorf("%q: %d, %v; want %d", tc.stat, got, err, tc.want)
		}
	}
}
