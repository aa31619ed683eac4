package codec

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"math"
)

// Partition file, format 1. One file holds one partition of one model
// version: every key of the partition and its values, structure-of-arrays
// so a table can be built (or, later, used in place) without reshuffling.
//
//	offset 0    header, 64 bytes:
//	              [0:8]   magic "CMLSPRT1"
//	              [8:12]  uint32 format version (1)
//	              [12:16] uint32 value type (0 = float32)
//	              [16:20] uint32 width: values per key
//	              [20:24] uint32 partition number
//	              [24:32] uint64 key count c
//	              [32:36] uint32 checksum block size B in bytes
//	              [36:60] zero
//	              [60:64] uint32 CRC-32C of bytes [0:60]
//	offset 64   keys:   c × uint64 little-endian, unique, any order
//	            values: c × width × float32 little-endian, key-major
//	            block checksums: one CRC-32C per B-byte block of
//	              everything above (the last block may be short)
//	end - 16    trailer: uint64 block count, uint32 CRC-32C of the
//	              checksum table, magic "CMLE"
//
// All integers are little-endian. The whole file's SHA-256 is recorded in
// the version's manifest; the per-block CRCs let a loader verify blocks in
// parallel and name the damaged offset.
const (
	partMagic       = "CMLSPRT1"
	trailerMagic    = "CMLE"
	partHeaderSize  = 64
	partTrailerSize = 16
	// DefaultBlockSize is the checksum block size writers use.
	DefaultBlockSize = 1 << 20
	ValueFloat32     = 0
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// PartitionFileSize is the exact size of a partition file.
func PartitionFileSize(count, width, blockSize int) int64 {
	body := int64(partHeaderSize) + int64(count)*8 + int64(count)*int64(width)*4
	blocks := (body + int64(blockSize) - 1) / int64(blockSize)
	return body + 4*blocks + partTrailerSize
}

// FileSum is what a writer reports about a file it wrote.
type FileSum struct {
	Size   int64
	SHA256 string // hex
}

// WritePartition writes a partition file to w. keys must be unique (the
// loader refuses duplicates); values holds width floats per key.
func WritePartition(w io.Writer, partition uint32, width int, keys []uint64, values []float32) (FileSum, error) {
	if width <= 0 {
		return FileSum{}, fmt.Errorf("codec: partition width %d must be positive", width)
	}
	if len(values) != len(keys)*width {
		return FileSum{}, fmt.Errorf("codec: %d values for %d keys of width %d", len(values), len(keys), width)
	}
	bw := newBlockWriter(w, DefaultBlockSize)
	var h [partHeaderSize]byte
	copy(h[0:8], partMagic)
	binary.LittleEndian.PutUint32(h[8:], 1)
	binary.LittleEndian.PutUint32(h[12:], ValueFloat32)
	binary.LittleEndian.PutUint32(h[16:], uint32(width))
	binary.LittleEndian.PutUint32(h[20:], partition)
	binary.LittleEndian.PutUint64(h[24:], uint64(len(keys)))
	binary.LittleEndian.PutUint32(h[32:], DefaultBlockSize)
	binary.LittleEndian.PutUint32(h[60:], crc32.Checksum(h[:60], castagnoli))
	bw.write(h[:])
	var buf [8]byte
	for _, k := range keys {
		binary.LittleEndian.PutUint64(buf[:], k)
		bw.write(buf[:8])
	}
	for _, v := range values {
		binary.LittleEndian.PutUint32(buf[:], math.Float32bits(v))
		bw.write(buf[:4])
	}
	return bw.finish()
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

func newBlockWriter(w io.Writer, blockSize int) *blockWriter {
	sha := sha256.New()
	return &blockWriter{w: bufio.NewWriterSize(io.MultiWriter(w, sha), 1<<16), sha: sha, blockSize: blockSize}
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

// Partition is a verified partition file's contents, as views into the
// file's bytes.
type Partition struct {
	Number uint32
	Width  int
	Count  int
	keys   []byte
	values []byte
}

// Key returns the i-th key.
func (p *Partition) Key(i int) uint64 { return binary.LittleEndian.Uint64(p.keys[8*i:]) }

// Value returns value j of the i-th key.
func (p *Partition) Value(i, j int) float32 {
	return math.Float32frombits(binary.LittleEndian.Uint32(p.values[4*(i*p.Width+j):]))
}

// ParsePartition checks structure and every block checksum of a whole
// partition file held in b, and returns views into b. A damaged file is
// refused with an error wrapping ErrCorrupt that names the first bad
// block's offset.
func ParsePartition(b []byte) (*Partition, error) {
	if len(b) < partHeaderSize+partTrailerSize {
		return nil, fmt.Errorf("%w: partition file: %d bytes is shorter than header and trailer", ErrCorrupt, len(b))
	}
	h := b[:partHeaderSize]
	if string(h[:8]) != partMagic {
		return nil, fmt.Errorf("%w: partition file: bad magic %q", ErrCorrupt, h[:8])
	}
	if crc32.Checksum(h[:60], castagnoli) != binary.LittleEndian.Uint32(h[60:]) {
		return nil, fmt.Errorf("%w: partition file: header checksum mismatch", ErrCorrupt)
	}
	if v := binary.LittleEndian.Uint32(h[8:]); v != 1 {
		return nil, fmt.Errorf("%w: partition file: unsupported format version %d", ErrCorrupt, v)
	}
	if vt := binary.LittleEndian.Uint32(h[12:]); vt != ValueFloat32 {
		return nil, fmt.Errorf("%w: partition file: unsupported value type %d", ErrCorrupt, vt)
	}
	width := int(binary.LittleEndian.Uint32(h[16:]))
	count := binary.LittleEndian.Uint64(h[24:])
	bs := int(binary.LittleEndian.Uint32(h[32:]))
	if width <= 0 || width > 1<<16 || bs < 4096 || count > uint64(len(b))/8 {
		return nil, fmt.Errorf("%w: partition file: implausible header (width %d, count %d, block size %d)", ErrCorrupt, width, count, bs)
	}
	if want := PartitionFileSize(int(count), width, bs); int64(len(b)) != want {
		return nil, fmt.Errorf("%w: partition file: size %d, header implies %d (truncated or padded)", ErrCorrupt, len(b), want)
	}
	t := b[len(b)-partTrailerSize:]
	if string(t[12:]) != trailerMagic {
		return nil, fmt.Errorf("%w: partition file: bad trailer magic", ErrCorrupt)
	}
	body := int64(partHeaderSize) + int64(count)*8 + int64(count)*int64(width)*4
	nblocks := int((body + int64(bs) - 1) / int64(bs))
	if binary.LittleEndian.Uint64(t[0:]) != uint64(nblocks) {
		return nil, fmt.Errorf("%w: partition file: trailer block count mismatch", ErrCorrupt)
	}
	table := b[body : body+4*int64(nblocks)]
	if crc32.Checksum(table, castagnoli) != binary.LittleEndian.Uint32(t[8:]) {
		return nil, fmt.Errorf("%w: partition file: checksum table corrupt", ErrCorrupt)
	}
	for i := 0; i < nblocks; i++ {
		lo := int64(i) * int64(bs)
		hi := min(lo+int64(bs), body)
		if crc32.Checksum(b[lo:hi], castagnoli) != binary.LittleEndian.Uint32(table[4*i:]) {
			return nil, fmt.Errorf("%w: partition file: checksum mismatch in block %d (bytes %d–%d)", ErrCorrupt, i, lo, hi)
		}
	}
	kEnd := partHeaderSize + 8*int64(count)
	return &Partition{
		Number: binary.LittleEndian.Uint32(h[20:]),
		Width:  width,
		Count:  int(count),
		keys:   b[partHeaderSize:kEnd],
		values: b[kEnd:body],
	}, nil
}
