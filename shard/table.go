package shard

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/bits"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/prefetch"
	"github.com/cumulus-serving/cumulus/internal/tablemem"
)

// Table is one partition's immutable lookup table, used in place on the
// partition file's bytes (codec formats 2 to 4): records sorted by
// h = codec.KeyHash(key) behind a directory of one uint32 per ~16
// records. An fp32 LR parameter costs 10.25 bytes: its 4-byte weight,
// 6 bytes of its key (format 4: the bits of h's place in its bucket
// that the bucket does not imply) and a quarter of a directory entry;
// at most 10.5 from 2^19 records, 11.25 from 4,081 (7-byte keys), and
// 12.25 with a whole 8-byte h (format 2, fewer than 256 buckets).
// Records wider than a cache line are stored keys apart from values
// (format 3): the search below reads the keys, eight to a line, and a
// found key's value once.
//
// Every search compares key words (keyAt: 8 bytes, masked to the key's
// bits) with a key's probe (probe: h, or in format 4 its place in its
// bucket, masked alike), and in format 4 only inside the key's bucket.
//
// A lookup reads the directory entry of h's bucket and guesses h's place
// in the bucket by interpolation (h is uniform, so the guess is usually
// within a few records). Narrow records (LR) are then found by counting,
// without branches, the records below h in an 8-record window around the
// guess (window.go); wide ones by scanning from the guess (find.go). Both
// run a batch as a software pipeline with prefetch, so its cache misses
// overlap instead of waiting on each key in turn. docs/storage.md has the
// measurements.
type Table struct {
	dir   []byte
	rec   []byte // the keys the search reads: record i's key word at rec[i×rs:]
	rs    int
	kmask uint64 // the key word's bits that are the key (codec.Partition.KeyMask)
	quot  bool   // format 4: key words are places in a bucket, compared within it
	ko    int    // where a record's key word starts in it (rec[i×rs] is record i's + ko)
	vo    int    // where a record's value bytes start in it (formats 2 and 4)
	vals  []byte // record i's value bytes (the record less its key) at vals[i×vs:]
	vs    int
	vlen  int  // value bytes a record: RecordSize − 8
	split bool // keys apart from values (format 3)
	nb    uint64
	n     int
	width int
	enc   codec.Encoding
	size  int64
	owner any // keeps the bytes alive: the partition's Owner
	// Mapped is true when the table is served from a file mapping rather
	// than resident memory.
	Mapped  bool
	sample  *sampler  // keys looked up, for the value cache; mapped tables only
	heardAt time.Time // its last sampled lookup; loader goroutine only
	warmed  bool      // its cache was warmed while staged (warm.go); loader goroutine only
	// standbyFrom is how many keys the live cache held when this
	// table's cache last began warming from it as the newest standby's
	// (keepStandby), standbyAt when that was done, and standbyPlan the
	// keys it has still to read, in file order. Loader goroutine only.
	standbyFrom int
	standbyAt   time.Time
	standbyPlan []hotKey
	growth      *growth                    // its cache's larger copy being made (grow); loader goroutine only
	file        *os.File                   // mapped tables: the file, for readCold
	cache       atomic.Pointer[valueCache] // mapped tables: their value cache, if any
	dirMem      *tablemem.Buffer           // mapped tables: dir's memory
	recOff      int64                      // where the keys (in formats 2 and 4, the records) start in file
	valOff      int64                      // split tables: where the values start in file
	sha         string                     // SHA-256 of the partition file, as its manifest records it
	fv          uint64                     // the version whose file it is
	// refs counts the stack slots of the current snapshot holding the
	// table; dropped is the swap that last took it to zero (reclaim.go).
	// Loader goroutine only.
	refs    int
	dropped uint64
}

// ResidentTable builds a table of keys and their values (width floats a
// key, factors stored in encoding e) in resident huge-page memory, as a
// shard holds a loaded partition.
func ResidentTable(width int, e codec.Encoding, keys []uint64, vals []float32) (*Table, error) {
	var buf bytes.Buffer
	if _, err := codec.WritePartition(&buf, 0, width, e, keys, vals); err != nil {
		return nil, err
	}
	mem := tablemem.Alloc(buf.Len())
	copy(mem.Bytes, buf.Bytes())
	p, err := codec.ParsePartition(mem.Bytes)
	if err != nil {
		return nil, err
	}
	p.Owner = mem
	return NewTable(p), nil
}

// NewTable wraps a verified partition. The table keeps p's bytes alive.
func NewTable(p *codec.Partition) *Table {
	t := &Table{dir: p.Dir, rec: p.Keys, rs: p.KeyStride, kmask: p.KeyMask, quot: p.Format == 4, vo: 8,
		vals: p.Vals, vs: p.ValStride, vlen: p.RecordSize - 8, split: p.Format == 3, nb: uint64(p.Buckets), n: p.Count,
		width: p.Width, enc: p.Encoding, size: int64(len(p.Dir)) + int64(p.Count)*int64(p.StoredSize), owner: p.Owner}
	if t.quot {
		t.ko, t.vo = p.StoredSize-8, 0 // the value, then the key: its word is the record's last 8 bytes
	}
	if b, ok := p.Owner.(*tablemem.Buffer); ok && b.Mapped {
		t.Mapped = true // (its sample ring is the shard's, or EnableCache's)
		t.file, t.recOff = b.File, p.KeysOffset
		t.valOff = p.KeysOffset + int64(len(p.Keys))
		// The directory (0.25 bytes a record) stays resident, so finding
		// a bucket never waits on the disk: outside the Go heap, as
		// resident tables are (it counts in the budget, and in the heap
		// the collector would let garbage grow to its size again).
		t.dirMem = tablemem.Alloc(len(p.Dir))
		t.dir = t.dirMem.Bytes
		copy(t.dir, p.Dir)
	}
	return t
}

func (t *Table) dirAt(b uint64) uint32 { return binary.LittleEndian.Uint32(t.dir[4*b:]) }

// keyAt is record i's key word, masked to the key's bits: what a search
// compares with a key's probe.
func (t *Table) keyAt(i int) uint64 { return binary.LittleEndian.Uint64(t.rec[i*t.rs:]) & t.kmask }

// probe is what the search compares key words with for the key of hash
// h, whose place in its bucket is frac (the low half of h × nb).
func (t *Table) probe(h, frac uint64) uint64 {
	if t.quot {
		return frac & t.kmask
	}
	return h
}

// hashAt is record i's h (codec.HashAt: in format 4 a binary search of
// the directory): for tests and tools, not lookups.
func (t *Table) hashAt(i int) uint64 { return codec.HashAt(t.dir, int(t.nb), t.quot, t.keyAt, i) }

// eachHash calls fn with every record and its h, in order.
func (t *Table) eachHash(fn func(i int, h uint64)) {
	codec.WalkHashes(t.dir, int(t.nb), t.quot, t.keyAt, fn)
}
func (t *Table) weightAt(i int) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(t.vals[i*t.vs:]))
}

// valAt is record i's value bytes: the record less its key.
func (t *Table) valAt(i int) []byte {
	o := i * t.vs
	return t.vals[o : o+t.vlen : o+t.vlen]
}

// prefetchVal starts loading the lines of record i's value bytes.
func (t *Table) prefetchVal(i int) {
	prefetch.Range(uintptr(unsafe.Pointer(unsafe.SliceData(t.vals)))+uintptr(i*t.vs), uintptr(t.vlen))
}

// findOne returns the record of h, or -1.
func (t *Table) findOne(h uint64) int {
	b, frac := bits.Mul64(h, t.nb)
	lo, hi := int(t.dirAt(b)), int(t.dirAt(b+1))
	if lo == hi {
		return -1
	}
	g, _ := bits.Mul64(frac, uint64(hi-lo))
	return t.scan(t.probe(h, frac), lo+int(g), lo, hi)
}

// scan looks for the key of probe h in its bucket's records [lo, hi),
// starting at guess i.
func (t *Table) scan(h uint64, i, lo, hi int) int {
	x := t.keyAt(i)
	if x == h {
		return i
	}
	if x < h {
		for i++; i < hi; i++ {
			if x = t.keyAt(i); x >= h {
				if x == h {
					return i
				}
				return -1
			}
		}
		return -1
	}
	for i--; i >= lo; i-- {
		if x = t.keyAt(i); x <= h {
			if x == h {
				return i
			}
			return -1
		}
	}
	return -1
}

// Get decodes key's values into dst (Width floats) and reports whether
// the table holds key.
func (t *Table) Get(key uint64, dst []float32) bool {
	i := t.findOne(codec.KeyHash(key))
	if i < 0 {
		return false
	}
	t.Decode(i, dst)
	return true
}

// group is how many keys findScan moves through its pipeline at once.
const group = 32

// Find stores in out[j] the record index of keys[j], or -1. It allocates
// nothing.
func (t *Table) Find(keys []uint64, out []int32) { t.find(keys, out, nil) }

// FindWeights is Find that also stores each found record's linear weight
// in w[j] (0 when absent) while the record is in cache: for LR tables it
// is the whole lookup.
func (t *Table) FindWeights(keys []uint64, out []int32, w []float32) { t.find(keys, out, w) }

// Decode writes record i's Width values into dst.
func (t *Table) Decode(i int, dst []float32) {
	codec.DecodeValues(dst, t.valAt(i), t.enc)
}

// Weight is record i's linear weight.
func (t *Table) Weight(i int) float32 { return t.weightAt(i) }

// Len is the number of keys.
func (t *Table) Len() int { return t.n }

// Width is the number of values per key.
func (t *Table) Width() int { return t.width }

// Bytes is the table's size: directory and records.
func (t *Table) Bytes() int64 { return t.size }
