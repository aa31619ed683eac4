package codec

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"unsafe"

	"github.com/cumulus-serving/cumulus/internal/vec"
)

// Lookup request, router → shard. Integers are unsigned LEB128 varints
// unless noted.
//
//	byte     magic 0xC5
//	byte     format version: 1, or 2 followed by
//	byte       flags: bit 0 (FlagStored) answers with records as stored
//	           (a format 2 response); no other bit is defined
//	varint   model name length, then the name's bytes
//	varint   model version (the version the router pinned for this request)
//	varint   section count
//	section* partition, key count n, key encoding, keys:
//	           encoding 0 (KeysFixed): n × uint64 little-endian
//	           encoding 1 (KeysDelta): n × zigzag varint of key[i]-key[i-1]
//	           (key[-1] = 0, wrapping arithmetic)
//
// The encoder chooses per section whichever encoding is smaller: sorted or
// dense ids shrink to 1–3 bytes a key as deltas, while hashed 64-bit ids in
// arbitrary order stay at 8.
const (
	magicRequest  = 0xC5
	magicResponse = 0xC6
	wireVersion   = 1
	// storedVersion is the format of requests with flags and of
	// responses that carry records as stored.
	storedVersion = 2

	KeysFixed = 0
	KeysDelta = 1

	// FlagStored asks a shard for records as stored (fp16 and int8
	// factors as their bytes) rather than as float32s.
	FlagStored = 1
)

// Section is the keys of one partition in a lookup request.
type Section struct {
	Partition uint32
	Keys      []uint64
}

// AppendLookupRequest appends the encoded request to dst: format 1,
// which every shard reads, answered with float32 values.
func AppendLookupRequest(dst []byte, model string, version uint64, sections []Section) []byte {
	return appendSections(append(dst, magicRequest, wireVersion), model, version, sections)
}

// AppendStoredLookupRequest appends a request for records as stored
// (format 2, FlagStored): only shards that offer the version's encoding
// in their registration read it.
func AppendStoredLookupRequest(dst []byte, model string, version uint64, sections []Section) []byte {
	return appendSections(append(dst, magicRequest, storedVersion, FlagStored), model, version, sections)
}

func appendSections(dst []byte, model string, version uint64, sections []Section) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(model)))
	dst = append(dst, model...)
	dst = binary.AppendUvarint(dst, version)
	dst = binary.AppendUvarint(dst, uint64(len(sections)))
	for _, s := range sections {
		dst = binary.AppendUvarint(dst, uint64(s.Partition))
		dst = binary.AppendUvarint(dst, uint64(len(s.Keys)))
		if deltaSize(s.Keys) < 8*len(s.Keys) {
			dst = append(dst, KeysDelta)
			prev := uint64(0)
			for _, k := range s.Keys {
				dst = binary.AppendUvarint(dst, zigzag(k-prev))
				prev = k
			}
		} else {
			dst = append(dst, KeysFixed)
			for _, k := range s.Keys {
				dst = binary.LittleEndian.AppendUint64(dst, k)
			}
		}
	}
	return dst
}

func zigzag(d uint64) uint64   { return d<<1 ^ uint64(int64(d)>>63) }
func unzigzag(z uint64) uint64 { return z>>1 ^ -(z & 1) }

// uvarintLen is the encoded size of x: 1 byte per 7 significant bits.
func uvarintLen(x uint64) int { return (bits.Len64(x|1) + 6) / 7 }

func deltaSize(keys []uint64) int {
	n, prev := 0, uint64(0)
	for _, k := range keys {
		n += uvarintLen(zigzag(k - prev))
		prev = k
	}
	return n
}

// LookupRequest is a decoded request. Decoding reuses its slices; Model
// and the keys alias nothing of the input, but Model is only valid until
// the next Decode.
type LookupRequest struct {
	Model    []byte
	Version  uint64
	Stored   bool // answer with records as stored (FlagStored)
	Sections []Section
	keys     []uint64 // backing store for every section's Keys
}

// NumKeys is the total number of keys across sections.
func (r *LookupRequest) NumKeys() int { return len(r.keys) }

// Decode parses b into r, reusing r's buffers. Every count is checked
// against the bytes left before anything is allocated, so a hostile
// length cannot make the decoder allocate more than ~8× len(b).
func (r *LookupRequest) Decode(b []byte) error {
	d := decoder{b: b}
	if len(b) < 2 || b[0] != magicRequest {
		return fmt.Errorf("%w: lookup request: bad magic", ErrCorrupt)
	}
	r.Stored = false
	switch b[1] {
	case wireVersion:
		d.b = b[2:]
	case storedVersion:
		if len(b) < 3 || b[2]&^FlagStored != 0 {
			return fmt.Errorf("%w: lookup request: missing or unknown flags", ErrCorrupt)
		}
		r.Stored = b[2]&FlagStored != 0
		d.b = b[3:]
	default:
		return fmt.Errorf("%w: lookup request: unsupported format version %d", ErrCorrupt, b[1])
	}
	nameLen := d.uvarint()
	if nameLen > uint64(len(d.b)) {
		return d.fail("lookup request: model name longer than message")
	}
	r.Model = append(r.Model[:0], d.b[:nameLen]...)
	d.b = d.b[nameLen:]
	r.Version = d.uvarint()
	nsec := d.uvarint()
	// A section takes at least 3 bytes.
	if d.err != nil || nsec > uint64(len(d.b))/3 {
		return d.fail("lookup request: section count exceeds message")
	}
	r.Sections = r.Sections[:0]
	r.keys = r.keys[:0]
	for i := uint64(0); i < nsec; i++ {
		part := d.uvarint()
		n := d.uvarint()
		if d.err != nil || part > math.MaxUint32 {
			return d.fail("lookup request: bad section header")
		}
		if len(d.b) < 1 {
			return d.fail("lookup request: truncated section")
		}
		enc := d.b[0]
		d.b = d.b[1:]
		start := len(r.keys)
		switch enc {
		case KeysFixed:
			if n > uint64(len(d.b))/8 {
				return d.fail("lookup request: key count exceeds message")
			}
			for j := uint64(0); j < n; j++ {
				r.keys = append(r.keys, binary.LittleEndian.Uint64(d.b[8*j:]))
			}
			d.b = d.b[8*n:]
		case KeysDelta:
			if n > uint64(len(d.b)) {
				return d.fail("lookup request: key count exceeds message")
			}
			prev := uint64(0)
			for j := uint64(0); j < n; j++ {
				prev += unzigzag(d.uvarint())
				r.keys = append(r.keys, prev)
			}
			if d.err != nil {
				return d.fail("lookup request: truncated keys")
			}
		default:
			return d.fail(fmt.Sprintf("lookup request: unknown key encoding %d", enc))
		}
		// Keys is re-pointed below once r.keys stops growing (it may move).
		r.Sections = append(r.Sections, Section{Partition: uint32(part), Keys: r.keys[start:len(r.keys):len(r.keys)]})
	}
	if len(d.b) != 0 {
		return d.fail("lookup request: trailing bytes")
	}
	off := 0
	for i := range r.Sections {
		n := len(r.Sections[i].Keys)
		r.Sections[i].Keys = r.keys[off : off+n : off+n]
		off += n
	}
	return nil
}

// Lookup response, shard → router, answering keys in request order:
//
//	byte     magic 0xC6
//	byte     format version: 1 (values as float32s), or 2 (records as
//	         stored), which a shard sends only when asked (FlagStored)
//	varint   key count n
//	varint   width w (values per key)
//	byte     format 2 only: the records' encoding (0 fp32, 1 fp16, 2 int8)
//	ceil(n/8) bytes  presence bitmap, bit i (LSB first) set if key i was found
//	format 1: (found keys) × w × float32 little-endian
//	format 2: (found keys) × the record as the partition file stores it
//	          less its 8-byte key: RecordSize(w, encoding) − 8 bytes
//
// Absent keys cost one bit; a present key costs its values and nothing
// else. Format 2 sends fp16 and int8 records at half and a quarter of
// their float32 bytes, copied by the shard without conversion; the router
// decodes them (internal/vec) exactly as a shard would.

// AppendLookupResponse appends an encoded response. found is a bitmap of n
// bits (LSB first, 64 per word); values holds w floats per found key in
// key order.
func AppendLookupResponse(dst []byte, n, w int, found []uint64, values []float32) []byte {
	return AppendLookupResponseRaw(dst, n, w, found, AppendFloat32s(nil, values))
}

// AppendLookupResponseRaw is AppendLookupResponse with the values already
// encoded, little-endian float32s as a record stores fp32 values: a shard
// copies them from its records.
func AppendLookupResponseRaw(dst []byte, n, w int, found []uint64, values []byte) []byte {
	dst, at := StartLookupResponse(dst, n, w)
	dst = append(dst, values...)
	FinishLookupResponse(dst, at, n, found)
	return dst
}

// StartLookupResponse appends a response's header and room for its
// bitmap, and returns where the bitmap is: the caller appends the values
// (little-endian float32s, w per found key) and then fills the bitmap
// with FinishLookupResponse. A shard writes values straight from its
// records into the response this way.
func StartLookupResponse(dst []byte, n, w int) (out []byte, bitmapAt int) {
	dst = append(dst, magicResponse, wireVersion)
	dst = binary.AppendUvarint(dst, uint64(n))
	dst = binary.AppendUvarint(dst, uint64(w))
	at := len(dst)
	return append(dst, make([]byte, (n+7)/8)...), at
}

// StartStoredResponse is StartLookupResponse for a response of records as
// stored in encoding e (format 2): the caller appends each found record
// less its key (RecordSize(w, e) − 8 bytes).
func StartStoredResponse(dst []byte, n, w int, e Encoding) (out []byte, bitmapAt int) {
	dst = append(dst, magicResponse, storedVersion)
	dst = binary.AppendUvarint(dst, uint64(n))
	dst = binary.AppendUvarint(dst, uint64(w))
	dst = append(dst, byte(e))
	at := len(dst)
	return append(dst, make([]byte, (n+7)/8)...), at
}

// FinishLookupResponse writes found, a bitmap of n bits (LSB first, 64
// per word), at b[bitmapAt:].
func FinishLookupResponse(b []byte, bitmapAt, n int, found []uint64) {
	for i := range (n + 7) / 8 {
		b[bitmapAt+i] = byte(found[i/8] >> (8 * (i % 8)))
	}
}

// AppendFloat32s appends v as little-endian float32s.
func AppendFloat32s(dst []byte, v []float32) []byte {
	for _, x := range v {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(x))
	}
	return dst
}

// LookupResponse is a decoded response: views into the decoded buffer.
type LookupResponse struct {
	N, Width int
	Bitmap   []byte   // ceil(N/8) bytes
	Values   []byte   // Found × the record's bytes (Stride)
	Enc      Encoding // how the records are encoded (format 1: fp32)
	Stride   int      // bytes a found key: RecordSize(Width, Enc) − 8
}

// Found reports whether key i was present.
func (r *LookupResponse) Found(i int) bool { return r.Bitmap[i>>3]>>(i&7)&1 == 1 }

// Value returns value j of the k-th found key (convenient, not fast).
func (r *LookupResponse) Value(k, j int) float32 {
	if r.Enc == EncFP32 {
		return math.Float32frombits(binary.LittleEndian.Uint32(r.Values[4*(k*r.Width+j):]))
	}
	v := make([]float32, r.Width)
	r.Record(k, v)
	return v[j]
}

// Record writes the k-th found key's Width values into dst.
func (r *LookupResponse) Record(k int, dst []float32) {
	src := r.Values[k*r.Stride : (k+1)*r.Stride]
	switch r.Enc {
	case EncFP16:
		dst[0] = math.Float32frombits(binary.LittleEndian.Uint32(src))
		vec.FromHalf(dst[1:r.Width], src[4:])
		return
	case EncInt8:
		dst[0] = math.Float32frombits(binary.LittleEndian.Uint32(src))
		if r.Width > 1 {
			vec.FromInt8(dst[1:r.Width], src[8:], math.Float32frombits(binary.LittleEndian.Uint32(src[4:])))
		}
		return
	}
	if littleEndian {
		// The wire's order is the machine's: one copy, bytes to bytes
		// (no alignment assumed).
		copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(dst))), len(src)), src)
		return
	}
	for j := range dst[:r.Width] {
		dst[j] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*j:]))
	}
}

// littleEndian reports whether this machine stores numbers as the wire
// does.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// Decode parses b, checking it answers exactly n keys of width w with
// records in encoding e: the version's encoding if the request asked for
// records as stored, else EncFP32 (float32 values, as format 1 carries
// them). A response in another encoding is refused.
func (r *LookupResponse) Decode(b []byte, n, w int, e Encoding) error {
	if len(b) < 2 || b[0] != magicResponse {
		return fmt.Errorf("%w: lookup response: bad magic", ErrCorrupt)
	}
	if b[1] != wireVersion && b[1] != storedVersion {
		return fmt.Errorf("%w: lookup response: unsupported format version %d", ErrCorrupt, b[1])
	}
	d := decoder{b: b[2:]}
	gotN, gotW := d.uvarint(), d.uvarint()
	if d.err != nil {
		return d.fail("lookup response: truncated header")
	}
	if gotN != uint64(n) || gotW != uint64(w) {
		return fmt.Errorf("%w: lookup response: answers %d keys of width %d, want %d of width %d", ErrCorrupt, gotN, gotW, n, w)
	}
	got := EncFP32
	if b[1] == storedVersion {
		if len(d.b) < 1 {
			return d.fail("lookup response: truncated header")
		}
		got = Encoding(d.b[0])
		d.b = d.b[1:]
	}
	if got != e {
		return fmt.Errorf("%w: lookup response: records encoded %v, the version's are %v", ErrCorrupt, got, e)
	}
	r.Enc, r.Stride = e, RecordSize(w, e)-8 // fp32: 4w, format 1's float32s
	nb := (n + 7) / 8
	if len(d.b) < nb {
		return d.fail("lookup response: truncated bitmap")
	}
	r.N, r.Width, r.Bitmap = n, w, d.b[:nb]
	found := 0
	for _, x := range r.Bitmap {
		found += bits.OnesCount8(x)
	}
	if n%8 != 0 && r.Bitmap[nb-1]>>(n%8) != 0 {
		return d.fail("lookup response: bitmap has bits past the key count")
	}
	if len(d.b)-nb != found*r.Stride {
		return d.fail("lookup response: value bytes do not match found keys")
	}
	r.Values = d.b[nb:]
	return nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = ErrCorrupt
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) fail(msg string) error { return fmt.Errorf("%w: %s", ErrCorrupt, msg) }
