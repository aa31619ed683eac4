package bench

import (
	"fmt"
	"time"

	"github.com/prometheus/procfs"
	"golang.org/x/sys/unix"
)

// ReadCPUTicks is process pid's CPU time so far, user plus system, all
// its threads, in clock ticks: utime+stime of /proc/PID/stat, read with
// Prometheus' procfs. Linux only. A tick is ClockTick().
func ReadCPUTicks(pid int) (int64, error) {
	p, err := procfs.NewProc(pid)
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	st, err := p.Stat()
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	return int64(st.UTime + st.STime), nil
}

// atClkTck is AT_CLKTCK of the ELF auxiliary vector (elf.h), which is
// where sysconf(_SC_CLK_TCK) reads it from.
const atClkTck = 17

// ClockTick is the unit of /proc's CPU times, 1/sysconf(_SC_CLK_TCK):
// the kernel's USER_HZ, 100 per second on Linux whatever its own tick.
func ClockTick() time.Duration {
	hz := uintptr(100)
	if auxv, err := unix.Auxv(); err == nil {
		for _, kv := range auxv {
			if kv[0] == atClkTck && kv[1] > 0 {
				hz = kv[1]
			}
		}
	}
	return time.Second / time.Duration(hz)
}
