package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// Slow senders: requests that announce a length and then send their
// bytes one at a time, as an attacker holding a front's resources would.
// Over gRPC they are raw HTTP/2 streams (HEADERS for ModelInfer, a DATA
// frame with the message's 5-byte length prefix, then one byte a DATA
// frame); over HTTP, requests with a Content-Length. A request is opened
// again whenever one is answered or cut off, so that Streams are always
// in reception.

// SlowOptions configure slow senders.
type SlowOptions struct {
	// Protocol is "grpc" or "http".
	Protocol string
	// Addr is the router's gRPC or HTTP address, as Protocol says.
	Addr string
	// Model is the model the requests name.
	Model string
	// Streams is how many requests are held in reception at once.
	Streams int
	// Announce is the length each request announces: an HTTP body's
	// Content-Length, a gRPC message's length prefix. Default 1000.
	Announce int
	// Every is the pause between two bytes of a request. Default 1s.
	Every time.Duration
	// Source is the local address to send from (any port), e.g.
	// 127.0.0.2, so that a router can tell the senders from a good
	// client on 127.0.0.1; "" lets the system choose.
	Source string
	// StreamsPerConn is how many gRPC streams share one HTTP/2
	// connection. Default 50.
	StreamsPerConn int
	// Burst, over gRPC, is how many bytes of its message a stream sends
	// at once after the length prefix, as fast as the server's
	// flow-control windows let it, before trickling the rest (a
	// half-sent message, stalled). Less than Announce; default 0.
	Burst int
}

func (o *SlowOptions) fill() error {
	if o.Announce == 0 {
		o.Announce = 1000
	}
	if o.Every == 0 {
		o.Every = time.Second
	}
	if o.StreamsPerConn == 0 {
		o.StreamsPerConn = 50
	}
	if o.Protocol != "grpc" && o.Protocol != "http" {
		return fmt.Errorf("bench: slow senders: protocol %q is not grpc or http", o.Protocol)
	}
	if o.Streams < 1 || o.Announce < 1 || o.Every < 0 || o.StreamsPerConn < 1 {
		return errors.New("bench: slow senders: streams, the announced length and streams per connection must be positive")
	}
	if o.Burst < 0 || o.Burst >= o.Announce || o.Burst > 0 && o.Protocol != "grpc" {
		return errors.New("bench: slow senders: a burst is gRPC's, and less than the announced length")
	}
	return nil
}

// SlowStats is what slow senders did; safe to read while they run.
type SlowStats struct {
	mu      sync.Mutex
	open    int
	opened  int
	sent    int64
	answers map[string]int
	errs    map[string]int
}

func (s *SlowStats) opening() {
	s.mu.Lock()
	s.open++
	s.opened++
	s.mu.Unlock()
}

// ended records a request's end: its answer (an HTTP status, a gRPC
// status code, "reset"), or the error that ended it.
func (s *SlowStats) ended(answer string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open--
	if answer != "" {
		s.answers[answer]++
	} else if err != nil {
		s.errs[first100(err.Error())]++
	}
}

func (s *SlowStats) bytes(n int) {
	s.mu.Lock()
	s.sent += int64(n)
	s.mu.Unlock()
}

// Open is how many requests are in reception now.
func (s *SlowStats) Open() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.open
}

// Print writes one line: requests opened and open, bytes sent, answers.
func (s *SlowStats) Print(w io.Writer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	answers := countList(s.answers)
	if answers == "" {
		answers = "none"
	}
	fmt.Fprintf(w, "slow senders: %d requests opened, %d open, %d body bytes sent; answers: %s", s.opened, s.open, s.sent, answers)
	if len(s.errs) > 0 {
		fmt.Fprintf(w, "; ended by errors: %s", countList(s.errs))
	}
	fmt.Fprintln(w)
}

// countList is m's counts, "N key" each, by key: how the bench prints
// tallies of answers ("" for none).
func countList(m map[string]int) string {
	parts := make([]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%d %s", m[k], k))
	}
	return strings.Join(parts, ", ")
}

// RunSlow holds o.Streams slow requests open until ctx ends, opening one
// again whenever one ends. It returns at once; the senders stop, and
// close their connections, when ctx ends: wait for that with the
// returned function.
func RunSlow(ctx context.Context, o SlowOptions) (*SlowStats, func(), error) {
	if err := o.fill(); err != nil {
		return nil, nil, err
	}
	st := &SlowStats{answers: map[string]int{}, errs: map[string]int{}}
	var wg sync.WaitGroup
	if o.Protocol == "http" {
		for range o.Streams {
			wg.Go(func() { slowHTTP(ctx, o, st) })
		}
	} else {
		for left := o.Streams; left > 0; left -= o.StreamsPerConn {
			n := min(left, o.StreamsPerConn)
			wg.Go(func() { slowGRPC(ctx, o, n, st) })
		}
	}
	return st, wg.Wait, nil
}

// eachConn calls use with a new connection to o.Addr from o.Source, one
// after another, until ctx ends; a failed dial is tried again after a
// pause, so that a sender does not spin when the server is gone.
func (o SlowOptions) eachConn(ctx context.Context, use func(net.Conn)) {
	d := net.Dialer{Timeout: 5 * time.Second}
	if o.Source != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(o.Source)}
	}
	for ctx.Err() == nil {
		conn, err := d.DialContext(ctx, "tcp", o.Addr)
		if err != nil {
			t := time.NewTimer(100 * time.Millisecond)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			continue
		}
		use(conn)
		conn.Close()
	}
}

// slowHTTP sends one slow request after another on a connection of its
// own: the headers, then one byte of body (a JSON space) every o.Every,
// until the server answers or closes.
func slowHTTP(ctx context.Context, o SlowOptions, st *SlowStats) {
	o.eachConn(ctx, func(conn net.Conn) {
		st.opening()
		answer, err := slowHTTPRequest(ctx, o, conn, st)
		if ctx.Err() != nil {
			answer, err = "", nil
		}
		st.ended(answer, err)
	})
}

func slowHTTPRequest(ctx context.Context, o SlowOptions, conn net.Conn, st *SlowStats) (string, error) {
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	answered := make(chan string, 1)
	go func() {
		// The status line is enough: the server answers before the body
		// is done only to refuse it or cut it off.
		buf := make([]byte, 64)
		n, _ := io.ReadAtLeast(conn, buf, 12)
		if n >= 12 && bytes.HasPrefix(buf, []byte("HTTP/1.1 ")) {
			answered <- string(buf[9:12])
		}
		close(answered)
		conn.Close()
	}()
	if _, err := fmt.Fprintf(conn, "POST /v2/models/%s/infer HTTP/1.1\r\nHost: cumulus\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", o.Model, o.Announce); err != nil {
		return "", err
	}
	t := time.NewTicker(o.Every)
	defer t.Stop()
	for sent := 0; ; {
		select {
		case a, ok := <-answered:
			if !ok {
				return "", errors.New("closed without an answer")
			}
			return a, nil
		case <-t.C:
		}
		if sent < o.Announce-1 { // never the last byte: the request stays in reception
			if _, err := conn.Write([]byte{' '}); err != nil {
				if a, ok := <-answered; ok {
					return a, nil
				}
				return "", err
			}
			sent++
			st.bytes(1)
		}
	}
}

// slowGRPC holds n slow streams open on one HTTP/2 connection, and opens
// the connection again when it ends.
func slowGRPC(ctx context.Context, o SlowOptions, n int, st *SlowStats) {
	o.eachConn(ctx, func(conn net.Conn) {
		c := &h2conn{conn: conn, fr: http2.NewFramer(conn, conn), o: o, st: st, streams: map[uint32]bool{}, next: 1,
			connWin: initialWindow, initWin: initialWindow, win: map[uint32]int64{}, burst: map[uint32]int{}}
		c.run(ctx, n)
	})
}

// h2conn is a raw HTTP/2 client connection carrying slow gRPC streams.
type h2conn struct {
	conn    net.Conn
	fr      *http2.Framer
	o       SlowOptions
	st      *SlowStats
	mu      sync.Mutex // guards writes and the fields below
	streams map[uint32]bool
	next    uint32
	hbuf    bytes.Buffer
	henc    *hpack.Encoder
	// Flow control of what the streams send (RFC 9113, 6.9): the
	// connection's window, the server's initial stream window, and each
	// stream's; burst is what each stream has left to send at once.
	connWin, initWin int64
	win              map[uint32]int64
	burst            map[uint32]int
}

// initialWindow is HTTP/2's flow-control window before SETTINGS say
// otherwise.
const initialWindow = 65535

func (c *h2conn) run(ctx context.Context, n int) {
	stop := context.AfterFunc(ctx, func() { c.conn.Close() })
	defer stop()
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.mu.Lock()
	_, err := c.conn.Write([]byte(http2.ClientPreface))
	if err == nil {
		err = c.fr.WriteSettings()
	}
	for range n {
		if err == nil {
			err = c.open()
		}
	}
	c.mu.Unlock()
	if err != nil {
		return
	}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		c.read()
	}()
	t := time.NewTicker(c.o.Every)
	defer t.Stop()
	for {
		select {
		case <-readDone:
			c.endAll(ctx)
			return
		case <-t.C:
		}
		c.mu.Lock()
		for id := range c.streams {
			if _, bursting := c.burst[id]; bursting || c.connWin < 1 || c.win[id] < 1 {
				continue
			}
			if c.fr.WriteData(id, false, []byte{0}) == nil {
				c.connWin--
				c.win[id]--
				c.st.bytes(1)
			}
		}
		c.mu.Unlock()
	}
}

// open starts a stream: HEADERS for ModelInfer, then the message's
// length prefix. Called with c.mu held.
func (c *h2conn) open() error {
	id := c.next
	c.next += 2
	c.hbuf.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", kservepb.GRPCInferenceService_ModelInfer_FullMethodName},
		{":authority", "cumulus"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		c.henc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true}); err != nil {
		return err
	}
	var prefix [5]byte
	binary.BigEndian.PutUint32(prefix[1:], uint32(c.o.Announce))
	if err := c.fr.WriteData(id, false, prefix[:]); err != nil {
		return err
	}
	c.streams[id] = true
	c.connWin -= 5
	c.win[id] = c.initWin - 5
	c.burst[id] = c.o.Burst
	c.st.opening()
	return c.pump()
}

// pump sends what the streams' bursts have left, as far as the windows
// allow. Called with c.mu held.
func (c *h2conn) pump() error {
	for id, left := range c.burst {
		for left > 0 && c.connWin > 0 && c.win[id] > 0 {
			n := int(min(int64(left), c.connWin, c.win[id], 16384))
			if err := c.fr.WriteData(id, false, zeros[:n]); err != nil {
				return err
			}
			left -= n
			c.connWin -= int64(n)
			c.win[id] -= int64(n)
			c.st.bytes(n)
		}
		if c.burst[id] = left; left == 0 {
			delete(c.burst, id)
		}
	}
	return nil
}

var zeros [16384]byte

// read answers the server's SETTINGS and PINGs and notes each stream the
// server ends (its trailers, or RST_STREAM), opening another in its
// place, until the connection fails.
func (c *h2conn) read() {
	dec := hpack.NewDecoder(4096, nil)
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return
		}
		c.mu.Lock()
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
					for id := range c.win {
						c.win[id] += int64(v) - c.initWin
					}
					c.initWin = int64(v)
				}
				err = c.fr.WriteSettingsAck()
				if err == nil {
					err = c.pump()
				}
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				c.connWin += int64(f.Increment)
			} else if _, ok := c.win[f.StreamID]; ok {
				c.win[f.StreamID] += int64(f.Increment)
			}
			err = c.pump()
		case *http2.PingFrame:
			if !f.IsAck() {
				err = c.fr.WritePing(true, f.Data)
			}
		case *http2.HeadersFrame:
			fields, _ := dec.DecodeFull(f.HeaderBlockFragment())
			answer := ""
			for _, h := range fields {
				if h.Name == "grpc-status" {
					answer = "grpc-status " + h.Value
				}
			}
			if f.StreamEnded() && c.streams[f.StreamID] {
				err = c.end(f.StreamID, answer)
			}
		case *http2.RSTStreamFrame:
			if c.streams[f.StreamID] {
				err = c.end(f.StreamID, "reset "+f.ErrCode.String())
			}
		case *http2.GoAwayFrame:
			err = errors.New("GOAWAY")
		}
		c.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// end notes a stream's end and opens another. Called with c.mu held.
func (c *h2conn) end(id uint32, answer string) error {
	delete(c.streams, id)
	delete(c.win, id)
	delete(c.burst, id)
	c.st.ended(answer, nil)
	// Closing our side too lets the server forget the stream.
	c.fr.WriteRSTStream(id, http2.ErrCodeCancel)
	return c.open()
}

// endAll notes the end of the streams still open when the connection
// failed.
func (c *h2conn) endAll(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id := range c.streams {
		delete(c.streams, id)
		delete(c.win, id)
		delete(c.burst, id)
		if ctx.Err() != nil {
			c.st.ended("", nil)
		} else {
			c.st.ended("", errors.New("connection closed"))
		}
	}
}
