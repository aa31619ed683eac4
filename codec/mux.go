package codec

import (
	"encoding/binary"
	"errors"
)

// A multiplexed lookup stream carries many lookups between a router and
// a shard over one long-lived gRPC stream, so that a call costs a
// message each way rather than a whole RPC (its headers, trailers and
// stream set-up, about 150 allocations on the two sides together). Each
// message is one of:
//
//	call   (router → shard): kind u8 | id u64 | timeout i64 | body
//	reply  (shard → router): id u64 | code u8 | body
//
// little-endian. A call's kind is MuxLookup, with a lookup request as its
// body and the time it has left in nanoseconds (0: no deadline but the
// stream's; relative, so the two ends' clocks need not agree),
// or MuxCancel, with no body: the router gave up on call id. A reply's
// code is a gRPC status code: 0 with a lookup response as its body,
// otherwise the error's message.

// Mux call kinds.
const (
	MuxLookup byte = 1
	MuxCancel byte = 2
)

const (
	muxCallHeader  = 17
	muxReplyHeader = 9
	// MaxMuxMessage bounds an error reply's message.
	MaxMuxMessage = 4 << 10
)

// ErrMux reports a malformed stream message.
var ErrMux = errors.New("codec: malformed lookup stream message")

// AppendMuxCall appends a call message to dst.
func AppendMuxCall(dst []byte, kind byte, id uint64, timeout int64, body []byte) []byte {
	dst = append(dst, kind)
	dst = binary.LittleEndian.AppendUint64(dst, id)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(timeout))
	return append(dst, body...)
}

// ParseMuxCall reads a call message; body aliases b.
func ParseMuxCall(b []byte) (kind byte, id uint64, timeout int64, body []byte, err error) {
	if len(b) < muxCallHeader {
		return 0, 0, 0, nil, ErrMux
	}
	kind, id, timeout, body = b[0], binary.LittleEndian.Uint64(b[1:]), int64(binary.LittleEndian.Uint64(b[9:])), b[muxCallHeader:]
	switch {
	case kind != MuxLookup && kind != MuxCancel:
		return 0, 0, 0, nil, ErrMux
	case kind == MuxCancel && len(body) != 0:
		return 0, 0, 0, nil, ErrMux
	case timeout < 0:
		return 0, 0, 0, nil, ErrMux
	}
	return kind, id, timeout, body, nil
}

// AppendMuxReply appends a reply message to dst.
func AppendMuxReply(dst []byte, id uint64, code uint8, body []byte) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, id)
	dst = append(dst, code)
	return append(dst, body...)
}

// ParseMuxReply reads a reply message; body aliases b. A code past the
// last gRPC code, or an error message over MaxMuxMessage, is malformed.
func ParseMuxReply(b []byte) (id uint64, code uint8, body []byte, err error) {
	if len(b) < muxReplyHeader {
		return 0, 0, nil, ErrMux
	}
	id, code, body = binary.LittleEndian.Uint64(b), b[8], b[muxReplyHeader:]
	if code > 16 || (code != 0 && len(body) > MaxMuxMessage) {
		return 0, 0, nil, ErrMux
	}
	return id, code, body, nil
}
