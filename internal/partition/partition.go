// Package partition maps a feature id to its partition.
//
// The mapping is part of the model format and must never change for a
// given hash name: partition = xxh64(little-endian 8 bytes of id, seed 0) mod P.
// Any client or tool in any language can reproduce it from that sentence.
package partition

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// HashName is the name recorded in manifests for the mapping implemented here.
const HashName = "xxh64-le64"

// Of returns the partition of id among p partitions. p must be > 0.
func Of(id uint64, p uint32) uint32 {
	return uint32(Hash(id) % uint64(p))
}

// Hash is xxh64 of the id's 8 little-endian bytes.
func Hash(id uint64) uint64 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], id)
	return xxhash.Sum64(b[:])
}
