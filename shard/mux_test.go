package shard

import (
	"context"
	"errors"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/testenv"
)

// The multiplexed stream answers what a unary Lookup answers, many calls
// at once; a call given up on is cancelled at the shard; hostile
// messages end the stream; a drain ends an idle stream.
func TestLookupStream(t *testing.T) {
	s, _, _ := servingShard(t)
	keys := []uint64{1, 2, 3, 500, 1 << 40}
	sections := sectionsOf(keys, 2)
	req := codec.AppendLookupRequest(nil, "m", 1, sections)
	testenv.Eventually(t, 30*time.Second, func() error { _, err := s.Lookup(context.Background(), req); return err })
	want, err := s.Lookup(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := NewMuxClient(conn)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				got, err := c.Lookup(context.Background(), req)
				if err != nil || string(got) != string(want) {
					t.Errorf("stream lookup: %x, %v; unary: %x", got, err, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	// The shard's codes come through.
	if _, err := c.Lookup(context.Background(), codec.AppendLookupRequest(nil, "m", 9, sections)); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a version not held: %v, want FailedPrecondition", err)
	}
	// A call given up on ends at the shard too.
	s.SetFaults(mustFaults(t, "stall"))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err = c.Lookup(ctx, req)
	cancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("stalled lookup past its deadline: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if n := s.inflight.Load(); n != 0 {
			return errors.New("the stalled lookup is still under way at the shard")
		}
		return nil
	})
	ctx, cancel = context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := c.Lookup(ctx, req); done <- err }()
	testenv.Eventually(t, 10*time.Second, func() error {
		if s.inflight.Load() == 0 {
			return errors.New("not under way yet")
		}
		return nil
	})
	cancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Errorf("cancelled lookup: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if s.inflight.Load() != 0 {
			return errors.New("the cancelled lookup is still under way at the shard")
		}
		return nil
	})
	s.SetFaults(nil)

	// Hostile messages end their stream, with InvalidArgument.
	for _, msg := range []codec.Frame{
		codec.Frame("short"),
		codec.Frame(codec.AppendMuxCall(nil, 9, 1, 0, nil)),
	} {
		st, err := conn.NewStream(context.Background(), &streamDesc, LookupStreamMethod, grpc.CallContentSubtype(codec.GRPCCodecName))
		if err != nil {
			t.Fatal(err)
		}
		st.SendMsg(&msg)
		var reply codec.Frame
		if err := st.RecvMsg(&reply); status.Code(err) != codes.InvalidArgument {
			t.Errorf("message %x: %v, want InvalidArgument", []byte(msg), err)
		}
	}
	// A bad lookup body is the lookup's error, not the stream's.
	if _, err := c.Lookup(context.Background(), []byte("not a lookup")); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a malformed lookup: %v, want InvalidArgument", err)
	}
	if _, err := c.Lookup(context.Background(), req); err != nil {
		t.Errorf("after a malformed lookup: %v", err)
	}

	// A drain is not held up by a router's idle stream.
	s.opts.DrainQuiet = 100 * time.Millisecond
	if err := s.Drain(context.Background()); err != nil {
		t.Errorf("drain with an idle lookup stream open: %v", err)
	}
	if _, err := c.Lookup(context.Background(), req); status.Code(err) != codes.Unavailable {
		t.Errorf("after the drain: %v, want Unavailable", err)
	}
}

// streamShard is a serving shard answering req, and a connection to it.
func streamShard(t *testing.T) (*Shard, *grpc.ClientConn, []byte) {
	t.Helper()
	s, _, _ := servingShard(t)
	req := codec.AppendLookupRequest(nil, "m", 1, sectionsOf([]uint64{1, 2, 3}, 2))
	testenv.Eventually(t, 30*time.Second, func() error { _, err := s.Lookup(context.Background(), req); return err })
	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return s, conn, req
}

func mustFaults(t *testing.T, spec string) *Faults {
	t.Helper()
	f, err := ParseFaults(spec)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// A stream to a shard that stops, or a connection that never becomes
// one, fails its calls with codes the router retries elsewhere, and every
// call returns by its deadline.
func TestLookupStreamFailures(t *testing.T) {
	s, conn, req := streamShard(t)
	c := NewMuxClient(conn)
	if _, err := c.Lookup(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err := c.Lookup(ctx, req)
				cancel()
				errs <- err
			}
		}()
	}
	s.Close()
	wg.Wait()
	close(errs)
	for err := range errs {
		if code := status.Code(err); err != nil && code != codes.Unavailable && code != codes.Canceled && code != codes.DeadlineExceeded {
			t.Errorf("a lookup as the shard stopped: %v, want Unavailable (retried elsewhere)", err)
		}
	}

	// A peer that takes the connection and never speaks HTTP/2.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	mute, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := NewMuxClient(mute).Lookup(ctx, req); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("a peer that never answers: %v, want DeadlineExceeded", err)
	}
}

// A shard that reads no more (here a server whose handler never reads)
// holds the stream's sender back once flow control runs out; the calls
// still return by their deadlines.
func TestLookupStreamSenderHeldBack(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	srv.RegisterService(&grpc.ServiceDesc{ServiceName: "cumulus.shard.v1.Shard", HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "LookupStream", ServerStreams: true, ClientStreams: true,
			Handler: func(_ any, st grpc.ServerStream) error { <-st.Context().Done(); return nil }}}}, struct{}{})
	go srv.Serve(lis)
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := NewMuxClient(conn)
	big := make([]byte, 1<<20)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 4 {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				_, err := c.Lookup(ctx, big)
				cancel()
				if status.Code(err) != codes.DeadlineExceeded {
					t.Errorf("a lookup to a shard that reads nothing: %v, want DeadlineExceeded", err)
				}
			}
		}()
	}
	wg.Wait()
}

// A client that sends lookups and reads no replies gets at most
// maxStreamCalls of them under way at the shard: past it the shard reads
// no more of its stream.
func TestLookupStreamBoundsAPeerThatDoesNotRead(t *testing.T) {
	_, conn, req := streamShard(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := conn.NewStream(ctx, &streamDesc, LookupStreamMethod, grpc.CallContentSubtype(codec.GRPCCodecName))
	if err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	sent := make(chan int)
	go func() {
		n := 0
		for i := range 3 * maxStreamCalls {
			msg := codec.Frame(codec.AppendMuxCall(nil, codec.MuxLookup, uint64(i+1), 0, req))
			if st.SendMsg(&msg) != nil {
				break
			}
			n++
		}
		sent <- n
	}()
	// Sending stalls once the shard has stopped reading and flow control
	// has run out; until then, count goroutines as they peak.
	peak := 0
	for done := false; !done; {
		select {
		case <-sent:
			done = true
		case <-time.After(200 * time.Millisecond):
			if n := runtime.NumGoroutine(); n > peak {
				peak = n
			} else {
				done = true // no longer growing: held back
			}
		}
	}
	if grown := peak - before; grown > maxStreamCalls+streamQueue+64 {
		t.Errorf("%d goroutines more with a peer reading no replies, bound %d", grown, maxStreamCalls)
	}
	cancel()
}
