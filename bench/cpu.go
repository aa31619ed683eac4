package bench

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// ReadCPUTicks is process pid's CPU time so far, user plus system, all
// its threads, in clock ticks: utime+stime of /proc/PID/stat. Linux only.
// A tick is ClockTick().
func ReadCPUTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	return parseStatCPU(b)
}

// parseStatCPU reads utime and stime, fields 14 and 15 of a
// /proc/PID/stat line. The command name, field 2, is in parentheses and
// may hold spaces and parentheses itself, so fields are counted from the
// last ')'.
func parseStatCPU(stat []byte) (int64, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("bench: unexpected /proc stat %.40q", stat)
	}
	f := bytes.Fields(stat[i+1:]) // f[0] is field 3, the state
	if len(f) < 13 {
		return 0, fmt.Errorf("bench: /proc stat has %d fields after the name, want at least 13", len(f))
	}
	var sum int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(string(s), 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("bench: unexpected CPU time %q in /proc stat", s)
		}
		sum += n
	}
	return sum, nil
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
