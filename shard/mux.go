package shard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/codec"
)

// LookupStreamMethod is the full gRPC method name of the multiplexed
// lookup stream (codec/mux.go): routers keep one open per shard and send
// every lookup over it.
const LookupStreamMethod = "/cumulus.shard.v1.Shard/LookupStream"

// maxStreamCalls bounds the lookups one stream may have under way at a
// shard; past it a lookup is refused at once (ResourceExhausted) rather
// than given a goroutine to wait for admission in.
const maxStreamCalls = 4096

// serveStream answers the lookups of one multiplexed stream, each on its
// own goroutine, replies in the order they finish. A malformed message
// ends the stream (InvalidArgument). Once the shard has drained
// (quiesce), the stream ends when no lookup of its is under way.
func (s *Shard) serveStream(stream grpc.ServerStream) error {
	ctx := stream.Context()
	type received struct {
		msg codec.Frame
		err error
	}
	in := make(chan received)
	go func() {
		for {
			var msg codec.Frame
			err := stream.RecvMsg(&msg)
			select {
			case in <- received{msg, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	var (
		sendMu  sync.Mutex
		mu      sync.Mutex
		calls   = map[uint64]context.CancelFunc{}
		running sync.WaitGroup
		ended   = make(chan struct{}, maxStreamCalls)
	)
	reply := func(id uint64, code codes.Code, body []byte) {
		msg := codec.Frame(codec.AppendMuxReply(make([]byte, 0, 9+len(body)), id, uint8(code), body))
		sendMu.Lock()
		stream.SendMsg(&msg) // an error ends the stream, which ends RecvMsg
		sendMu.Unlock()
	}
	defer func() {
		mu.Lock()
		for _, cancel := range calls {
			cancel()
		}
		mu.Unlock()
		running.Wait()
	}()
	for {
		var r received
		select {
		case r = <-in:
		case <-ended:
			continue
		case <-s.quiet:
			mu.Lock()
			idle := len(calls) == 0
			mu.Unlock()
			if idle {
				return nil
			}
			select { // wait for a lookup to end, then look again
			case r = <-in:
			case <-ended:
				continue
			case <-ctx.Done():
				return nil
			}
		case <-ctx.Done():
			return nil
		}
		if r.err != nil {
			if errors.Is(r.err, io.EOF) {
				return nil
			}
			return r.err
		}
		kind, id, deadline, body, err := codec.ParseMuxCall(r.msg)
		if err != nil {
			return status.Error(codes.InvalidArgument, err.Error())
		}
		mu.Lock()
		if kind == codec.MuxCancel {
			if cancel := calls[id]; cancel != nil {
				cancel()
			}
			mu.Unlock()
			continue
		}
		if _, dup := calls[id]; dup || len(calls) >= maxStreamCalls {
			mu.Unlock()
			if dup {
				return status.Errorf(codes.InvalidArgument, "lookup stream: call %d is already under way", id)
			}
			reply(id, codes.ResourceExhausted, []byte(fmt.Sprintf("shard %s: %d lookups under way on one stream", s.opts.ID, maxStreamCalls)))
			continue
		}
		var cctx context.Context
		var cancel context.CancelFunc
		if deadline > 0 {
			cctx, cancel = context.WithDeadline(ctx, time.Unix(0, deadline))
		} else {
			cctx, cancel = context.WithCancel(ctx)
		}
		calls[id] = cancel
		mu.Unlock()
		running.Add(1)
		go func() {
			defer running.Done()
			resp, err := s.Lookup(cctx, body)
			cancel()
			mu.Lock()
			delete(calls, id)
			mu.Unlock()
			if err != nil {
				st := status.Convert(err)
				m := st.Message()
				if len(m) > codec.MaxMuxMessage {
					m = m[:codec.MaxMuxMessage]
				}
				reply(id, st.Code(), []byte(m))
			} else {
				reply(id, codes.OK, resp)
			}
			select {
			case ended <- struct{}{}:
			default:
			}
		}()
	}
}

// MuxClient is a Service over a multiplexed lookup stream on a gRPC
// connection: one stream carries every lookup, opened on first use and
// again after it breaks. Safe for concurrent use.
type MuxClient struct {
	conn *grpc.ClientConn
	mu   sync.Mutex
	cur  *muxStream
}

// NewMuxClient wraps a connection to a shard.
func NewMuxClient(conn *grpc.ClientConn) *MuxClient { return &MuxClient{conn: conn} }

// String names the peer, for errors and logs.
func (c *MuxClient) String() string { return fmt.Sprintf("shard at %s", c.conn.Target()) }

var streamDesc = grpc.StreamDesc{StreamName: "LookupStream", ServerStreams: true, ClientStreams: true}

type muxStream struct {
	stream grpc.ClientStream
	cancel context.CancelFunc
	sendMu sync.Mutex
	mu     sync.Mutex
	calls  map[uint64]*muxCall
	next   uint64
	err    error       // why it broke; nil while it serves
	in     codec.Frame // read's
}

// muxCall is one lookup waiting for its reply. Its buffers are reused by
// later calls.
type muxCall struct {
	done   chan struct{} // one send per reply
	msg    codec.Frame   // the call message sent
	resp   []byte        // the reply's body, in its own message
	code   codes.Code
	broken bool // no reply: the stream broke
}

var muxCalls = sync.Pool{New: func() any { return &muxCall{done: make(chan struct{}, 1)} }}

// stream is the stream to send on, opened if there is none or it broke.
func (c *MuxClient) stream() (*muxStream, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st := c.cur; st != nil {
		st.mu.Lock()
		broken := st.err != nil
		st.mu.Unlock()
		if !broken {
			return st, nil
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cs, err := c.conn.NewStream(ctx, &streamDesc, LookupStreamMethod, grpc.CallContentSubtype(codec.GRPCCodecName))
	if err != nil {
		cancel()
		return nil, err
	}
	st := &muxStream{stream: cs, cancel: cancel, calls: map[uint64]*muxCall{}}
	c.cur = st
	go st.read()
	return st, nil
}

// read delivers replies to their calls until the stream breaks; then it
// fails every call still waiting.
func (st *muxStream) read() {
	var err error
	for {
		// Each message is a new slice (the codec keeps what gRPC hands
		// it); only the variable is reused.
		if err = st.stream.RecvMsg(&st.in); err != nil {
			break
		}
		id, code, body, perr := codec.ParseMuxReply(st.in)
		if perr != nil {
			err = status.Errorf(codes.Internal, "lookup stream: %v", perr)
			break
		}
		st.mu.Lock()
		call := st.calls[id]
		delete(st.calls, id)
		st.mu.Unlock()
		if call != nil { // else: given up on
			call.code, call.resp, call.broken = codes.Code(code), body, false
			call.done <- struct{}{}
		}
	}
	if errors.Is(err, io.EOF) {
		err = status.Error(codes.Unavailable, "lookup stream ended by the shard")
	}
	st.cancel()
	st.mu.Lock()
	st.err = err
	calls := st.calls
	st.calls = nil
	st.mu.Unlock()
	for _, call := range calls {
		call.broken = true
		call.done <- struct{}{}
	}
}

// Lookup implements Service. The returned bytes are the caller's.
func (c *MuxClient) Lookup(ctx context.Context, req []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	st, err := c.stream()
	if err != nil {
		return nil, err
	}
	call := muxCalls.Get().(*muxCall)
	st.mu.Lock()
	if st.err != nil {
		err := st.err
		st.mu.Unlock()
		muxCalls.Put(call)
		return nil, status.Convert(err).Err()
	}
	st.next++
	id := st.next
	st.calls[id] = call
	st.mu.Unlock()
	var deadline int64
	if d, ok := ctx.Deadline(); ok {
		deadline = d.UnixNano()
	}
	call.msg = codec.AppendMuxCall(call.msg[:0], codec.MuxLookup, id, deadline, req)
	st.sendMu.Lock()
	err = st.stream.SendMsg(&call.msg)
	st.sendMu.Unlock()
	if err != nil {
		// The stream broke (read fails the calls it holds); the transport
		// may still hold msg.
		st.forget(id)
		call.msg = nil
		return nil, status.Convert(err).Err()
	}
	select {
	case <-call.done:
		return c.finish(st, call)
	case <-ctx.Done():
		if !st.forget(id) {
			// The reply, or the stream's end, is on its way: take it.
			<-call.done
			return c.finish(st, call)
		}
		// Tell the shard to stop; the call message may still be queued.
		call.msg = nil
		cancel := codec.Frame(codec.AppendMuxCall(nil, codec.MuxCancel, id, 0, nil))
		st.sendMu.Lock()
		st.stream.SendMsg(&cancel)
		st.sendMu.Unlock()
		muxCalls.Put(call)
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// forget removes call id; false if a reply or the stream's end took it.
func (st *muxStream) forget(id uint64) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if _, ok := st.calls[id]; !ok {
		return false
	}
	delete(st.calls, id)
	return true
}

// finish turns a delivered reply into Lookup's result.
func (c *MuxClient) finish(st *muxStream, call *muxCall) ([]byte, error) {
	resp := call.resp
	call.resp = nil
	defer muxCalls.Put(call)
	switch {
	case call.broken:
		st.mu.Lock()
		err := st.err
		st.mu.Unlock()
		call.msg = nil // the transport may still hold it
		return nil, status.Convert(err).Err()
	case call.code == codes.OK:
		return resp, nil
	}
	return nil, status.Error(call.code, string(resp))
}
