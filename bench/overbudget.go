package bench

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/tablemem"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/shard"
)

// WriteBenchPartition writes one partition file of n LR features with
// hashed ids (ranks 0..n-1, seed) to path and returns its size.
func WriteBenchPartition(path string, n int, seed uint64) (int64, error) {
	gen := codec.GenInfo{Seed: seed, IDs: "hashed"}
	keys := make([]uint64, n)
	vals := make([]float32, n)
	for r := range keys {
		keys[r] = loader.GenID(gen, uint64(r))
		vals[r] = float32(r%1000) / 1000
	}
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	sum, err := codec.WritePartition(w, 0, 1, codec.EncFP32, keys, vals)
	if err == nil {
		err = w.Flush()
	}
	return sum.Size, err
}

// LookupLatency is what a lookup run measured for one key distribution.
type LookupLatency struct {
	Dist     string
	NsPerKey float64
	P50, P99 time.Duration // per 20k-key batch
	Warm     int           // batches run before timing
}

// Tiering is how MappedLookups holds the partition.
type Tiering int

const (
	Resident  Tiering = iota // all in resident memory: the baseline
	Mapped                   // searched through a mapping, page faults and all, as shards did before they read from disk
	Disk                     // the shard's way: the directory resident, records read through io_uring (pread where the kernel refuses it), a value cache of cacheBytes learned from the warm batches
	DiskPread                // Disk with the lookups' reads made with pread, a goroutine a read (--disk-reads pread); the cache's learning, off the clock, reads as Disk does
)

// MappedLookups times batched lookups over a partition file held as t,
// after warm batches that let the page cache (or the value cache) learn
// the traffic. Resident and Disk lookups go through shard.StackWeights,
// the shard's own path.
func MappedLookups(path string, n int, seed uint64, t Tiering, cacheBytes int64, batch, batches, warm int) ([]LookupLatency, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	var mem *tablemem.Buffer
	if t == Resident {
		mem = tablemem.Alloc(int(st.Size()))
		if _, err := io.ReadFull(f, mem.Bytes); err != nil {
			return nil, err
		}
	} else if mem, err = tablemem.Map(path, st.Size()); err != nil {
		return nil, err
	}
	p, err := codec.ParsePartitionStructure(mem.Bytes)
	if err != nil {
		return nil, err
	}
	p.Owner = mem
	base := shard.NewTable(p)
	onDisk := t == Disk || t == DiskPread
	if onDisk && !base.EnableCache(cacheBytes-base.ResidentBytes()) {
		return nil, fmt.Errorf("bench: no value cache fits in %d bytes beside the directory's %d", cacheBytes, base.ResidentBytes())
	}
	lookup := func(keys []uint64, w []float32, found []bool, sc *shard.StackScratch) {
		shard.StackWeights([]*shard.Table{base}, keys, w, found, sc)
	}
	if t == Mapped {
		idx := make([]int32, batch)
		lookup = func(keys []uint64, w []float32, found []bool, _ *shard.StackScratch) {
			base.FindWeights(keys, idx, w)
			for j, r := range idx {
				found[j] = r >= 0
			}
		}
	}
	gen := codec.GenInfo{Seed: seed, IDs: "hashed"}
	found := make([]bool, batch)
	w := make([]float32, batch)
	var sc shard.StackScratch
	if t == DiskPread {
		sc.Reads = (*shard.ColdReads)(nil).Pread()
	}
	var out []LookupLatency
	for _, d := range Distributions {
		// Batches are drawn as they are used: holding 200 × 20k keys
		// would itself eat the memory budget.
		draw := func(i int) []uint64 { return idsOf(queryBatches(d, n, batch, 1, seed+uint64(i)), gen)[0] }
		// Warm up. From disk, the value cache learns as a shard's does,
		// from the samples, here after every batch.
		for i := range warm {
			lookup(draw(i), w, found, &sc)
			if onDisk {
				base.Learn()
			}
		}
		lat := make([]time.Duration, batches)
		for i := range batches {
			keys := draw(warm + i)
			t0 := time.Now()
			lookup(keys, w, found, &sc)
			lat[i] = time.Since(t0)
			if onDisk {
				base.Learn() // off the clock, as the shard's loader does it
			}
			for j, ok := range found {
				if !ok {
					return nil, fmt.Errorf("bench: key %d of batch %d not found", keys[j], i)
				}
			}
		}
		ns, p50, p99 := summarize(lat, batch)
		out = append(out, LookupLatency{Dist: d, NsPerKey: ns, P50: p50, P99: p99, Warm: warm})
	}
	return out, nil
}

// summarize returns ns/key and the p50 and p99 batch latencies of batches
// of batch keys each.
func summarize(lat []time.Duration, batch int) (float64, time.Duration, time.Duration) {
	var total time.Duration
	for _, l := range lat {
		total += l
	}
	sorted := append([]time.Duration(nil), lat...)
	slices.Sort(sorted)
	return float64(total.Nanoseconds()) / float64(len(lat)*batch), sorted[len(sorted)/2], sorted[len(sorted)*99/100]
}

// Cgroup is a cgroup v1 memory cgroup made for one measurement.
type Cgroup struct{ Dir string }

// NewMemoryCgroup creates a memory cgroup limited to limit bytes. It
// needs root and the cgroup v1 memory controller.
func NewMemoryCgroup(limit int64) (*Cgroup, error) {
	dir := filepath.Join("/sys/fs/cgroup/memory", fmt.Sprintf("cumulus-bench-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: making a memory cgroup (needs root and cgroup v1 memory): %w", err)
	}
	c := &Cgroup{Dir: dir}
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		c.Remove()
		return nil, fmt.Errorf("bench: setting the memory limit: %w", err)
	}
	return c, nil
}

// Join moves the calling process into the cgroup.
func (c *Cgroup) Join() error {
	return os.WriteFile(filepath.Join(c.Dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0o644)
}

// MaxUsage is the cgroup's peak memory charge (page cache included).
func (c *Cgroup) MaxUsage() int64 {
	b, _ := os.ReadFile(filepath.Join(c.Dir, "memory.max_usage_in_bytes"))
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// Remove deletes the cgroup (it must be empty).
func (c *Cgroup) Remove() { os.Remove(c.Dir) }

// DropFromPageCache asks the kernel to forget a file's cached pages, so
// the next reads come from disk and are charged to whoever makes them.
func DropFromPageCache(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	f.Sync()
	return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
}

// EncodeLatencies and DecodeLatencies carry a child's results to its parent.
func EncodeLatencies(w io.Writer, ls []LookupLatency) error { return json.NewEncoder(w).Encode(ls) }
func DecodeLatencies(b []byte) ([]LookupLatency, error) {
	var ls []LookupLatency
	err := json.Unmarshal(b, &ls)
	return ls, err
}
