package codec

import (
	"fmt"
	"math/bits"
	"sync"
	"unsafe"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
)

// GRPCCodecName is the gRPC content-subtype under which Cumulus frames
// travel: calls made with grpc.CallContentSubtype(GRPCCodecName) carry
// Frame bytes as they are, without protobuf.
const GRPCCodecName = "cumulus"

// Frame is an encoded Cumulus message (a lookup request or response).
type Frame []byte

// PooledFrame is a Frame built in a buffer from GetFrameBuffer: sent
// through gRPC, its buffer goes back to the pool once the transport has
// written it (not when SendMsg returns: the transport writes later), so
// a shard's large lookup responses reuse memory rather than allocate,
// zero and collect megabytes a request. Nothing may keep the message
// past that: not grpc.EnableTracing (it formats messages later), not a
// stats handler holding OutPayload.Payload. Cumulus uses neither.
type PooledFrame struct{ B []byte }

type grpcCodec struct{}

func (grpcCodec) Name() string { return GRPCCodecName }

func (grpcCodec) Marshal(v any) (mem.BufferSlice, error) {
	switch f := v.(type) {
	case *Frame:
		return mem.BufferSlice{mem.SliceBuffer(*f)}, nil
	case *PooledFrame:
		b := f.B
		return mem.BufferSlice{mem.NewBuffer(&b, framePool)}, nil
	}
	return nil, fmt.Errorf("codec: grpc: cannot marshal %T, want *codec.Frame", v)
}

// Unmarshal copies the message into one buffer of its own (gRPC frees
// data's when Unmarshal returns), from the pool: whoever is done with it
// may give it back (PutFrameBuffer).
func (grpcCodec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*Frame)
	if !ok {
		return fmt.Errorf("codec: grpc: cannot unmarshal into %T, want *codec.Frame", v)
	}
	b := framePool.get(data.Len())
	data.CopyTo(b)
	*f = b
	return nil
}

func init() { encoding.RegisterCodecV2(grpcCodec{}) }

// Pooled frame buffers come in powers of two from 1 KiB (gRPC pools
// nothing smaller) to 64 MiB (larger ones are not kept).
const (
	minFrameClass = 10
	maxFrameClass = 26
)

// frameBuffers is a sync.Pool per size class: buffers of class c have a
// capacity of at least 1<<c bytes. Each is made frameSlack bytes larger,
// a margin: a part of one given back from a few bytes in (which
// PutFrameBuffer's callers must not do; PutReplyBody steps back over a
// reply's header) still files in its class.
type frameBuffers [maxFrameClass + 1]sync.Pool

var framePool = new(frameBuffers)

const frameSlack = 64

// FramePool is the pool of GetFrameBuffer as a gRPC buffer pool, for the
// shards' and routers' transports (experimental.BufferPool,
// experimental.WithBufferPool): what they read into is pooled with the
// frames, and not zeroed (gRPC's default pool clears each buffer it hands
// out; every byte of one is read into before it is used).
var FramePool mem.BufferPool = framePool

// GetFrameBuffer returns an empty buffer of at least n bytes' capacity
// (64 KiB at least), for a PooledFrame. Its bytes are not zeroed.
func GetFrameBuffer(n int) []byte {
	return framePool.get(max(n, 64<<10))[:0]
}

// PutFrameBuffer gives b back to the pool once nothing uses any of its
// bytes: a frame received (Unmarshal), a GetFrameBuffer's. b must start
// where the buffer does: a buffer given back from a few bytes in is
// handed out from there, and would shrink with each use.
func PutFrameBuffer(b []byte) { framePool.Put(&b) }

// PutReplyBody is PutFrameBuffer for the body of a lookup stream's reply
// (ParseMuxReply's) received into a buffer of the pool: the whole frame,
// header included, goes back. Only such a body may be given.
func PutReplyBody(body []byte) {
	if cap(body) < 1<<minFrameClass {
		return // not from the pool (and, empty, no address to step back from)
	}
	frame := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(body)), -muxReplyHeader)), cap(body)+muxReplyHeader)
	PutFrameBuffer(frame[:0])
}

// get returns a buffer of length n.
func (p *frameBuffers) get(n int) []byte {
	c := bits.Len(uint(n - 1)) // the class whose buffers all hold n
	if c < minFrameClass || c > maxFrameClass {
		return make([]byte, n)
	}
	if b, _ := p[c].Get().(*[]byte); b != nil {
		return (*b)[:n]
	}
	return make([]byte, n, 1<<c+frameSlack)
}

// Get implements mem.BufferPool.
func (p *frameBuffers) Get(n int) *[]byte {
	b := p.get(n)
	return &b
}

// Put implements mem.BufferPool: b goes to the largest class its
// capacity fills.
func (p *frameBuffers) Put(b *[]byte) {
	c := bits.Len(uint(cap(*b))) - 1
	if c < minFrameClass || cap(*b) > 1<<maxFrameClass+frameSlack {
		return
	}
	p[c].Put(b)
}
