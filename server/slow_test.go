package server_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/server"
	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// instant is a Predictor that answers every request at once.
type instant struct{}

func (instant) Predict(_ context.Context, req *router.Request) (*router.Response, error) {
	return &router.Response{Model: req.Model, Version: 3, Scores: make([]float32, req.Rows())}, nil
}
func (instant) Ready() bool     { return true }
func (instant) Revision() int64 { return 1 }
func (instant) Model(name string) (router.ModelStatus, bool) {
	return router.ModelStatus{Name: name, Ready: true, Live: 3, Versions: []uint64{3}, Shape: model.Shape{Type: model.LR}}, name == "m"
}

// slowSenders starts o's slow senders from 127.0.0.2 against s and stops
// them when the test ends.
func slowSenders(t *testing.T, s *server.Server, o bench.SlowOptions) *bench.SlowStats {
	t.Helper()
	o.Addr, o.Model, o.Source = s.GRPCAddr(), "m", "127.0.0.2"
	if o.Protocol == "http" {
		o.Addr = s.HTTPAddr()
	}
	ctx, cancel := context.WithCancel(context.Background())
	st, wait, err := bench.RunSlow(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); wait() })
	return st
}

// metric reads one sample of s's /metrics, 0 when absent.
func metric(t *testing.T, s *server.Server, name string) float64 {
	t.Helper()
	_, body := get(t, s, "/metrics")
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatalf("metric %s: %v", name, err)
	}
	return v
}

// rawPost sends an infer request's headers announcing contentLength
// bytes, and sent of them, from the local address from ("" for any), and
// reads the answer that comes without the rest.
func rawPost(t *testing.T, addr, from string, contentLength int, sent string) (*http.Response, string) {
	t.Helper()
	d := net.Dialer{}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", contentLength, sent)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%d bytes announced, %d sent: no answer: %v", contentLength, len(sent), err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(msg)
}

// neverSent opens a ModelInfer stream whose message never comes and
// returns how it ends.
func neverSent(t *testing.T, addr string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return openNeverSent(t, ctx, addr).RecvMsg(new(kservepb.ModelInferResponse))
}

// openNeverSent opens, under ctx, a ModelInfer stream whose message
// never comes.
func openNeverSent(t *testing.T, ctx context.Context, addr string) grpc.ClientStream {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	stream, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true}, kservepb.GRPCInferenceService_ModelInfer_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	return stream
}

// goodClient sends n requests over gRPC and n over REST, one at a time,
// and fails the test for any that is not answered 200 / OK.
func goodClient(t *testing.T, s *server.Server, client kservepb.GRPCInferenceServiceClient, n int) {
	t.Helper()
	for i := range n {
		if _, err := client.ModelInfer(context.Background(), grpcOneRow()); err != nil {
			t.Fatalf("good gRPC request %d: %v", i, err)
		}
		if code, body := postTo(t, s, "/v2/models/m/infer", oneRow); code != 200 {
			t.Fatalf("good REST request %d: %d %s", i, code, body)
		}
	}
}

// TestSlowSendersHoldNoSlot: with gRPC streams and HTTP bodies trickling
// in, more of them than the front has request slots, and a receive time
// longer than the test, a good client's requests are all admitted: a
// request in reception holds bytes, not a slot. (Before, the gRPC streams
// took every slot and the good client was refused.)
func TestSlowSendersHoldNoSlot(t *testing.T) {
	s, client := startFront(t, server.Options{MaxInflight: 2, MaxQueueTime: time.Millisecond,
		RequestTimeout: time.Hour, ReceiveTimeout: time.Hour}, instant{})
	grpcSlow := slowSenders(t, s, bench.SlowOptions{Protocol: "grpc", Streams: 8, Every: 20 * time.Millisecond})
	httpSlow := slowSenders(t, s, bench.SlowOptions{Protocol: "http", Streams: 8, Every: 20 * time.Millisecond})
	testenv.Eventually(t, 30*time.Second, func() error {
		// Each gRPC stream is counted at 4 KiB and the bytes it sent (5
		// of length prefix, then one a tick), each body at 8 KiB.
		if got, want := metric(t, s, "cumulus_receiving_bytes"), float64(8*(4<<10+5)+8*(8<<10)); got < want {
			return fmt.Errorf("%v bytes in reception, want %v: slow senders not all in reception yet (%d gRPC, %d HTTP open)", got, want, grpcSlow.Open(), httpSlow.Open())
		}
		return nil
	})
	goodClient(t, s, client, 50)
	if got := metric(t, s, "cumulus_receiving_bytes"); got < float64(8*(4<<10+5)+8*(8<<10)) {
		t.Errorf("after the good client, %v bytes in reception: the slow senders should still be", got)
	}
}

// TestOnePeerCannotTakeTheFront: slow senders from one address are held
// to that address's share of reception, the rest refused and counted by
// the bound, while a client on another address is served.
func TestOnePeerCannotTakeTheFront(t *testing.T) {
	// A body of 64 KiB needs 136 KiB of reception; each slow body is
	// counted at 8 KiB: 200 KiB per address takes 25 of them.
	s, client := startFront(t, server.Options{MaxRequestBytes: 64 << 10, MaxReceivingPerPeer: 200 << 10,
		RequestTimeout: time.Hour, ReceiveTimeout: time.Hour}, instant{})
	slowSenders(t, s, bench.SlowOptions{Protocol: "http", Streams: 30, Every: 20 * time.Millisecond})
	testenv.Eventually(t, 30*time.Second, func() error {
		if got := metric(t, s, `cumulus_admission_refused_total{api="http",bound="peer"}`); got == 0 {
			return fmt.Errorf("no HTTP request refused by the per-address bound yet")
		}
		return nil
	})
	if got := metric(t, s, "cumulus_receiving_bytes"); got > 200<<10 {
		t.Errorf("%v bytes in reception from one address, bound 200 KiB", got)
	}
	goodClient(t, s, client, 20)
	// A gRPC request from the same address is refused too, with
	// ResourceExhausted naming the address's share.
	conn, err := grpc.NewClient(s.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
			return d.DialContext(ctx, "tcp", addr)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	testenv.Eventually(t, 30*time.Second, func() error {
		_, err := kservepb.NewGRPCInferenceServiceClient(conn).ModelInfer(context.Background(), grpcOneRow())
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "client address") {
			return fmt.Errorf("gRPC from the address at its share: %v, want ResourceExhausted naming the client address", err)
		}
		return nil
	})
}

// TestHalfSentMessagesAreCounted: gRPC messages stalled half-sent are
// counted in reception by the bytes they sent, as their frames arrive
// (grpc-go holds them though no handler has seen them); a connection
// whose frames take its address past its share waits for room, while a
// client on another address is served.
func TestHalfSentMessagesAreCounted(t *testing.T) {
	s, client := startFront(t, server.Options{RequestTimeout: time.Hour, ReceiveTimeout: time.Hour}, instant{})
	slow := slowSenders(t, s, bench.SlowOptions{Protocol: "grpc", Streams: 3, Announce: 1 << 20, Burst: 60 << 10, Every: time.Hour})
	// Each stream: 4 KiB, its 5-byte prefix and 60 KiB of message.
	want := float64(3 * (4<<10 + 5 + 60<<10))
	testenv.Eventually(t, 30*time.Second, func() error {
		if got := metric(t, s, "cumulus_receiving_bytes"); got != want {
			return fmt.Errorf("%v bytes in reception, want %v (%d streams open)", got, want, slow.Open())
		}
		return nil
	})

	// With a share of 200 KiB an address fits three such streams, not
	// six: the connection carrying them, past the share by what it had
	// read, waits unread until the streams in reception end at their
	// receive time and give room; reception stays within the share and
	// that one read.
	s2, client2 := startFront(t, server.Options{MaxRequestBytes: 64 << 10, MaxReceivingPerPeer: 200 << 10, RequestTimeout: time.Hour,
		ReceiveTimeout: 300 * time.Millisecond}, instant{})
	ctx, cancel := context.WithCancel(context.Background())
	// (Messages of 64,000 bytes: within the 64 KiB MaxRequestBytes.)
	st, wait, err := bench.RunSlow(ctx, bench.SlowOptions{Protocol: "grpc", Addr: s2.GRPCAddr(), Model: "m", Source: "127.0.0.2",
		Streams: 6, Announce: 64000, Burst: 60 << 10, Every: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); wait() }()
	testenv.Eventually(t, 30*time.Second, func() error {
		var b strings.Builder
		st.Print(&b)
		if !strings.Contains(b.String(), "grpc-status 4") {
			return fmt.Errorf("no stream ended at its receive time yet: %s", b.String())
		}
		return nil
	})
	for range 20 {
		if got := metric(t, s2, "cumulus_receiving_bytes"); got > 200<<10+64<<10 {
			t.Fatalf("%v bytes in reception from one address, bound 200 KiB and a read", got)
		}
		time.Sleep(10 * time.Millisecond)
	}
	goodClient(t, s2, client2, 10)
	goodClient(t, s, client, 10)
	// The senders gone, reception is empty again: nothing leaked.
	cancel()
	wait()
	testenv.Eventually(t, 30*time.Second, func() error {
		if got := metric(t, s2, "cumulus_receiving_bytes"); got != 0 {
			return fmt.Errorf("%v bytes in reception with no sender left, want 0", got)
		}
		return nil
	})
}

// TestAnnouncedLengthCostsNothing: bodies announcing 40 MB and trickling
// in are counted, and held in memory, by the chunks their bytes fill: a
// few KiB each, not the 40 MB announced.
func TestAnnouncedLengthCostsNothing(t *testing.T) {
	s, client := startFront(t, server.Options{RequestTimeout: time.Hour, ReceiveTimeout: time.Hour}, instant{})
	slow := slowSenders(t, s, bench.SlowOptions{Protocol: "http", Streams: 10, Announce: 40_000_000, Every: 20 * time.Millisecond})
	testenv.Eventually(t, 30*time.Second, func() error {
		if got := metric(t, s, "cumulus_receiving_bytes"); got < 10*(8<<10) {
			return fmt.Errorf("%v bytes in reception: the 10 senders not all in yet (%d open)", got, slow.Open())
		}
		return nil
	})
	if got := metric(t, s, "cumulus_receiving_bytes"); got > 10*(8<<10) {
		t.Errorf("10 bodies announcing 40 MB, a few bytes each sent: %v bytes in reception, want 80 KiB", got)
	}
	goodClient(t, s, client, 10)
}

// TestReceiveTimeout: a request still arriving at the end of its receive
// time is cut off, long before its own deadline: HTTP 408 with the
// connection closed, gRPC DeadlineExceeded naming the receive time. The
// server goes on serving.
func TestReceiveTimeout(t *testing.T) {
	s, client := startFront(t, server.Options{RequestTimeout: time.Hour, ReceiveTimeout: 50 * time.Millisecond, HeaderTimeout: 100 * time.Millisecond}, instant{})
	resp, msg := rawPost(t, s.HTTPAddr(), "", len(oneRow), oneRow[:10])
	if resp.StatusCode != 408 || !resp.Close || !strings.Contains(msg, "did not arrive within its receive time") ||
		!strings.Contains(msg, "10 of its bytes did") {
		t.Errorf("trickled body: %d close=%v %s, want 408, the connection closed, naming the receive time", resp.StatusCode, resp.Close, msg)
	}
	if err := neverSent(t, s.GRPCAddr()); status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "receive time") {
		t.Errorf("gRPC message never sent: %v, want DeadlineExceeded naming the receive time", err)
	}
	goodClient(t, s, client, 5)
	if got := metric(t, s, `cumulus_infer_requests_total{api="http",code="receive_timeout"}`); got != 1 {
		t.Errorf("HTTP requests cut off counted: %v, want 1", got)
	}
}

// TestCutAnsweredLate: a request cut off at its receive time is answered
// only once HeaderTimeout has passed since it arrived, over either
// front, so that a sender reopening whatever is cut cannot make the
// front cut requests as fast as it opens them; a client that gives up
// ends the wait.
func TestCutAnsweredLate(t *testing.T) {
	const hold = 600 * time.Millisecond
	s, client := startFront(t, server.Options{RequestTimeout: 100 * time.Millisecond, ReceiveTimeout: 20 * time.Millisecond, HeaderTimeout: hold}, instant{})
	t0 := time.Now()
	if err := neverSent(t, s.GRPCAddr()); status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "receive time") {
		t.Errorf("gRPC message never sent: %v, want DeadlineExceeded naming the receive time", err)
	}
	if took := time.Since(t0); took < hold {
		t.Errorf("gRPC stream cut off answered after %v, want no sooner than HeaderTimeout (%v), past RequestTimeout", took, hold)
	}
	t0 = time.Now()
	if resp, msg := rawPost(t, s.HTTPAddr(), "", len(oneRow), oneRow[:10]); resp.StatusCode != 408 {
		t.Errorf("trickled body: %d %s, want 408", resp.StatusCode, msg)
	}
	if took := time.Since(t0); took < hold {
		t.Errorf("HTTP body cut off answered after %v, want no sooner than HeaderTimeout (%v)", took, hold)
	}
	goodClient(t, s, client, 2)

	// A gRPC client that gives up ends the wait: the front holds
	// nothing for it after that.
	s2, _ := startFront(t, server.Options{RequestTimeout: time.Hour, ReceiveTimeout: 20 * time.Millisecond, HeaderTimeout: time.Hour}, instant{})
	ctx, cancel := context.WithCancel(context.Background())
	stream := openNeverSent(t, ctx, s2.GRPCAddr())
	heldNow(t, s2, 1)
	cancel()
	if err := stream.RecvMsg(new(kservepb.ModelInferResponse)); status.Code(err) != codes.Canceled {
		t.Errorf("stream its client cancelled: %v, want Canceled", err)
	}
	heldNow(t, s2, 0)

	// A stream whose message arrives whole after all, while it is held,
	// is answered then: its read had gone on, and what it read is freed.
	conn, fr := rawGRPC(t, s2.GRPCAddr())
	fr.WriteData(1, false, []byte{0, 0, 0, 0, 10})
	heldNow(t, s2, 1)
	fr.WriteData(1, true, make([]byte, 10))
	if got := grpcStatus(t, conn, fr); got != strconv.Itoa(int(codes.DeadlineExceeded)) {
		t.Errorf("held stream whose message then arrived: grpc-status %q, want DeadlineExceeded", got)
	}
	heldNow(t, s2, 0)
	conn.Close()

	// The front stopping answers what it holds, rather than wait an
	// hour or fail it.
	stream = openNeverSent(t, context.Background(), s2.GRPCAddr())
	heldNow(t, s2, 1)
	s2.Close()
	if err := stream.RecvMsg(new(kservepb.ModelInferResponse)); status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "receive time") {
		t.Errorf("stream held when the front stopped: %v, want its DeadlineExceeded naming the receive time", err)
	}

	// While reception for all requests is past half its bound, a cut
	// request is answered at once: other clients want the room.
	s3, _ := startFront(t, server.Options{RequestTimeout: time.Hour, ReceiveTimeout: 20 * time.Millisecond, HeaderTimeout: time.Hour,
		MaxRequestBytes: 64 << 10, MaxReceivingBytes: 200 << 10, MaxReceivingPerPeer: 200 << 10}, instant{})
	// (61,440 bytes announced, 60,000 or 45,000 sent, in frames of at
	// most 16 KiB, HTTP/2's first frame size, within its first windows.)
	send := func(n int) (net.Conn, *http2.Framer) {
		conn, fr := rawGRPC(t, s3.GRPCAddr())
		fr.WriteData(1, false, []byte{0, 0, 0, 0xf0, 0})
		for range n / 15_000 {
			fr.WriteData(1, false, make([]byte, 15_000))
		}
		return conn, fr
	}
	send(60_000)
	heldNow(t, s3, 1) // 60,005 bytes in reception: under half its bound
	conn, fr = send(45_000)
	if got := grpcStatus(t, conn, fr); got != strconv.Itoa(int(codes.DeadlineExceeded)) {
		t.Errorf("stream cut off with reception past half its bound: grpc-status %q, want DeadlineExceeded at once", got)
	}
}

// heldNow waits until s holds n cut-off requests.
func heldNow(t *testing.T, s *server.Server, n float64) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, func() error {
		if got := metric(t, s, "cumulus_cut_requests_held"); got != n {
			return fmt.Errorf("%v cut-off requests held, want %v", got, n)
		}
		return nil
	})
}

// rawGRPC opens an HTTP/2 connection to a gRPC front and the headers of
// a ModelInfer call on stream 1, for a test to send its message as it
// likes.
func rawGRPC(t *testing.T, addr string) (net.Conn, *http2.Framer) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	conn.Write([]byte(http2.ClientPreface))
	fr := http2.NewFramer(conn, conn)
	fr.WriteSettings()
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: grpcHeaders(), EndHeaders: true})
	return conn, fr
}

// grpcHeaders is the HPACK block of a ModelInfer call's headers.
func grpcHeaders() []byte {
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", kservepb.GRPCInferenceService_ModelInfer_FullMethodName},
		{":authority", "cumulus"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	return b.Bytes()
}

// grpcStatus reads fr's frames until a grpc-status arrives, and returns
// it; it fails the test if the connection ends first.
func grpcStatus(t *testing.T, conn net.Conn, fr *http2.Framer) string {
	t.Helper()
	dec := hpack.NewDecoder(4096, nil)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		if h, ok := f.(*http2.HeadersFrame); ok {
			fields, err := dec.DecodeFull(h.HeaderBlockFragment())
			if err != nil {
				t.Fatal(err)
			}
			for _, hf := range fields {
				if hf.Name == "grpc-status" {
					return hf.Value
				}
			}
		}
	}
}

// TestCutOffConnectionClosed: a connection whose body was cut off at its
// receive time is closed by the server right after the 408, not held
// while net/http waits to discard the rest of a body that never comes.
func TestCutOffConnectionClosed(t *testing.T) {
	s, client := startFront(t, server.Options{RequestTimeout: time.Hour, ReceiveTimeout: 50 * time.Millisecond, HeaderTimeout: 100 * time.Millisecond}, instant{})
	conn, err := net.Dial("tcp", s.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n{")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	if resp.StatusCode != 408 {
		t.Fatalf("trickled body: %d, want 408", resp.StatusCode)
	}
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	if n, err := br.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("after the 408: read %d bytes, %v; want the server to have closed the connection (EOF)", n, err)
	}
	goodClient(t, s, client, 2)
}

// TestTruncatedChunkedBody: a chunked body whose connection ends before
// its last chunk is refused as incomplete, never decoded as if whole.
func TestTruncatedChunkedBody(t *testing.T) {
	s, _ := startFront(t, server.Options{RequestTimeout: time.Hour}, instant{})
	conn, err := net.Dial("tcp", s.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(oneRow), oneRow)
	conn.(*net.TCPConn).CloseWrite() // no last chunk
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || !strings.Contains(string(msg), "reading the request body") {
		t.Errorf("chunked body without its last chunk: %d %s, want 400", resp.StatusCode, msg)
	}
}
