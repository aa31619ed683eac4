package codec

import (
	"bufio"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"math"
	"math/bits"
	"slices"

	"github.com/x448/float16"
)

// Partition file, formats 2 and 3: the image of a shard's lookup table,
// so a loader verifies it and uses it in place, building nothing.
//
//	offset 0    header, 64 bytes:
//	              [0:8]   magic "CMLSPRT1"
//	              [8:12]  uint32 format version (2 or 3)
//	              [12:16] uint32 vector encoding: 0 fp32, 1 fp16, 2 int8
//	              [16:20] uint32 width: values per key (1 + FM dim)
//	              [20:24] uint32 partition number
//	              [24:32] uint64 record count n
//	              [32:36] uint32 checksum block size B in bytes
//	              [36:40] uint32 record size R
//	              [40:48] uint64 bucket count nb
//	              [48:60] zero
//	              [60:64] uint32 CRC-32C of bytes [0:60]
//	offset 64   directory: (nb+1) × uint32; bucket b holds records
//	              dir[b] ≤ i < dir[b+1]; dir[nb] = n. Zero-padded to 8 bytes.
//	            records: n × R bytes, ascending by h, where h = KeyHash(key):
//	              [0:8]  uint64 h (KeyHash is a bijection: exact membership)
//	              [8:12] float32 linear weight
//	              fp32:  dim × float32 factors
//	              fp16:  dim × IEEE half factors
//	              int8:  float32 scale, dim × int8; factor = q × scale
//	            format 3 stores the same records split: first every key
//	            (n × 8 bytes), then every value (n × (R − 8) bytes: the
//	            record less its key), in the same order
//	            format 4 stores quotiented keys: each record is its value
//	              bytes, then the top K bytes of h's place in its bucket
//	              (the low half of h × nb); R = the record less its key + K
//	            block checksums: one CRC-32C per B-byte block of everything above
//	end - 16    trailer: uint64 block count, uint32 CRC-32C of the checksum
//	              table, magic "CMLE"
//
// Bucket of h: the high 64 bits of h × nb; the low 64 bits are h's
// position within its bucket, so a lookup's first guess is
// dir[b] + ⌊low × count / 2^64⌋ — usually the right cache line.
// nb = ⌈n / 16⌉: the directory costs 0.25 bytes a record.
//
// Writers choose format 3 for records wider than a cache line (SplitKeys:
// FFM, DNN embeddings, FM of dim 16 and more in fp32): a lookup's search
// then reads keys only, eight to a line, and a found key's value once.
// Narrow records (LR, small FM) are stored whole: in format 4 (quotiented
// keys) when the partition has at least 256 buckets, else in format 2.
// Formats 2 and 3 have the same size; all three are read.
//
// Quotiented keys (format 4): a record's bucket already fixes the high
// half of h × nb, so the record stores only the low half's top K bytes,
// q = low >> (64 − 8K): K = 6 from 2^16 buckets (which a file of 2^19
// records or more has: quotBuckets), 7 from 2^8. Two keys of
// a bucket differ in low by at least nb (≥ 2^(64−8K)), so q is exact and
// ordered like h; h is ⌈(b·2^64 + q·2^(64−8K)) / nb⌉. An fp32 LR
// parameter then costs 4 + 6 + 0.25 = 10.25 bytes. The key sits last in
// the record, so the 8 bytes that end the record read as one
// little-endian word whose top 8K bits are q (QuotientMask): a lookup
// compares that word, junk low bits and all, with its own low half
// masked (below ⟺ q below), so a search is one load and one comparison
// a record, as with 8-byte keys. Keys are compared only inside their
// bucket.
const (
	partMagic       = "CMLSPRT1"
	trailerMagic    = "CMLE"
	partFormat      = 2 // records whole
	splitFormat     = 3 // keys apart from values
	quotFormat      = 4 // records whole, keys quotiented
	partHeaderSize  = 64
	partTrailerSize = 16
	// DefaultBlockSize is the checksum block size writers use.
	DefaultBlockSize = 1 << 20
	// RecordsPerBucket is the writers' mean bucket occupancy.
	RecordsPerBucket = 16
)

// Encoding is how FM factors are stored. The linear weight is always fp32.
type Encoding uint32

const (
	EncFP32 Encoding = iota // exact
	EncFP16                 // IEEE half, round to nearest even
	EncInt8                 // per-record scale max|v|/127, round to nearest
)

// Encodings by manifest name.
var Encodings = map[string]Encoding{"fp32": EncFP32, "fp16": EncFP16, "int8": EncInt8}

func (e Encoding) String() string {
	switch e {
	case EncFP32:
		return "fp32"
	case EncFP16:
		return "fp16"
	case EncInt8:
		return "int8"
	}
	return fmt.Sprintf("encoding(%d)", uint32(e))
}

// Tombstone is the linear weight of a delta record that deletes its
// feature. Weights are finite everywhere else (importers and writers
// refuse NaN), so a NaN weight is unambiguous.
var Tombstone = math.Float32frombits(0x7fc0dead)

// IsTombstone reports whether a decoded linear weight marks a deletion.
func IsTombstone(w float32) bool { return w != w }

// RecordSize is the bytes per record of width values in encoding e.
func RecordSize(width int, e Encoding) int {
	dim := width - 1
	switch e {
	case EncFP16:
		return 12 + 2*dim
	case EncInt8:
		if dim == 0 {
			return 12
		}
		return 16 + dim
	}
	return 12 + 4*dim
}

// SplitKeys reports whether records of width values in encoding e are
// written keys apart from values (format 3): those wider than a cache
// line.
func SplitKeys(width int, e Encoding) bool { return RecordSize(width, e) > 64 }

// KeyHash is the bijective mixer (splitmix64's finalizer) that orders
// records; KeyUnhash inverts it.
func KeyHash(k uint64) uint64 {
	k = (k ^ k>>30) * 0xbf58476d1ce4e5b9
	k = (k ^ k>>27) * 0x94d049bb133111eb
	return k ^ k>>31
}

// KeyUnhash returns the key whose KeyHash is h.
func KeyUnhash(h uint64) uint64 {
	h = unxorshift(h, 31) * inv2
	h = unxorshift(h, 27) * inv1
	return unxorshift(h, 30)
}

// Multiplicative inverses mod 2^64 of KeyHash's odd constants.
var inv1, inv2 = modInverse(0xbf58476d1ce4e5b9), modInverse(0x94d049bb133111eb)

// modInverse of odd c by Newton's iteration: each step doubles the
// number of correct low bits (3 → 6 → … → 96).
func modInverse(c uint64) uint64 {
	x := c
	for range 5 {
		x *= 2 - c*x
	}
	return x
}

// unxorshift inverts x ^= x >> s: each round fixes s more high bits.
func unxorshift(x uint64, s uint) uint64 {
	y := x
	for i := uint(0); i < 64; i += s {
		y = x ^ y>>s
	}
	return y
}

// Buckets is the directory size for n records.
func Buckets(n int) int { return max(1, (n+RecordsPerBucket-1)/RecordsPerBucket) }

// quotBuckets is the directory size for n records with quotiented keys:
// from 2^19 records at least 2^16 buckets, so that keys take 6 bytes,
// not 7, for at most 0.25 more bytes of directory a record (10.5 B/param
// at worst, where 7-byte keys would cost 11.25).
func quotBuckets(n int) int {
	if n >= 1<<19 {
		return max(Buckets(n), 1<<16)
	}
	return Buckets(n)
}

// bucketsOf is the directory size of n records in format f.
func bucketsOf(n, f int) int {
	if f == quotFormat {
		return quotBuckets(n)
	}
	return Buckets(n)
}

// dirBytes is the directory's size for nb buckets, padded to 8 bytes.
func dirBytes(nb int) int64 { return (int64(nb+1)*4 + 7) &^ 7 }

// QuotientBytes is how many bytes of a key a quotiented record of a
// partition of nb buckets stores (6 or 7), or 0 where it stores the
// whole 8-byte h (fewer than 256 buckets).
func QuotientBytes(nb int) int {
	switch {
	case nb >= 1<<16:
		return 6
	case nb >= 1<<8:
		return 7
	}
	return 0
}

// Quotiented reports whether writers store n records of width values in
// encoding e with quotiented keys (format 4): narrow records of a
// partition with at least 256 buckets.
func Quotiented(n, width int, e Encoding) bool {
	return !SplitKeys(width, e) && QuotientBytes(Buckets(n)) > 0
}

// QuotientMask is the bits of a quotiented record's key word that hold
// its q, for a partition of nb buckets (≥ 256).
func QuotientMask(nb int) uint64 { return ^uint64(0) << (64 - 8*QuotientBytes(nb)) }

// Unquotient is the h of the record in bucket b (< nb) whose key word,
// masked by QuotientMask, is w: the one h with h × nb in [b·2^64 + w,
// b·2^64 + w + 2^(64−8K)), an interval no longer than nb.
func Unquotient(b, w uint64, nb int) uint64 {
	q, r := bits.Div64(b, w, uint64(nb))
	if r != 0 {
		q++
	}
	return q
}

// StoredRecordSize is the bytes a record of width values in encoding e
// takes in a partition of n records, as writers store it.
func StoredRecordSize(n, width int, e Encoding) int {
	f := writeFormat(n, width, e)
	return storedSize(uint32(f), RecordSize(width, e), uint64(bucketsOf(n, f)))
}

// PartitionFileSize is the exact size of a partition file as writers
// write it.
func PartitionFileSize(count, width int, e Encoding, blockSize int) int64 {
	return fileSize(count, bucketsOf(count, writeFormat(count, width, e)), StoredRecordSize(count, width, e), blockSize)
}

// PartitionSizeValid reports whether size is that of a partition file of
// count records of width values in encoding e in a format this build
// reads: as writers write it now, or with whole keys (formats 2 and 3,
// all that earlier builds wrote).
func PartitionSizeValid(size int64, count, width int, e Encoding, blockSize int) bool {
	return size == PartitionFileSize(count, width, e, blockSize) || size == fileSize(count, Buckets(count), RecordSize(width, e), blockSize)
}

// fileSize is the size of a partition file of count records of rs bytes
// behind nb buckets.
func fileSize(count, nb, rs, blockSize int) int64 {
	body := int64(partHeaderSize) + dirBytes(nb) + int64(count)*int64(rs)
	blocks := (body + int64(blockSize) - 1) / int64(blockSize)
	return body + 4*blocks + partTrailerSize
}

// FileSum is what a writer reports about a file it wrote.
type FileSum struct {
	Size   int64
	SHA256 string // hex
}

// WritePartition writes a partition file to w: keys with width float32
// values each, factors stored in encoding e. Duplicate keys are refused.
func WritePartition(w io.Writer, partition uint32, width int, e Encoding, keys []uint64, values []float32) (FileSum, error) {
	return writePartition(w, partition, width, e, keys, values, writeFormat(len(keys), width, e))
}

// WriteWholeKeys is WritePartition with whole 8-byte keys (format 2, or 3
// for records wider than a cache line) at any size: files as builds
// before format 4 wrote them, which those builds read, 1 or 2 bytes a
// record larger.
func WriteWholeKeys(w io.Writer, partition uint32, width int, e Encoding, keys []uint64, values []float32) (FileSum, error) {
	f := partFormat
	if SplitKeys(width, e) {
		f = splitFormat
	}
	return writePartition(w, partition, width, e, keys, values, f)
}

func writePartition(w io.Writer, partition uint32, width int, e Encoding, keys []uint64, values []float32, f int) (FileSum, error) {
	if width <= 0 || width > 1<<16 {
		return FileSum{}, fmt.Errorf("codec: partition width %d outside 1..65536", width)
	}
	if e > EncInt8 {
		return FileSum{}, fmt.Errorf("codec: unknown encoding %d", e)
	}
	if len(values) != len(keys)*width {
		return FileSum{}, fmt.Errorf("codec: %d values for %d keys of width %d", len(values), len(keys), width)
	}
	hs := make([]uint64, len(keys))
	for i, k := range keys {
		hs[i] = KeyHash(k)
	}
	return writeSorted(w, partition, width, e, f, hs, func(rec []byte, i int) {
		EncodeRecord(rec, hs[i], values[i*width:(i+1)*width], e)
	})
}

// WriteRecords writes a partition file of records already encoded
// (RecordSize(width, e) bytes each, key hash first, as a Partition holds
// them), copied as they are: never decoded and encoded again, so values
// quantized once stay bit-identical. Duplicate keys are refused.
func WriteRecords(w io.Writer, partition uint32, width int, e Encoding, records []byte) (FileSum, error) {
	if width <= 0 || width > 1<<16 {
		return FileSum{}, fmt.Errorf("codec: partition width %d outside 1..65536", width)
	}
	if e > EncInt8 {
		return FileSum{}, fmt.Errorf("codec: unknown encoding %d", e)
	}
	rs := RecordSize(width, e)
	if len(records)%rs != 0 {
		return FileSum{}, fmt.Errorf("codec: %d record bytes are not whole records of %d", len(records), rs)
	}
	hs := make([]uint64, len(records)/rs)
	for i := range hs {
		hs[i] = binary.LittleEndian.Uint64(records[i*rs:])
	}
	return writeSorted(w, partition, width, e, writeFormat(len(hs), width, e), hs, func(rec []byte, i int) { copy(rec, records[i*rs:(i+1)*rs]) })
}

// writeFormat is the format writers write n records of width values in
// encoding e in.
func writeFormat(n, width int, e Encoding) int {
	switch {
	case SplitKeys(width, e):
		return splitFormat
	case Quotiented(n, width, e):
		return quotFormat
	}
	return partFormat
}

// writeSorted writes a partition file of the records whose key hashes
// are hs, in file order, in format f (quotFormat only with at least 256
// buckets); record(rec, i) fills record i, its whole key first.
func writeSorted(w io.Writer, partition uint32, width int, e Encoding, f int, hs []uint64, record func(rec []byte, i int)) (FileSum, error) {
	n := len(hs)
	nb := bucketsOf(n, f)
	// Counting sort by bucket yields the directory; each bucket (16 on
	// average) is then sorted by h.
	dir := make([]uint32, nb+1)
	for _, h := range hs {
		b, _ := bits.Mul64(h, uint64(nb))
		dir[b+1]++
	}
	for b := 1; b <= nb; b++ {
		dir[b] += dir[b-1]
	}
	order := make([]uint32, n)
	next := slices.Clone(dir[:nb])
	for i, h := range hs {
		b, _ := bits.Mul64(h, uint64(nb))
		order[next[b]] = uint32(i)
		next[b]++
	}
	for b := 0; b < nb; b++ {
		bucket := order[dir[b]:dir[b+1]]
		sortByHash(bucket, hs)
		for j := 1; j < len(bucket); j++ {
			if hs[bucket[j]] == hs[bucket[j-1]] {
				return FileSum{}, fmt.Errorf("codec: key %d appears twice", KeyUnhash(hs[bucket[j]]))
			}
		}
	}

	rs := RecordSize(width, e)
	stored := storedSize(uint32(f), rs, uint64(nb))
	bw := newBlockWriter(w, DefaultBlockSize, fileSize(n, nb, stored, DefaultBlockSize))
	var h [partHeaderSize]byte
	copy(h[0:8], partMagic)
	binary.LittleEndian.PutUint32(h[8:], uint32(f))
	binary.LittleEndian.PutUint32(h[12:], uint32(e))
	binary.LittleEndian.PutUint32(h[16:], uint32(width))
	binary.LittleEndian.PutUint32(h[20:], partition)
	binary.LittleEndian.PutUint64(h[24:], uint64(n))
	binary.LittleEndian.PutUint32(h[32:], DefaultBlockSize)
	binary.LittleEndian.PutUint32(h[36:], uint32(stored))
	binary.LittleEndian.PutUint64(h[40:], uint64(nb))
	binary.LittleEndian.PutUint32(h[60:], crc32.Checksum(h[:60], castagnoli))
	bw.write(h[:])
	d := make([]byte, dirBytes(nb))
	for b, off := range dir {
		binary.LittleEndian.PutUint32(d[4*b:], off)
	}
	bw.write(d)
	rec := make([]byte, rs)
	if f == quotFormat {
		// The value bytes, then the top bytes of h's place in its bucket
		// (little-endian: the low half's last stored − (rs − 8) bytes).
		out := make([]byte, stored)
		for _, i := range order {
			record(rec, int(i))
			_, low := bits.Mul64(hs[i], uint64(nb))
			binary.LittleEndian.PutUint64(out[stored-8:], low)
			copy(out, rec[8:]) // over low's bytes below the key's
			bw.write(out)
		}
		return bw.finish()
	}
	if f != splitFormat {
		for _, i := range order {
			record(rec, int(i))
			bw.write(rec)
		}
		return bw.finish()
	}
	// Keys, then values: each record is made twice rather than held.
	for _, i := range order {
		bw.write(binary.LittleEndian.AppendUint64(rec[:0], hs[i]))
	}
	for _, i := range order {
		record(rec, int(i))
		bw.write(rec[8:])
	}
	return bw.finish()
}

// sortByHash sorts a bucket's records (indexes into hs) by hash. A
// bucket holds 16 on average: an insertion sort, with no call per
// comparison, unless it is far larger (keys chosen to share a bucket).
func sortByHash(bucket []uint32, hs []uint64) {
	if len(bucket) > 64 {
		slices.SortFunc(bucket, func(x, y uint32) int { return cmp.Compare(hs[x], hs[y]) })
		return
	}
	for j := 1; j < len(bucket); j++ {
		x := bucket[j]
		k := j
		for ; k > 0 && hs[bucket[k-1]] > hs[x]; k-- {
			bucket[k] = bucket[k-1]
		}
		bucket[k] = x
	}
}

// EncodeRecord fills rec (RecordSize bytes) with h and vals in encoding e.
func EncodeRecord(rec []byte, h uint64, vals []float32, e Encoding) {
	binary.LittleEndian.PutUint64(rec, h)
	binary.LittleEndian.PutUint32(rec[8:], math.Float32bits(vals[0]))
	v := vals[1:]
	switch e {
	case EncFP32:
		for j, x := range v {
			binary.LittleEndian.PutUint32(rec[12+4*j:], math.Float32bits(x))
		}
	case EncFP16:
		for j, x := range v {
			binary.LittleEndian.PutUint16(rec[12+2*j:], uint16(float16.Fromfloat32(x)))
		}
	case EncInt8:
		if len(v) == 0 {
			return
		}
		var m float32
		for _, x := range v {
			m = max(m, float32(math.Abs(float64(x))))
		}
		scale := m / 127
		binary.LittleEndian.PutUint32(rec[12:], math.Float32bits(scale))
		for j, x := range v {
			q := 0.0
			if scale > 0 {
				q = math.Round(float64(x / scale))
			}
			rec[16+j] = byte(int8(max(-127, min(127, q))))
		}
	}
}

// AppendRecordValues appends a record's width values as little-endian
// float32s (what a lookup response carries): fp32 records' bytes as they
// are, others decoded.
func AppendRecordValues(dst []byte, rec []byte, width int, e Encoding) []byte {
	return AppendValues(dst, rec[8:], width, e)
}

// AppendValues is AppendRecordValues on a record's value bytes (the
// record less its key, as format 3 stores them apart).
func AppendValues(dst []byte, v []byte, width int, e Encoding) []byte {
	if e == EncFP32 {
		return append(dst, v[:4*width]...)
	}
	dst = append(dst, v[:4]...) // the weight, always fp32
	switch e {
	case EncFP16:
		for j := range width - 1 {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(float16.Frombits(binary.LittleEndian.Uint16(v[4+2*j:])).Float32()))
		}
	case EncInt8:
		if width == 1 {
			return dst
		}
		scale := math.Float32frombits(binary.LittleEndian.Uint32(v[4:]))
		for j := range width - 1 {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(float32(int8(v[8+j]))*scale))
		}
	}
	return dst
}

// DecodeRecord writes a record's width values into dst.
func DecodeRecord(dst []float32, rec []byte, e Encoding) { DecodeValues(dst, rec[8:], e) }

// DecodeValues is DecodeRecord on a record's value bytes (the record
// less its key).
func DecodeValues(dst []float32, v []byte, e Encoding) {
	dst[0] = math.Float32frombits(binary.LittleEndian.Uint32(v))
	f := dst[1:]
	switch e {
	case EncFP32:
		for j := range f {
			f[j] = math.Float32frombits(binary.LittleEndian.Uint32(v[4+4*j:]))
		}
	case EncFP16:
		for j := range f {
			f[j] = float16.Frombits(binary.LittleEndian.Uint16(v[4+2*j:])).Float32()
		}
	case EncInt8:
		if len(f) == 0 {
			return
		}
		scale := math.Float32frombits(binary.LittleEndian.Uint32(v[4:]))
		for j := range f {
			f[j] = float32(int8(v[8+j])) * scale
		}
	}
}

// blockWriter checksums everything it writes in fixed blocks and appends
// the checksum table and trailer on finish.
type blockWriter struct {
	w         *bufio.Writer
	sha       hash.Hash
	blockSize int
	inBlock   int
	crc       uint32
	crcs      []uint32
	size      int64
	err       error
}

// newBlockWriter writes a file of about size bytes to w: its buffer is
// no larger (a delta's partitions are often a few kilobytes, and a
// window of pushes writes a thousand of them a second).
func newBlockWriter(w io.Writer, blockSize int, size int64) *blockWriter {
	sha := sha256.New()
	return &blockWriter{w: bufio.NewWriterSize(io.MultiWriter(w, sha), int(min(size, 1<<16))), sha: sha, blockSize: blockSize}
}

func (b *blockWriter) write(p []byte) {
	for len(p) > 0 && b.err == nil {
		n := min(len(p), b.blockSize-b.inBlock)
		b.crc = crc32.Update(b.crc, castagnoli, p[:n])
		_, b.err = b.w.Write(p[:n])
		b.inBlock += n
		b.size += int64(n)
		p = p[n:]
		if b.inBlock == b.blockSize {
			b.crcs = append(b.crcs, b.crc)
			b.crc, b.inBlock = 0, 0
		}
	}
}

func (b *blockWriter) finish() (FileSum, error) {
	if b.inBlock > 0 {
		b.crcs = append(b.crcs, b.crc)
	}
	table := make([]byte, 4*len(b.crcs))
	for i, c := range b.crcs {
		binary.LittleEndian.PutUint32(table[4*i:], c)
	}
	var t [partTrailerSize]byte
	binary.LittleEndian.PutUint64(t[0:], uint64(len(b.crcs)))
	binary.LittleEndian.PutUint32(t[8:], crc32.Checksum(table, castagnoli))
	copy(t[12:], trailerMagic)
	if b.err == nil {
		_, b.err = b.w.Write(table)
	}
	if b.err == nil {
		_, b.err = b.w.Write(t[:])
	}
	if b.err == nil {
		b.err = b.w.Flush()
	}
	if b.err != nil {
		return FileSum{}, fmt.Errorf("codec: writing partition file: %w", b.err)
	}
	return FileSum{Size: b.size + int64(len(table)) + partTrailerSize, SHA256: hex.EncodeToString(b.sha.Sum(nil))}, nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)
