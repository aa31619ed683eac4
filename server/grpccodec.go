package server

import (
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// A ModelInferRequest message can cost far more decoded than on the wire:
// an id as a 1-byte varint becomes an 8-byte int64, an input of a few
// bytes a struct of a hundred, and gRPC may have inflated the message from
// gzip. So before decoding one, the front counts what decoding would
// allocate, field by field, walking the wire format (protowire), and
// refuses a message that carries more than the request limits allow. The
// walk costs a pass over the bytes and allocates nothing.

// receivedMessage is what the front asks gRPC to decode a
// ModelInferRequest into (receive): the codec keeps the message's bytes
// as they arrived, and decode counts and decodes them later, once the
// request has a slot, so that a request refused after it arrived costs
// no decoding.
type receivedMessage struct {
	raw mem.BufferSlice
}

// size is the message's length in bytes.
func (m *receivedMessage) size() int { return m.raw.Len() }

// free gives the message's buffers back to gRPC's pool; the message is
// empty after it.
func (m *receivedMessage) free() {
	m.raw.Free()
	m.raw = nil
}

// requestCodec is the front's gRPC codec: protobuf (grpc's own codec),
// but a receivedMessage is kept as bytes, to be decoded by decode.
type requestCodec struct {
	encoding.CodecV2
	lim         bodyLimits
	maxElements int
}

func newRequestCodec(lim bodyLimits) requestCodec {
	// The elements the limits allow, and room for the structure around
	// them: names, shapes, parameters.
	return requestCodec{CodecV2: encoding.GetCodecV2(grpcproto.Name), lim: lim, maxElements: lim.total() + 4096}
}

func (c requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*receivedMessage)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	data.Ref() // gRPC frees its reference when this returns
	m.raw = data
	return nil
}

// decode decodes a received message, counting what decoding would
// allocate first and refusing a message that carries more than the
// limits allow, and frees it.
func (c requestCodec) decode(m *receivedMessage) (*kservepb.ModelInferRequest, error) {
	buf := m.raw.MaterializeToBuffer(mem.DefaultBufferPool())
	m.free()
	defer buf.Free()
	b := buf.ReadOnlyData()
	s := protoScan{max: c.maxElements}
	if s.message(b, msgRequest); s.n > s.max {
		return nil, badInput("the request message carries more than %d elements and fields: over what %d ids and %d rows need", s.max, c.lim.maxIDs, c.lim.maxRows)
	}
	req := new(kservepb.ModelInferRequest)
	if err := proto.Unmarshal(b, req); err != nil {
		return nil, badInput("the request message is not a ModelInferRequest: %v", err)
	}
	return req, nil
}

// The messages of a ModelInferRequest, and how each field of theirs is
// counted: a sub-message is walked, a packed field counted by elements,
// anything else counts one.
type msgKind uint8

const (
	msgRequest msgKind = iota
	msgInput
	msgOutput
	msgContents
	packedVarint
	packedFixed32
	packedFixed64
	opaque
)

var protoSchema = map[msgKind]map[protowire.Number]msgKind{
	msgRequest:  {5: msgInput, 6: msgOutput},
	msgInput:    {3: packedVarint, 5: msgContents},
	msgOutput:   {},
	msgContents: {1: packedVarint, 2: packedVarint, 3: packedVarint, 4: packedVarint, 5: packedVarint, 6: packedFixed32, 7: packedFixed64},
}

// protoScan counts fields and packed elements, stopping once past max. A
// malformed message ends the walk early: proto.Unmarshal then says what
// is wrong with it.
type protoScan struct{ n, max int }

func (s *protoScan) message(b []byte, kind msgKind) {
	for len(b) > 0 && s.n <= s.max {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return
		}
		b = b[n:]
		s.n++
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return
		}
		b = b[n:]
		sub, ok := protoSchema[kind][num]
		if !ok {
			sub = opaque
		}
		switch sub {
		case packedVarint:
			for _, c := range v {
				if c < 0x80 {
					s.n++
				}
			}
		case packedFixed32:
			s.n += len(v) / 4
		case packedFixed64:
			s.n += len(v) / 8
		case msgInput, msgOutput, msgContents:
			s.message(v, sub)
		}
	}
}
