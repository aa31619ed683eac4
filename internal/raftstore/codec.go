package raftstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
)

// An entry's value (its index is the key):
//
//	version     1 byte, entryVersion
//	term        uvarint
//	type        1 byte (raft.LogType)
//	appended    1 byte: 0 for the zero time, else 1 and
//	            varint Unix seconds, uvarint nanoseconds (< 1e9)
//	data        uvarint length, bytes
//	extensions  uvarint length, bytes
//
// and nothing after.
const entryVersion = 1

// appendLog appends l's encoding to b.
func appendLog(b []byte, l *raft.Log) []byte {
	b = append(b, entryVersion)
	b = binary.AppendUvarint(b, l.Term)
	b = append(b, byte(l.Type))
	if l.AppendedAt.IsZero() {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		b = binary.AppendVarint(b, l.AppendedAt.Unix())
		b = binary.AppendUvarint(b, uint64(l.AppendedAt.Nanosecond()))
	}
	b = binary.AppendUvarint(b, uint64(len(l.Data)))
	b = append(b, l.Data...)
	b = binary.AppendUvarint(b, uint64(len(l.Extensions)))
	return append(b, l.Extensions...)
}

var errShort = errors.New("truncated")

// decodeLog decodes an entry's value into l (all but its index). Data
// and Extensions are copies: v may be reused once it returns.
func decodeLog(v []byte, l *raft.Log) error {
	if len(v) == 0 {
		return errors.New("empty entry")
	}
	if v[0] != entryVersion {
		return fmt.Errorf("entry format %d, want %d", v[0], entryVersion)
	}
	d := decoder{b: v[1:]}
	term := d.uvarint()
	typ := d.byte()
	var at time.Time
	switch d.byte() {
	case 0:
	case 1:
		sec, nsec := d.varint(), d.uvarint()
		if nsec >= 1e9 {
			return fmt.Errorf("appended at: %d nanoseconds past a second", nsec)
		}
		at = time.Unix(sec, int64(nsec))
	default:
		if d.err == nil {
			return errors.New("appended at: bad marker")
		}
	}
	data := d.bytes()
	ext := d.bytes()
	if d.err != nil {
		return d.err
	}
	if len(d.b) != 0 {
		return fmt.Errorf("%d bytes after the entry", len(d.b))
	}
	*l = raft.Log{Term: term, Type: raft.LogType(typ), AppendedAt: at}
	// One copy for both byte fields.
	if len(data)+len(ext) > 0 {
		own := append(append(make([]byte, 0, len(data)+len(ext)), data...), ext...)
		if len(data) > 0 {
			l.Data = own[:len(data):len(data)]
		}
		if len(ext) > 0 {
			l.Extensions = own[len(data):]
		}
	}
	return nil
}

// decoder reads fields from b; the first failure sticks in err.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	x, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errShort
		return 0
	}
	d.b = d.b[n:]
	return x
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	x, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errShort
		return 0
	}
	d.b = d.b[n:]
	return x
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.err = errShort
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

// bytes is a length-prefixed field, a view of b.
func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = fmt.Errorf("a field of %d bytes with %d left", n, len(d.b))
		return nil
	}
	f := d.b[:n]
	d.b = d.b[n:]
	return f
}
