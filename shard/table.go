package shard

import (
	"fmt"
	"math/bits"

	"github.com/cumulus-serving/cumulus/codec"
)

// Table is an immutable open-addressing hash table of one partition:
// linear probing over a power-of-two array of keys, values stored beside
// their slot's index. Key 0 marks an empty slot, so the feature with id 0
// lives in a side slot. Load factor ≤ 0.7: about 17 bytes per fp32 LR
// parameter. This is the simple first table; the compact layout of the
// storage-engine work replaces it behind the same Get.
type Table struct {
	width   int
	shift   uint
	keys    []uint64
	vals    []float32
	zero    []float32 // values of id 0; nil when absent
	entries int
}

// NewTable builds a table from a verified partition file. Duplicate keys
// are refused: they would make a lookup's answer depend on file order.
func NewTable(p *codec.Partition) (*Table, error) {
	n := p.Count
	size := 1
	for size*7 < n*10+7 {
		size *= 2
	}
	t := &Table{
		width:   p.Width,
		shift:   uint(64 - bits.TrailingZeros(uint(size))),
		keys:    make([]uint64, size),
		vals:    make([]float32, size*p.Width),
		entries: n,
	}
	mask := uint64(size - 1)
	for i := 0; i < n; i++ {
		k := p.Key(i)
		var dst []float32
		if k == 0 {
			if t.zero != nil {
				return nil, fmt.Errorf("shard: partition %d holds feature 0 twice", p.Number)
			}
			t.zero = make([]float32, p.Width)
			dst = t.zero
		} else {
			s := t.slot(k)
			for t.keys[s] != 0 {
				if t.keys[s] == k {
					return nil, fmt.Errorf("shard: partition %d holds feature %d twice", p.Number, k)
				}
				s = (s + 1) & mask
			}
			t.keys[s] = k
			dst = t.vals[int(s)*p.Width : int(s+1)*p.Width]
		}
		for j := range dst {
			dst[j] = p.Value(i, j)
		}
	}
	return t, nil
}

func (t *Table) slot(k uint64) uint64 {
	return ((k ^ k>>29) * 0x9e3779b97f4a7c15 >> t.shift) & uint64(len(t.keys)-1)
}

// Get returns the values of key k, or false when the table has no k.
// The returned slice aliases the table: callers must not modify it.
func (t *Table) Get(k uint64) ([]float32, bool) {
	if k == 0 {
		return t.zero, t.zero != nil
	}
	mask := uint64(len(t.keys) - 1)
	for s := t.slot(k); ; s = (s + 1) & mask {
		switch t.keys[s] {
		case k:
			return t.vals[int(s)*t.width : int(s+1)*t.width], true
		case 0:
			return nil, false
		}
	}
}

// Len is the number of keys.
func (t *Table) Len() int { return t.entries }

// Width is the number of values per key.
func (t *Table) Width() int { return t.width }

// Bytes is the table's resident size.
func (t *Table) Bytes() int64 { return int64(len(t.keys))*8 + int64(len(t.vals)+len(t.zero))*4 }
