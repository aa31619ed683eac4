package main

import (
	"os"
	"strconv"
	"strings"

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
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
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
