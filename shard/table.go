package shard

import (
	"encoding/binary"
	"math/bits"

	"github.com/cumulus-serving/cumulus/codec"
)

// Table is one partition's immutable lookup table, used in place on the
// partition file's bytes (codec format 2): records sorted by
// h = codec.KeyHash(key) behind a directory of one uint32 per ~16
// records. An fp32 LR parameter costs 12.25 bytes: its 8-byte h, its
// 4-byte weight and a quarter of a directory entry.
//
// A lookup reads the directory entry of h's bucket, guesses h's place in
// the bucket by interpolation (h is uniform, so the guess is usually in
// the right cache line), and scans from there. Find resolves keys in
// groups in stages — all directory reads, then all first record reads,
// then the scans — so the CPU overlaps a group's cache misses instead of
// waiting on each key in turn.
type Table struct {
	dir   []byte
	rec   []byte
	rs    int
	nb    uint64
	n     int
	width int
	enc   codec.Encoding
	size  int64
	owner any // keeps the bytes alive: the partition's Owner
}

// NewTable wraps a verified partition. The table keeps p's bytes alive.
func NewTable(p *codec.Partition) *Table {
	return &Table{dir: p.Dir, rec: p.Records, rs: p.RecordSize, nb: uint64(p.Buckets), n: p.Count,
		width: p.Width, enc: p.Encoding, size: int64(len(p.Dir) + len(p.Records)), owner: p.Owner}
}

func (t *Table) dirAt(b uint64) uint32 { return binary.LittleEndian.Uint32(t.dir[4*b:]) }
func (t *Table) hAt(i int) uint64      { return binary.LittleEndian.Uint64(t.rec[i*t.rs:]) }

// findOne returns the record of h, or -1.
func (t *Table) findOne(h uint64) int {
	b, frac := bits.Mul64(h, t.nb)
	lo, hi := int(t.dirAt(b)), int(t.dirAt(b+1))
	if lo == hi {
		return -1
	}
	g, _ := bits.Mul64(frac, uint64(hi-lo))
	return t.scan(h, lo+int(g), lo, hi)
}

// scan looks for h in records [lo, hi) starting at guess i.
func (t *Table) scan(h uint64, i, lo, hi int) int {
	x := t.hAt(i)
	if x == h {
		return i
	}
	if x < h {
		for i++; i < hi; i++ {
			if x = t.hAt(i); x >= h {
				if x == h {
					return i
				}
				return -1
			}
		}
		return -1
	}
	for i--; i >= lo; i-- {
		if x = t.hAt(i); x <= h {
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

const group = 16

// Find stores in out[j] the record index of keys[j], or -1. It allocates
// nothing.
func (t *Table) Find(keys []uint64, out []int32) {
	if t.n == 0 {
		for j := range keys {
			out[j] = -1
		}
		return
	}
	var (
		hs    [group]uint64
		frac  [group]uint64
		lo    [group]uint32
		cnt   [group]uint32
		guess [group]int
		first [group]uint64
	)
	for base := 0; base < len(keys); base += group {
		ks := keys[base:min(base+group, len(keys))]
		// Stage 1: hashes and directory reads, independent across keys.
		for j, k := range ks {
			h := codec.KeyHash(k)
			b, f := bits.Mul64(h, t.nb)
			l := t.dirAt(b)
			hs[j], frac[j], lo[j], cnt[j] = h, f, l, t.dirAt(b+1)-l
		}
		// Stage 2: first record reads, branch-free so they overlap.
		for j := range ks {
			g, _ := bits.Mul64(frac[j], uint64(cnt[j]))
			i := min(int(lo[j])+int(g), t.n-1)
			guess[j], first[j] = i, t.hAt(i)
		}
		// Stage 3: finish each key; almost always within the cache line
		// just read.
		for j := range ks {
			switch {
			case cnt[j] == 0:
				out[base+j] = -1
			case first[j] == hs[j]:
				out[base+j] = int32(guess[j])
			default:
				out[base+j] = int32(t.scan(hs[j], guess[j], int(lo[j]), int(lo[j]+cnt[j])))
			}
		}
	}
}

// Decode writes record i's Width values into dst.
func (t *Table) Decode(i int, dst []float32) {
	codec.DecodeRecord(dst, t.rec[i*t.rs:(i+1)*t.rs], t.enc)
}

// Len is the number of keys.
func (t *Table) Len() int { return t.n }

// Width is the number of values per key.
func (t *Table) Width() int { return t.width }

// Bytes is the table's size: directory and records.
func (t *Table) Bytes() int64 { return t.size }
