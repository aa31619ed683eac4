package server

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"sync"

	"google.golang.org/grpc/credentials"
)

// gRPC gives a handler nothing of a message until it has arrived whole,
// and grpc-go reads a message into memory as its DATA frames come (its
// flow-control windows grow with the connection's bandwidth), so the
// bytes of a half-sent message are held where the handler cannot count
// them. The front counts them below grpc-go instead: each gRPC
// connection, once its TLS handshake (if any) is done, is read through
// h2watch, which follows the HTTP/2 frames going by without changing a
// byte. A DATA frame's payload is charged in reception
// (reception.go), to the connection's client address, as it arrives;
// the stream's charge is given back when the client ends its message
// (END_STREAM: grpc-go then hands it to the handler, which counts it
// whole) or the stream ends (RST_STREAM either way, or the server's
// trailers: the handler gave up on it, say at its receive time). A frame
// that would take reception past its bounds closes the connection: its
// bytes are not read, and grpc-go frees what the connection's streams
// hold. So a stalled half-sent message holds only what its bytes weigh,
// within MaxReceivingBytes and MaxReceivingPerPeer, until its receive
// time ends it.

// HTTP/2 frame types and flags followed (RFC 9113, section 6).
const (
	h2Data         = 0x0
	h2Headers      = 0x1
	h2RSTStream    = 0x3
	h2FlagEndStrm  = 0x1
	h2FrameHeader  = 9
	h2ClientPrface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
)

// errReceivingConn closes a connection whose DATA would take reception
// past a bound.
var errReceivingConn = errors.New("server: the connection's messages in reception are over the bytes the server allows; closed")

// h2frames follows a stream of HTTP/2 frames fed in pieces of any size.
type h2frames struct {
	preface int // bytes of the client preface still to skip
	hdr     [h2FrameHeader]byte
	have    int    // bytes of hdr gathered
	left    int    // payload bytes of the current frame to come
	typ     byte   // the current frame's type
	flags   byte   // and flags
	stream  uint32 // and stream
}

// feed walks b: header(typ, flags, stream, length) when a frame's header
// is whole, payload(stream, n) for each run of a DATA frame's payload,
// and end(typ, flags, stream) when a frame is over. It stops at the first
// error one returns.
func (f *h2frames) feed(b []byte, header func(typ, flags byte, stream uint32, length int) error,
	payload func(stream uint32, n int) error, end func(typ, flags byte, stream uint32) error) error {
	if f.preface > 0 {
		k := min(f.preface, len(b))
		f.preface -= k
		b = b[k:]
	}
	for len(b) > 0 {
		if f.have < h2FrameHeader {
			k := copy(f.hdr[f.have:], b)
			f.have += k
			b = b[k:]
			if f.have < h2FrameHeader {
				return nil
			}
			f.left = int(f.hdr[0])<<16 | int(f.hdr[1])<<8 | int(f.hdr[2])
			f.typ, f.flags = f.hdr[3], f.hdr[4]
			f.stream = binary.BigEndian.Uint32(f.hdr[5:]) & 0x7fffffff
			if err := header(f.typ, f.flags, f.stream, f.left); err != nil {
				return err
			}
		}
		k := min(f.left, len(b))
		if k > 0 && f.typ == h2Data {
			if err := payload(f.stream, k); err != nil {
				return err
			}
		}
		f.left -= k
		b = b[k:]
		if f.left == 0 {
			f.have = 0
			if err := end(f.typ, f.flags, f.stream); err != nil {
				return err
			}
		}
	}
	return nil
}

// h2watch is a gRPC connection read through h2frames, its streams'
// message bytes charged in reception.
type h2watch struct {
	net.Conn
	x      *receiving // the connection's share of reception
	closed func()     // counts a connection closed over a bound
	in     h2frames   // read by the reader only
	out    h2frames   // read by the writer only
	mu     sync.Mutex
	open   map[uint32]int64 // streams whose message is arriving: bytes charged
	err    error            // once over a bound: every read fails
}

func (r *reception) watch(c net.Conn, closed func()) *h2watch {
	return &h2watch{Conn: c, x: &receiving{r: r, peer: peerHost(c.RemoteAddr().String())}, closed: closed,
		in: h2frames{preface: len(h2ClientPrface)}, open: map[uint32]int64{}}
}

func (w *h2watch) Read(p []byte) (int, error) {
	w.mu.Lock()
	err := w.err
	w.mu.Unlock()
	if err != nil {
		return 0, err
	}
	n, rerr := w.Conn.Read(p)
	w.mu.Lock()
	err = w.in.feed(p[:n], w.inHeader, w.inData, w.inEnd)
	if err != nil {
		w.err = err
		w.releaseAll()
	}
	w.mu.Unlock()
	if err != nil {
		w.closed()
		slog.Warn("server: closed a gRPC connection: its messages in reception are over a bound", "from", w.RemoteAddr().String(), "reason", err.Error())
		w.Conn.Close()
		return 0, err
	}
	return n, rerr
}

// Called with w.mu held, as are the other frame handlers.
func (w *h2watch) inHeader(typ, flags byte, stream uint32, _ int) error {
	switch typ {
	case h2Headers:
		if _, ok := w.open[stream]; !ok && flags&h2FlagEndStrm == 0 && stream%2 == 1 {
			w.open[stream] = 0
		}
	case h2RSTStream:
		w.release(stream)
	}
	return nil
}

func (w *h2watch) inData(stream uint32, n int) error {
	held, ok := w.open[stream]
	if !ok {
		return nil // a stream ended, or never opened: grpc-go drops it
	}
	if err := w.x.take(int64(n)); err != nil {
		return errReceivingConn
	}
	w.open[stream] = held + int64(n)
	return nil
}

func (w *h2watch) inEnd(typ, flags byte, stream uint32) error {
	if typ == h2Data && flags&h2FlagEndStrm != 0 {
		w.release(stream) // whole: the handler counts it now
	}
	return nil
}

// release gives back what stream's message was charged.
func (w *h2watch) release(stream uint32) {
	if held, ok := w.open[stream]; ok {
		delete(w.open, stream)
		w.x.give(held)
	}
}

func (w *h2watch) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.out.feed(p, func(typ, flags byte, stream uint32, _ int) error {
		// The server ends a stream: its trailers, or RST_STREAM (a
		// stream refused, one cancelled).
		if typ == h2Headers && flags&h2FlagEndStrm != 0 || typ == h2RSTStream {
			w.release(stream)
		}
		return nil
	}, func(uint32, int) error { return nil }, func(byte, byte, uint32) error { return nil })
	w.mu.Unlock()
	return w.Conn.Write(p)
}

func (w *h2watch) Close() error {
	w.mu.Lock()
	w.releaseAll()
	w.mu.Unlock()
	return w.Conn.Close()
}

func (w *h2watch) releaseAll() {
	for s := range w.open {
		w.release(s)
	}
}

// watchCreds wraps a gRPC server's transport credentials (TLS, or
// plaintext) so that each connection, once established, is an h2watch.
type watchCreds struct {
	credentials.TransportCredentials
	r      *reception
	closed func()
}

func (c watchCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		return out, info, err
	}
	return c.r.watch(out, c.closed), info, nil
}

func (c watchCreds) Clone() credentials.TransportCredentials {
	return watchCreds{TransportCredentials: c.TransportCredentials.Clone(), r: c.r, closed: c.closed}
}
