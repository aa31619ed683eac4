package main

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"unicode"

	"github.com/dustin/go-humanize"
)

// byteSize is a flag taking sizes like 1.5GB or 512MiB.
type byteSize int64

func (b *byteSize) String() string {
	if *b == 0 {
		return "0"
	}
	return humanize.IBytes(uint64(*b))
}

func (b *byteSize) Set(s string) error {
	n, err := humanize.ParseBytes(s)
	switch {
	case err != nil && strings.Contains(err.Error(), "too large"):
		return fmt.Errorf("%q is too large", s)
	case err != nil:
		return fmt.Errorf("%q is not a size: want bytes (4096) or a size such as 512MiB or 1.5GB", s)
	case n > math.MaxInt64:
		return fmt.Errorf("%q is too large", s)
	case n == 0 && !zeroSize(s):
		// (humanize rounds what is below a byte down to 0, which here
		// would mean "no bound")
		return fmt.Errorf("%q is less than a byte: 0 is the only size below 1", s)
	}
	*b = byteSize(n)
	return nil
}

// zeroSize reports whether s, a size humanize.ParseBytes took as 0
// bytes, says 0 (as "0", "0MB" or "0.0 GiB"), not a fraction of a byte.
func zeroSize(s string) bool {
	num := strings.TrimSpace(strings.TrimRightFunc(strings.TrimSpace(s), unicode.IsLetter))
	f, err := strconv.ParseFloat(num, 64)
	return err == nil && f == 0
}

func (b *byteSize) Type() string { return "bytes" }

// defaultBudget is cumulus dev's memory budget per shard: half of the
// machine's memory, or of its cgroup's limit when lower, shared by the
// shards. 0 (no bound) when neither can be read.
func defaultBudget(shards int) int64 {
	total := memTotal()
	for _, f := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n > 0 && (total == 0 || n < total) {
			total = n
		}
	}
	if total == 0 || shards <= 0 {
		return 0
	}
	return total / 2 / int64(shards)
}

// memTotal is MemTotal from /proc/meminfo in bytes, or 0.
func memTotal() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}
