package server

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// h2events feeds b to a fresh h2frames in pieces of the sizes cuts gives
// (the rest whole), and lists what it saw.
func h2events(b []byte, cuts func() int) []string {
	f := h2frames{preface: len(h2ClientPrface)}
	var ev []string
	var data map[uint32]int = map[uint32]int{}
	header := func(typ, flags byte, stream uint32, length int) error {
		ev = append(ev, fmt.Sprintf("header %d %d %d %d", typ, flags, stream, length))
		return nil
	}
	payload := func(stream uint32, b []byte) error { data[stream] += len(b); return nil }
	end := func(typ, flags byte, stream uint32) error {
		ev = append(ev, fmt.Sprintf("end %d %d %d data %d", typ, flags, stream, data[stream]))
		return nil
	}
	for len(b) > 0 {
		k := min(len(b), max(1, cuts()))
		if err := f.feed(b[:k], header, payload, end); err != nil {
			ev = append(ev, "error "+err.Error())
			return ev
		}
		b = b[k:]
	}
	return ev
}

// h2sample is a client's connection start: the preface, SETTINGS, two
// streams' HEADERS and DATA (one padded, one ended), a PING and a reset.
func h2sample(t testing.TB) []byte {
	var buf bytes.Buffer
	buf.WriteString(h2ClientPrface)
	fr := http2.NewFramer(&buf, nil)
	fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte("hdrs"), EndHeaders: true})
	fr.WriteData(1, false, bytes.Repeat([]byte{7}, 20000))
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: []byte("hdrs"), EndHeaders: true})
	fr.WriteDataPadded(3, true, bytes.Repeat([]byte{1}, 300), make([]byte, 17))
	fr.WritePing(false, [8]byte{1})
	fr.WriteRSTStream(1, http2.ErrCodeCancel)
	return buf.Bytes()
}

// TestH2FramesAnySplit: h2frames sees the same frames however the bytes
// are cut into reads.
func TestH2FramesAnySplit(t *testing.T) {
	b := h2sample(t)
	whole := h2events(b, func() int { return len(b) })
	if len(whole) != 14 || whole[len(whole)-1] != "end 3 0 1 data 20000" || !slices.Contains(whole, "end 0 9 3 data 300") {
		t.Fatalf("whole: %q", whole)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 200 {
		got := h2events(b, func() int { return rng.IntN(40) })
		if fmt.Sprint(got) != fmt.Sprint(whole) {
			t.Fatalf("split %d: %q, want %q", i, got, whole)
		}
	}
}

// FuzzH2Frames: any bytes, cut anywhere, give the events they give
// whole, without a panic.
func FuzzH2Frames(f *testing.F) {
	f.Add(h2sample(f), uint64(1))
	f.Add([]byte(h2ClientPrface+"\xff\xff\xff\x00\x01\x00\x00\x00\x01"), uint64(2))
	f.Add([]byte{}, uint64(3))
	f.Fuzz(func(t *testing.T, b []byte, seed uint64) {
		rng := rand.New(rand.NewPCG(seed, 0))
		if got, want := h2events(b, func() int { return rng.IntN(64) }), h2events(b, func() int { return len(b) }); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("cut: %q, whole: %q", got, want)
		}
	})
}

// fakeConn reads what its buffer holds, then io.EOF; writes vanish.
type fakeConn struct {
	net.Conn
	in bytes.Buffer
}

func (c *fakeConn) Read(p []byte) (int, error)  { return c.in.Read(p) }
func (c *fakeConn) Write(p []byte) (int, error) { return len(p), nil }
func (c *fakeConn) Close() error                { return nil }
func (c *fakeConn) RemoteAddr() net.Addr        { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 9), Port: 1} }

// grpcMessage is a gRPC message's frame bytes: its 5-byte prefix for a
// message of n bytes, then sent of its bytes.
func grpcMessage(n, sent int) []byte {
	b := []byte{0, byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}
	return append(b, make([]byte, sent)...)
}

// TestH2WatchCharges: what each stream's message is charged as its
// frames arrive, and every way that charge is given back: the message
// whole, the server's trailers, a reset, the connection closed; and the
// connection cut when a frame would pass its address's share.
func TestH2WatchCharges(t *testing.T) {
	r := newReception(&Options{MaxReceivingBytes: 1 << 20, MaxReceivingPerPeer: 4000})
	cuts := 0
	c := &fakeConn{}
	w := r.watch(c, 10*time.Second, func() { cuts++ })
	client := http2.NewFramer(&c.in, nil)
	server := http2.NewFramer(w, nil) // what the server writes goes through w
	read := func() {
		t.Helper()
		buf := make([]byte, 7) // small reads: frames cut anywhere
		for c.in.Len() > 0 {
			if _, err := w.Read(buf); err != nil {
				t.Fatalf("read: %v", err)
			}
		}
	}
	step := func(what string, want int64) {
		t.Helper()
		read()
		if got := r.bytes(); got != want {
			t.Errorf("%s: %d bytes in reception, want %d", what, got, want)
		}
	}
	c.in.WriteString(h2ClientPrface)
	client.WriteSettings()
	hdrs := func(id uint32) {
		client.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: []byte("h"), EndHeaders: true})
	}
	hdrs(1)
	client.WriteData(1, false, grpcMessage(1000, 600))
	step("600 of a 1000-byte message", 605)
	client.WriteDataPadded(1, false, make([]byte, 300), make([]byte, 200))
	step("300 more, padded with 200", 905)
	client.WriteData(1, false, make([]byte, 100))
	step("the message whole", 0)
	client.WriteData(1, false, grpcMessage(50, 10)) // a stream's next message
	step("a second message on the stream", 15)
	client.WriteData(1, true, make([]byte, 40))
	step("it whole, the stream ended", 0)

	hdrs(3)
	client.WriteData(3, false, grpcMessage(1000, 100))
	step("a stalled message", 105)
	server.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: []byte("t"), EndHeaders: true, EndStream: true})
	step("the server's trailers", 0)
	client.WriteData(3, false, make([]byte, 100))
	step("data after the stream ended", 0)

	hdrs(5)
	client.WriteData(5, false, grpcMessage(1000, 45))
	step("another", 50)
	client.WriteRSTStream(5, http2.ErrCodeCancel)
	step("reset by the client", 0)

	hdrs(7)
	client.WriteData(7, false, grpcMessage(5000, 3000))
	step("3005 of the share's 4000", 3005)
	// Past the share: the read is charged and waits for room, which
	// stream 7's end (the server's reset, from the writer's goroutine)
	// gives.
	hdrs(9)
	client.WriteData(9, false, grpcMessage(5000, 1000))
	go func() {
		for r.bytes() <= 4000 {
			time.Sleep(time.Millisecond)
		}
		server.WriteRSTStream(7, http2.ErrCodeCancel)
	}()
	step("a read past the share, waiting until stream 7 ends", 1005)
	if cuts != 0 {
		t.Fatalf("%d cuts, want the read to wait for room", cuts)
	}
	// Past it with nothing to give room: cut once the wait is over.
	w.wait = 10 * time.Millisecond
	hdrs(11)
	client.WriteData(11, false, grpcMessage(5000, 3500))
	buf := make([]byte, 64<<10)
	if _, err := w.Read(buf); err != errReceivingConn || cuts != 1 {
		t.Fatalf("a read past the share, no room coming: %v, %d cuts; want the connection cut", err, cuts)
	}
	if got := r.bytes(); got != 0 {
		t.Errorf("after the cut: %d bytes in reception, want 0", got)
	}
	if _, err := w.Read(buf); err != errReceivingConn {
		t.Errorf("a read after the cut: %v", err)
	}

	// Closed: what is open is given back, and nothing read after is
	// charged.
	c2 := &fakeConn{}
	w2 := r.watch(c2, time.Second, func() {})
	client2 := http2.NewFramer(&c2.in, nil)
	c2.in.WriteString(h2ClientPrface)
	client2.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: []byte("h"), EndHeaders: true})
	client2.WriteData(1, false, grpcMessage(1000, 10))
	w2.Read(buf)
	if got := r.bytes(); got != 15 {
		t.Fatalf("%d bytes, want 15", got)
	}
	w2.Close()
	client2.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: []byte("h"), EndHeaders: true})
	client2.WriteData(3, false, grpcMessage(1000, 10))
	w2.Read(buf)
	if got := r.bytes(); got != 0 {
		t.Errorf("after Close and a read: %d bytes in reception, want 0", got)
	}
}
