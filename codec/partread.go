package codec

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"sort"
	"sync"

	"github.com/x448/float16"
)

// maxBlockSize bounds the checksum block size a reader accepts: it sizes
// the streaming verifier's buffer.
const maxBlockSize = 64 << 20

// Partition is a partition file's table, as views into the file's bytes:
// nothing is copied or built.
type Partition struct {
	Number     uint32
	Width      int
	Count      int
	Encoding   Encoding
	RecordSize int // a record with its whole 8-byte key, as format 2 stores it
	Buckets    int
	// Format is 2: records whole; 3: keys apart from values (SplitKeys);
	// 4: records whole, keys quotiented (Quotiented).
	Format int
	Dir    []byte // (Buckets+1) × uint32
	// Keys holds record i's key word, 8 bytes at Keys[i×KeyStride:]: its
	// h in formats 2 (the record itself, KeyStride = RecordSize) and 3
	// (the keys alone, KeyStride = 8); in format 4 the 8 bytes that end
	// the record, whose bits KeyMask are q, h's place in its bucket
	// (KeyStride = StoredSize).
	Keys      []byte
	KeyStride int
	KeyMask   uint64 // the bits of a key word that are the key: all but in format 4
	// Vals holds record i's value bytes (the record less its key) at
	// Vals[i×ValStride:], RecordSize − 8 of them (ValueBytes).
	Vals      []byte
	ValStride int
	// StoredSize is the bytes a record takes in the file: RecordSize, or
	// less in format 4.
	StoredSize int
	// KeysOffset is where the records (format 3: the keys) start in the
	// file.
	KeysOffset int64
	// Owner keeps the bytes' backing memory alive (a mapping, say); whoever
	// keeps views of the partition keeps Owner too. Nil for heap bytes.
	Owner     any
	blockSize int
	body      []byte // everything the block checksums cover
	table     []byte // the block checksums
}

// Hash returns record i's h. In format 4 it finds i's bucket first, a
// binary search of the directory: for tools, not lookups (EachHash walks
// them all in order).
func (p *Partition) Hash(i int) uint64 {
	return HashAt(p.Dir, p.Buckets, p.Format == quotFormat, p.keyWord, i)
}

// EachHash calls fn with every record and its h, in order.
func (p *Partition) EachHash(fn func(i int, h uint64)) {
	WalkHashes(p.Dir, p.Buckets, p.Format == quotFormat, p.keyWord, fn)
}

// keyWord is record i's key word, masked to its key's bits.
func (p *Partition) keyWord(i int) uint64 {
	return binary.LittleEndian.Uint64(p.Keys[i*p.KeyStride:]) & p.KeyMask
}

// HashAt is the h of record i of a table whose directory dir has nb
// buckets, and whose record i's key word, masked to its key's bits, is
// word(i): the word itself, or if quot (format 4) the h it quotients,
// found through i's bucket (a binary search of the directory).
func HashAt(dir []byte, nb int, quot bool, word func(i int) uint64, i int) uint64 {
	if !quot {
		return word(i)
	}
	// i's bucket: the first that ends past i.
	b := sort.Search(nb, func(b int) bool { return binary.LittleEndian.Uint32(dir[4*(b+1):]) > uint32(i) })
	return Unquotient(uint64(b), word(i), nb)
}

// WalkHashes calls fn with every record of a table (as HashAt describes
// it) and its h, in order, bucket by bucket.
func WalkHashes(dir []byte, nb int, quot bool, word func(i int) uint64, fn func(i int, h uint64)) {
	for b := range nb {
		lo, hi := binary.LittleEndian.Uint32(dir[4*b:]), binary.LittleEndian.Uint32(dir[4*(b+1):])
		for i := int(lo); i < int(hi); i++ {
			if quot {
				fn(i, Unquotient(uint64(b), word(i), nb))
			} else {
				fn(i, word(i))
			}
		}
	}
}

// ValueBytes returns record i's value bytes: the record less its key.
func (p *Partition) ValueBytes(i int) []byte {
	o := i * p.ValStride
	return p.Vals[o : o+p.RecordSize-8 : o+p.RecordSize-8]
}

// AppendRecord appends record i, its key first, as format 2 stores it.
func (p *Partition) AppendRecord(dst []byte, i int) []byte {
	return append(binary.LittleEndian.AppendUint64(dst, p.Hash(i)), p.ValueBytes(i)...)
}

// Key returns record i's feature id.
func (p *Partition) Key(i int) uint64 { return KeyUnhash(p.Hash(i)) }

// Values decodes record i's Width values into dst.
func (p *Partition) Values(i int, dst []float32) {
	DecodeValues(dst, p.ValueBytes(i), p.Encoding)
}

// Value returns value j of record i (convenient, not fast).
func (p *Partition) Value(i, j int) float32 {
	v := make([]float32, p.Width)
	p.Values(i, v)
	return v[j]
}

// ParsePartition checks a whole partition file held in b — structure and
// every block checksum — and returns views into b. A damaged file is
// refused with an error wrapping ErrCorrupt that names what is wrong.
func ParsePartition(b []byte) (*Partition, error) {
	p, err := ParsePartitionStructure(b)
	if err != nil {
		return nil, err
	}
	if err := p.VerifyBlocks(1); err != nil {
		return nil, err
	}
	return p, nil
}

// ParsePartitionStructure checks everything but the block checksums,
// touching only the header, directory and trailer; VerifyBlocks does the
// rest, in parallel.
func ParsePartitionStructure(b []byte) (*Partition, error) {
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
	format := binary.LittleEndian.Uint32(h[8:])
	if format != partFormat && format != splitFormat && format != quotFormat {
		return nil, fmt.Errorf("%w: partition file: format version %d, this build reads %d to %d (re-import or regenerate the model)", ErrCorrupt, format, partFormat, quotFormat)
	}
	p := &Partition{
		Format:     int(format),
		Encoding:   Encoding(binary.LittleEndian.Uint32(h[12:])),
		Width:      int(binary.LittleEndian.Uint32(h[16:])),
		Number:     binary.LittleEndian.Uint32(h[20:]),
		StoredSize: int(binary.LittleEndian.Uint32(h[36:])),
		blockSize:  int(binary.LittleEndian.Uint32(h[32:])),
		KeyMask:    ^uint64(0),
	}
	count := binary.LittleEndian.Uint64(h[24:])
	nb := binary.LittleEndian.Uint64(h[40:])
	if p.Width > 0 && p.Width <= 1<<16 && p.Encoding <= EncInt8 {
		p.RecordSize = RecordSize(p.Width, p.Encoding)
	}
	switch {
	case p.Encoding > EncInt8:
		return nil, fmt.Errorf("%w: partition file: unknown encoding %d", ErrCorrupt, p.Encoding)
	case p.RecordSize == 0 || p.StoredSize == 0 || p.StoredSize != storedSize(format, p.RecordSize, nb):
		return nil, fmt.Errorf("%w: partition file: width %d and record size %d disagree", ErrCorrupt, p.Width, p.StoredSize)
	case p.blockSize < 4096 || p.blockSize > maxBlockSize || count > uint64(len(b))/minRecordSize:
		return nil, fmt.Errorf("%w: partition file: implausible header (count %d, block size %d)", ErrCorrupt, count, p.blockSize)
	case nb != uint64(bucketsOf(int(count), int(format))):
		return nil, fmt.Errorf("%w: partition file: %d buckets for %d records", ErrCorrupt, nb, count)
	}
	p.Count, p.Buckets = int(count), int(nb)
	if want := fileSize(p.Count, p.Buckets, p.StoredSize, p.blockSize); int64(len(b)) != want {
		return nil, fmt.Errorf("%w: partition file: size %d, header implies %d (truncated or padded)", ErrCorrupt, len(b), want)
	}
	t := b[len(b)-partTrailerSize:]
	if string(t[12:]) != trailerMagic {
		return nil, fmt.Errorf("%w: partition file: bad trailer magic", ErrCorrupt)
	}
	dirEnd := partHeaderSize + dirBytes(p.Buckets)
	bodyEnd := dirEnd + int64(p.Count)*int64(p.StoredSize)
	nblocks := (bodyEnd + int64(p.blockSize) - 1) / int64(p.blockSize)
	if binary.LittleEndian.Uint64(t[0:]) != uint64(nblocks) {
		return nil, fmt.Errorf("%w: partition file: trailer block count mismatch", ErrCorrupt)
	}
	p.body, p.table = b[:bodyEnd], b[bodyEnd:bodyEnd+4*nblocks]
	if crc32.Checksum(p.table, castagnoli) != binary.LittleEndian.Uint32(t[8:]) {
		return nil, fmt.Errorf("%w: partition file: checksum table corrupt", ErrCorrupt)
	}
	p.Dir = b[partHeaderSize : partHeaderSize+4*(p.Buckets+1)]
	p.KeysOffset = dirEnd
	switch p.Format {
	case splitFormat:
		keysEnd := dirEnd + 8*int64(p.Count)
		p.Keys, p.KeyStride = b[dirEnd:keysEnd], 8
		p.Vals, p.ValStride = b[keysEnd:bodyEnd], p.RecordSize-8
	case quotFormat:
		// Each record's key word is its last 8 bytes.
		p.Keys, p.KeyStride = b[min(dirEnd+int64(p.StoredSize)-8, bodyEnd):bodyEnd], p.StoredSize
		p.Vals, p.ValStride = b[dirEnd:bodyEnd], p.StoredSize
		p.KeyMask = QuotientMask(p.Buckets)
	default:
		p.Keys, p.KeyStride = b[dirEnd:bodyEnd], p.RecordSize
		p.Vals, p.ValStride = b[min(dirEnd+8, bodyEnd):bodyEnd], p.RecordSize
	}
	// A lookup trusts the directory to stay inside the records.
	prev := uint32(0)
	for i := 0; i <= p.Buckets; i++ {
		d := binary.LittleEndian.Uint32(p.Dir[4*i:])
		if d < prev || d > uint32(p.Count) || i == 0 && d != 0 || i == p.Buckets && d != uint32(p.Count) {
			return nil, fmt.Errorf("%w: partition file: directory entry %d is out of order", ErrCorrupt, i)
		}
		prev = d
	}
	return p, nil
}

// ErrNotFinite marks a partition file holding a NaN or infinite
// parameter: the finite gate. (A delta's deletion marker, codec.
// Tombstone, is the one NaN allowed.)
var ErrNotFinite = errors.New("a parameter is not finite")

// minRecordSize is the smallest record a file can hold: fp32 LR with a
// 6-byte quotiented key.
const minRecordSize = 10

// storedSize is the bytes a record of rs (with its whole key) takes in a
// file of format f with nb buckets, or 0 if f cannot hold it (callers
// refuse 0: a header may say 0).
func storedSize(f uint32, rs int, nb uint64) int {
	switch f {
	case partFormat, splitFormat:
		return rs
	case quotFormat:
		if k := QuotientBytes(int(min(nb, 1<<30))); k > 0 {
			return rs - 8 + k
		}
	}
	return 0
}

// finiteCheck checks the records of a partition file as VerifyStream
// reads it, block by block: every value finite, but a tombstone weight.
// It reads units of rs bytes: whole records (formats 2 and 4) or values
// (format 3, keys apart). A unit's value bytes start at voff: after the
// key in format 2, at once in the others. Units may straddle blocks; a
// partial one waits in part.
type finiteCheck struct {
	enc        Encoding
	format     uint32
	width, rs  int
	voff, vlen int
	start, end int64 // the units' byte range in the file
	keys       int64 // format 3: where the keys start in the file
	nb         int
	// r reads the file, for the h of a record whose key is not whole
	// beside its value (formats 3 and 4), to name the feature of a bad
	// value (readKey).
	r    io.ReaderAt
	part []byte
	rec  int // records checked
}

// newFiniteCheck is the check of a file of header h and count records,
// or nil if the header's format, encoding, width, record size and
// buckets disagree (as ParsePartitionStructure refuses them).
func newFiniteCheck(h []byte, count uint64) *finiteCheck {
	c := &finiteCheck{enc: Encoding(binary.LittleEndian.Uint32(h[12:])), format: binary.LittleEndian.Uint32(h[8:]),
		width: int(binary.LittleEndian.Uint32(h[16:])), rs: int(binary.LittleEndian.Uint32(h[36:])),
		nb: int(min(binary.LittleEndian.Uint64(h[40:]), 1<<32))}
	if c.enc > EncInt8 || c.width <= 0 || c.width > 1<<16 {
		return nil
	}
	if want := storedSize(c.format, RecordSize(c.width, c.enc), uint64(c.nb)); want == 0 || c.rs != want {
		return nil
	}
	if count > 1<<32 || c.nb != bucketsOf(int(count), int(c.format)) {
		return nil // the records' place in the file follows from the buckets
	}
	c.vlen = RecordSize(c.width, c.enc) - 8
	c.start = partHeaderSize + dirBytes(c.nb)
	c.end = c.start + int64(count)*int64(c.rs)
	switch c.format {
	case partFormat:
		c.voff = 8 // a unit starts with its key
	case splitFormat:
		c.keys = c.start
		c.start += 8 * int64(count) // the values, past the keys
		c.rs = c.vlen
	}
	c.part = make([]byte, 0, c.rs)
	return c
}

// readKey reads record i's h from the file (c.r), for an error's message
// (formats 3 and 4).
func (c *finiteCheck) readKey(i int) (uint64, bool) {
	r := c.r
	var k [8]byte
	switch c.format {
	case splitFormat:
		_, err := r.ReadAt(k[:], c.keys+8*int64(i))
		return binary.LittleEndian.Uint64(k[:]), err == nil
	case quotFormat:
		// Record i's bucket: the first whose directory entry ends past i.
		var err error
		b := sort.Search(c.nb, func(b int) bool {
			if _, e := r.ReadAt(k[:4], partHeaderSize+4*int64(b+1)); e != nil {
				err = e
			}
			return binary.LittleEndian.Uint32(k[:4]) > uint32(i)
		})
		if _, e := r.ReadAt(k[:], c.start+int64(i+1)*int64(c.rs)-8); e != nil || err != nil || b >= c.nb {
			return 0, false
		}
		return Unquotient(uint64(b), binary.LittleEndian.Uint64(k[:])&QuotientMask(c.nb), c.nb), true
	}
	return 0, false
}

// feed checks the records in blk, the file's bytes from offset lo.
func (c *finiteCheck) feed(lo int64, blk []byte) error {
	hi := lo + int64(len(blk))
	if hi <= c.start || lo >= c.end {
		return nil
	}
	b := blk[max(c.start-lo, 0):min(c.end-lo, int64(len(blk)))]
	if len(c.part) > 0 {
		n := min(c.rs-len(c.part), len(b))
		c.part = append(c.part, b[:n]...)
		b = b[n:]
		if len(c.part) < c.rs {
			return nil
		}
		if err := c.record(c.part); err != nil {
			return err
		}
		c.part = c.part[:0]
	}
	for ; len(b) >= c.rs; b = b[c.rs:] {
		if err := c.record(b[:c.rs]); err != nil {
			return err
		}
	}
	c.part = append(c.part, b...)
	return nil
}

func (c *finiteCheck) record(unit []byte) error {
	defer func() { c.rec++ }()
	rec := unit[c.voff : c.voff+c.vlen] // the value bytes
	bad := func(what string, v float64) error {
		which := fmt.Sprintf("record %d", c.rec)
		if c.voff > 0 {
			which = fmt.Sprintf("record %d (feature id %d)", c.rec, KeyUnhash(binary.LittleEndian.Uint64(unit)))
		} else if h, ok := c.readKey(c.rec); ok {
			which = fmt.Sprintf("record %d (feature id %d)", c.rec, KeyUnhash(h))
		}
		return fmt.Errorf("%w: partition file: %s: %s is %v", ErrNotFinite, which, what, v)
	}
	if w := binary.LittleEndian.Uint32(rec); w != math.Float32bits(Tombstone) && !finite32(w) {
		return bad("the weight", float64(math.Float32frombits(w)))
	}
	switch c.enc {
	case EncFP32:
		for j := 4; j < len(rec); j += 4 {
			if v := binary.LittleEndian.Uint32(rec[j:]); !finite32(v) {
				return bad(fmt.Sprintf("factor %d", (j-4)/4), float64(math.Float32frombits(v)))
			}
		}
	case EncFP16:
		for j := 4; j < len(rec); j += 2 {
			if v := binary.LittleEndian.Uint16(rec[j:]); v&0x7c00 == 0x7c00 {
				return bad(fmt.Sprintf("factor %d (fp16)", (j-4)/2), float64(float16.Frombits(v).Float32()))
			}
		}
	case EncInt8:
		if c.width > 1 {
			if v := binary.LittleEndian.Uint32(rec[4:]); !finite32(v) {
				return bad("the factors' int8 scale", float64(math.Float32frombits(v)))
			}
		}
	}
	return nil
}

// finite32 reports whether float32 bits b are a finite number.
func finite32(b uint32) bool { return b&0x7f800000 != 0x7f800000 }

// VerifyBlocks checks every block checksum using up to workers
// goroutines, and names the first bad block found.
func (p *Partition) VerifyBlocks(workers int) error {
	n := len(p.table) / 4
	workers = max(1, min(workers, n))
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		bad     = math.MaxInt
		nextBlk = make(chan int, n)
	)
	for i := range n {
		nextBlk <- i
	}
	close(nextBlk)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range nextBlk {
				lo := i * p.blockSize
				hi := min(lo+p.blockSize, len(p.body))
				if crc32.Checksum(p.body[lo:hi], castagnoli) != binary.LittleEndian.Uint32(p.table[4*i:]) {
					mu.Lock()
					bad = min(bad, i)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if bad != math.MaxInt {
		lo := bad * p.blockSize
		return fmt.Errorf("%w: partition file: checksum mismatch in block %d (bytes %d–%d)", ErrCorrupt, bad, lo, min(lo+p.blockSize, len(p.body)))
	}
	return nil
}

// VerifyStream checks a whole partition file read from r — header,
// trailer, every block checksum — with O(block) memory, and returns the
// file's SHA-256 (hex). It builds no table: it is for validation gates
// that must not hold a model in memory. It reads every byte of the file
// and hashes each range as it read it last: loader.MapPartitionCopy
// relies on this to copy a file through it.
func VerifyStream(r io.ReaderAt, size int64) (string, error) {
	if size < partHeaderSize+partTrailerSize {
		return "", fmt.Errorf("%w: partition file: %d bytes is shorter than header and trailer", ErrCorrupt, size)
	}
	var h [partHeaderSize]byte
	var t [partTrailerSize]byte
	if _, err := r.ReadAt(h[:], 0); err != nil {
		return "", fmt.Errorf("codec: reading header: %w", err)
	}
	if _, err := r.ReadAt(t[:], size-partTrailerSize); err != nil {
		return "", fmt.Errorf("codec: reading trailer: %w", err)
	}
	// The header and trailer alone decide the layout; parse them as a
	// file of the right size whose middle is not yet read.
	count := binary.LittleEndian.Uint64(h[24:])
	bs := int64(binary.LittleEndian.Uint32(h[32:]))
	nblocks := int64(binary.LittleEndian.Uint64(t[0:]))
	if string(h[:8]) != partMagic || crc32.Checksum(h[:60], castagnoli) != binary.LittleEndian.Uint32(h[60:]) ||
		string(t[12:]) != trailerMagic || bs < 4096 || bs > maxBlockSize || nblocks <= 0 || nblocks > size/bs+1 || count > uint64(size)/minRecordSize {
		return "", fmt.Errorf("%w: partition file: bad header or trailer", ErrCorrupt)
	}
	body := size - partTrailerSize - 4*nblocks
	if body <= 0 || (body+bs-1)/bs != nblocks {
		return "", fmt.Errorf("%w: partition file: size %d disagrees with %d checksum blocks", ErrCorrupt, size, nblocks)
	}
	table := make([]byte, 4*nblocks)
	if _, err := r.ReadAt(table, body); err != nil {
		return "", fmt.Errorf("codec: reading checksum table: %w", err)
	}
	if crc32.Checksum(table, castagnoli) != binary.LittleEndian.Uint32(t[8:]) {
		return "", fmt.Errorf("%w: partition file: checksum table corrupt", ErrCorrupt)
	}
	fin := newFiniteCheck(h[:], count)
	if fin == nil {
		return "", fmt.Errorf("%w: partition file: the header's format, encoding, width, record size and buckets disagree", ErrCorrupt)
	}
	if want := fileSize(int(count), fin.nb, int(binary.LittleEndian.Uint32(h[36:])), int(bs)); size != want {
		return "", fmt.Errorf("%w: partition file: size %d, header implies %d (truncated or padded)", ErrCorrupt, size, want)
	}
	fin.r = r
	sha := sha256.New()
	buf := make([]byte, min(bs, body)) // a small file's, not a block's: a delta of a thousand files must not zero a block each
	for i := int64(0); i < nblocks; i++ {
		lo := i * bs
		blk := buf[:min(bs, body-lo)]
		if _, err := r.ReadAt(blk, lo); err != nil {
			return "", fmt.Errorf("codec: reading block %d: %w", i, err)
		}
		if crc32.Checksum(blk, castagnoli) != binary.LittleEndian.Uint32(table[4*i:]) {
			return "", fmt.Errorf("%w: partition file: checksum mismatch in block %d (bytes %d–%d)", ErrCorrupt, i, lo, lo+int64(len(blk)))
		}
		if err := fin.feed(lo, blk); err != nil {
			return "", err
		}
		sha.Write(blk)
	}
	sha.Write(table)
	sha.Write(t[:])
	// The structure past the header is checked when the file is loaded.
	return hex.EncodeToString(sha.Sum(nil)), nil
}
