package shard

import (
	"context"
	"errors"
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

func mustFaults(t *testing.T, spec string) *Faults {
	t.Helper()
	f, err := ParseFaults(spec)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
