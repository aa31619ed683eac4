package codec

import (
	"encoding/binary"
	"fmt"
)

// An extra-file request asks a shard for an extra file of a version it
// holds (a dense part); the answer is the file's bytes:
//
//	byte     magic 0xC7
//	byte     format version (1)
//	varint   model version
//	varint   name length, name bytes (at most 128)
//	varint   role length, role bytes (at most 32)
const magicExtra = 0xC7

// AppendExtraRequest appends an encoded extra-file request.
func AppendExtraRequest(dst []byte, model string, version uint64, role string) []byte {
	dst = append(dst, magicExtra, wireVersion)
	dst = binary.AppendUvarint(dst, version)
	dst = binary.AppendUvarint(dst, uint64(len(model)))
	dst = append(dst, model...)
	dst = binary.AppendUvarint(dst, uint64(len(role)))
	return append(dst, role...)
}

// ParseExtraRequest decodes an extra-file request.
func ParseExtraRequest(b []byte) (model string, version uint64, role string, err error) {
	if len(b) < 2 || b[0] != magicExtra || b[1] != wireVersion {
		return "", 0, "", fmt.Errorf("%w: extra-file request: bad magic or format version", ErrCorrupt)
	}
	d := decoder{b: b[2:]}
	version = d.uvarint()
	model = d.str(128)
	role = d.str(32)
	switch {
	case d.err != nil:
		return "", 0, "", fmt.Errorf("%w: extra-file request: %v", ErrCorrupt, d.err)
	case len(d.b) != 0:
		return "", 0, "", d.fail("extra-file request: trailing bytes")
	case len(b) != len(AppendExtraRequest(nil, model, version, role)):
		return "", 0, "", d.fail("extra-file request: a number in a longer form than it needs")
	}
	return model, version, role, nil
}

// str reads a length-prefixed string of at most max bytes.
func (d *decoder) str(max int) string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > uint64(max) || n > uint64(len(d.b)) {
		d.err = fmt.Errorf("a string of %d bytes (at most %d, %d left)", n, max, len(d.b))
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
