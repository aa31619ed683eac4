package server

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cumulus-serving/cumulus/internal/peerlimit"
	"google.golang.org/grpc/credentials"
)

// gRPC gives a handler nothing of a message until it has arrived whole,
// and grpc-go reads a message into memory as its DATA frames come (its
// flow-control windows grow with the connection's bandwidth), so the
// bytes of a half-sent message are held where the handler cannot count
// them. The front counts them below grpc-go instead: each gRPC
// connection, once its TLS handshake (if any) is done, is read through
// h2watch, which follows the HTTP/2 frames going by without changing a
// byte. A DATA frame's data (its padding left out: grpc-go keeps none)
// is charged in reception (reception.go), to the connection's client
// address, as it arrives; a message's charge is given back once its
// gRPC length prefix's count of bytes is in (grpc-go then hands it to
// the handler, which counts it whole), or when its stream ends
// (END_STREAM, RST_STREAM either way, or the server's trailers: the
// handler gave up on it, at its receive time and the hold after it,
// holdCut), or the connection closes. So a stalled half-sent message
// holds only what its bytes weigh, within MaxReceivingBytes and
// MaxReceivingPerPeer, until it is answered.
//
// A read whose frames take reception past a bound is charged all the
// same (it is in memory already: at most grpc-go's read buffer, 32 KiB,
// a connection), and the connection then waits, unread, until reception
// is back within its bounds: stalled messages elsewhere are answered
// and give theirs back. Its own sender is held to what TCP
// buffers, and the front does no work for it meanwhile. A connection
// still over after the wait (the later of ReceiveTimeout and
// HeaderTimeout, when a stalled message cut off is answered: holdCut;
// and a second) is closed: its bytes are not read further, and grpc-go
// frees what its streams hold.

// HTTP/2 frame types and flags followed (RFC 9113, section 6).
const (
	h2Data         = 0x0
	h2Headers      = 0x1
	h2RSTStream    = 0x3
	h2FlagEndStrm  = 0x1
	h2FlagPadded   = 0x8
	h2FrameHeader  = 9
	h2ClientPrface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
)

// errReceivingConn closes a connection whose DATA kept reception past a
// bound.
var errReceivingConn = errors.New("server: the connection's messages in reception stayed over the bytes the server allows; closed")

// h2frames follows a stream of HTTP/2 frames fed in pieces of any size.
type h2frames struct {
	preface int // bytes of the client preface still to skip
	hdr     [h2FrameHeader]byte
	have    int    // bytes of hdr gathered
	left    int    // payload bytes of the current frame to come
	typ     byte   // the current frame's type
	flags   byte   // and flags
	stream  uint32 // and stream
	// A padded DATA frame's pad length, once read (-1 before), and how
	// many of left are padding.
	padLen int
}

// feed walks b: header(typ, flags, stream, length) when a frame's header
// is whole, payload(stream, data) for each run of a DATA frame's data
// (its padding left out, which grpc-go does not keep), and end(typ,
// flags, stream) when a frame is over. It stops at the first error one
// returns.
func (f *h2frames) feed(b []byte, header func(typ, flags byte, stream uint32, length int) error,
	payload func(stream uint32, data []byte) error, end func(typ, flags byte, stream uint32) error) error {
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
			f.padLen = 0
			if f.typ == h2Data && f.flags&h2FlagPadded != 0 {
				f.padLen = -1
			}
			if err := header(f.typ, f.flags, f.stream, f.left); err != nil {
				return err
			}
		}
		if f.padLen < 0 && f.left > 0 && len(b) > 0 {
			f.padLen = int(b[0])
			f.left--
			b = b[1:]
		}
		k := min(f.left, len(b))
		if data := min(k, f.left-max(f.padLen, 0)); data > 0 && f.typ == h2Data {
			if err := payload(f.stream, b[:data]); err != nil {
				return err
			}
		}
		f.left -= k
		b = b[k:]
		if f.left == 0 && f.padLen >= 0 {
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
	x      *receiving    // the connection's share of reception
	closed func()        // counts a connection closed over a bound
	wait   time.Duration // the longest a read waits for room
	in     h2frames      // read by the reader only
	out    h2frames      // read by the writer only
	mu     sync.Mutex
	open   map[uint32]*h2stream // streams whose message is arriving
	err    error                // once over a bound: every read fails
	shut   atomic.Bool          // closed: nothing more is charged
	over   bool                 // the read being followed went past a bound
}

// h2stream is a client stream's message in reception: its gRPC length
// prefix as read (a message is a 5-byte prefix, flag and length, then
// the bytes), the bytes of the message still to come, and what the
// stream is charged.
type h2stream struct {
	prefix [5]byte
	have   int
	left   int64
	held   int64
}

func (r *reception) watch(c net.Conn, wait time.Duration, closed func()) *h2watch {
	return &h2watch{Conn: c, x: &receiving{r: r, peer: peerlimit.Host(c.RemoteAddr().String())}, closed: closed, wait: wait,
		in: h2frames{preface: len(h2ClientPrface)}, open: map[uint32]*h2stream{}}
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
	w.in.feed(p[:n], w.inHeader, w.inData, w.inEnd)
	over := w.over
	w.over = false
	w.mu.Unlock()
	if over && !w.x.within(time.Now().Add(w.wait), w.shut.Load) {
		if w.shut.Load() {
			return 0, net.ErrClosed // closed while it waited: no cut
		}
		w.mu.Lock()
		w.err = errReceivingConn
		w.releaseAll()
		w.mu.Unlock()
		w.closed()
		slog.Warn("server: closed a gRPC connection: its messages in reception stayed over a bound", "from", w.RemoteAddr().String(), "waited", w.wait)
		w.Conn.Close()
		return 0, errReceivingConn
	}
	return n, rerr
}

// Called with w.mu held, as are the other frame handlers.
func (w *h2watch) inHeader(typ, flags byte, stream uint32, _ int) error {
	switch typ {
	case h2Headers:
		_, open := w.open[stream]
		switch {
		case open && flags&h2FlagEndStrm != 0:
			w.release(stream) // the client's trailers end its message
		case !open && flags&h2FlagEndStrm == 0 && stream%2 == 1 && !w.shut.Load():
			w.open[stream] = &h2stream{}
		}
	case h2RSTStream:
		w.release(stream)
	}
	return nil
}

// inData charges a run of a stream's DATA. A message whole (its length
// prefix's count of bytes in) is given back: grpc-go hands it to the
// handler, which counts it whole; the stream's next message, if any (a
// streaming call), is charged afresh.
func (w *h2watch) inData(stream uint32, b []byte) error {
	st, ok := w.open[stream]
	if !ok {
		return nil // a stream ended, or never opened: grpc-go drops it
	}
	for len(b) > 0 {
		var k int
		if st.have < len(st.prefix) {
			k = copy(st.prefix[st.have:], b)
			st.have += k
			if st.have == len(st.prefix) {
				st.left = int64(binary.BigEndian.Uint32(st.prefix[1:]))
			}
		} else {
			k = int(min(int64(len(b)), st.left))
			st.left -= int64(k)
		}
		if err := w.x.take(int64(k)); err != nil {
			w.x.force(int64(k)) // read already: Read then waits for room
			w.over = true
		}
		st.held += int64(k)
		b = b[k:]
		if st.have == len(st.prefix) && st.left == 0 {
			w.x.give(st.held)
			*st = h2stream{}
		}
	}
	return nil
}

func (w *h2watch) inEnd(typ, flags byte, stream uint32) error {
	if typ == h2Data && flags&h2FlagEndStrm != 0 {
		w.release(stream) // the client is done sending
	}
	return nil
}

// release gives back what stream's message was charged.
func (w *h2watch) release(stream uint32) {
	if st, ok := w.open[stream]; ok {
		delete(w.open, stream)
		w.x.give(st.held)
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
	}, func(uint32, []byte) error { return nil }, func(byte, byte, uint32) error { return nil })
	w.mu.Unlock()
	return w.Conn.Write(p)
}

func (w *h2watch) Close() error {
	w.shut.Store(true)
	w.mu.Lock()
	w.releaseAll()
	w.mu.Unlock()
	w.x.r.wake() // a read waiting for room gives up
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
	wait   time.Duration
	closed func()
}

func (c watchCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		return out, info, err
	}
	return c.r.watch(out, c.wait, c.closed), info, nil
}

func (c watchCreds) Clone() credentials.TransportCredentials {
	return watchCreds{TransportCredentials: c.TransportCredentials.Clone(), r: c.r, wait: c.wait, closed: c.closed}
}
