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
