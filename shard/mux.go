package shard

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/codec"
)

// LookupStreamMethod is the full gRPC method name of the multiplexed
// lookup stream (codec/mux.go): routers keep one open per shard and send
// every lookup over it.
const LookupStreamMethod = "/cumulus.shard.v1.Shard/LookupStream"

const (
	// maxStreamCalls bounds the lookups one stream may have at a shard,
	// from their arrival until their replies are queued: past it the
	// shard stops reading the stream until one has been answered, and
	// gRPC's flow control holds the sender back.
	maxStreamCalls = 4096
	// streamQueue is how many messages wait for a stream's one writer,
	// at either end.
	streamQueue = 256
)

// serveStream answers the lookups of one multiplexed stream, each on its
// own goroutine, and replies through one writer in the order they
// finish. A malformed message ends the stream (InvalidArgument). Once a
// drain has gone quiet (Shard.quiet) nothing more is read from the
// stream, and it ends when none of its lookups is under way: the router
// fails what it sent since with Unavailable and asks another replica. A peer that stops reading its replies holds the writer, and so
// the lookups; only the end of the stream (or the server's) frees them:
// a drain then runs into its timeout.
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
	out := make(chan codec.Frame, streamQueue)
	stop, written := make(chan struct{}), make(chan struct{})
	// The writer: SendMsg is not safe for concurrent use. Each reply is in
	// a buffer of codec.GetFrameBuffer's, given back once written.
	go func() {
		defer close(written)
		var m codec.Frame
		for {
			select {
			case m = <-out:
			case <-stop: // what is queued still goes
				select {
				case m = <-out:
				default:
					return
				}
			}
			if stream.SendMsg(&codec.PooledFrame{B: m}) != nil {
				return
			}
		}
	}()
	var (
		mu      sync.Mutex
		calls   = map[uint64]context.CancelFunc{}
		running sync.WaitGroup
		ended   = make(chan struct{}, 1) // a lookup's reply was queued
		done    = make(chan struct{})    // the handler is returning
	)
	defer func() {
		mu.Lock()
		for _, cancel := range calls {
			cancel()
		}
		mu.Unlock()
		close(done)
		running.Wait()
		close(stop)
		<-written
	}()
	underWay := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(calls)
	}
	quiet := s.quiet
	for {
		if n := underWay(); n >= maxStreamCalls || (quiet == nil && n > 0) {
			// At the bound, or drained with lookups still under way: wait
			// for one to be answered before reading on.
			select {
			case <-ended:
				continue
			case <-ctx.Done():
				return nil
			}
		} else if quiet == nil {
			return nil // drained, and idle
		}
		var r received
		select {
		case r = <-in:
		case <-quiet:
			quiet = nil
			continue
		case <-ctx.Done():
			return nil
		}
		if r.err != nil {
			if errors.Is(r.err, io.EOF) {
				return nil
			}
			return r.err
		}
		kind, id, timeout, body, err := codec.ParseMuxCall(r.msg)
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
		if _, dup := calls[id]; dup {
			mu.Unlock()
			return status.Errorf(codes.InvalidArgument, "lookup stream: call %d is already under way", id)
		}
		// The deadline is the caller's time left, from now on this
		// shard's clock: the two clocks need not agree.
		var cctx context.Context
		var cancel context.CancelFunc
		if timeout > 0 {
			cctx, cancel = context.WithTimeout(ctx, time.Duration(timeout))
		} else {
			cctx, cancel = context.WithCancel(ctx)
		}
		calls[id] = cancel
		mu.Unlock()
		running.Add(1)
		go func() {
			defer running.Done()
			var header [16]byte
			reply, err := s.lookup(cctx, body, codec.AppendMuxReply(header[:0], id, 0, nil))
			codec.PutFrameBuffer(r.msg) // the request: nothing reads it after the lookup
			cancel()
			if err != nil {
				st := status.Convert(err)
				m := st.Message()
				if len(m) > codec.MaxMuxMessage {
					m = m[:codec.MaxMuxMessage]
				}
				reply = codec.AppendMuxReply(nil, id, uint8(st.Code()), []byte(m))
			}
			select {
			case out <- reply:
			case <-done:
			}
			mu.Lock()
			delete(calls, id)
			mu.Unlock()
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
	conn    *grpc.ClientConn
	mu      sync.Mutex
	cur     *muxStream
	opening chan struct{} // closed when the stream being opened is, or failed to
	openErr error
}

// NewMuxClient wraps a connection to a shard.
func NewMuxClient(conn *grpc.ClientConn) *MuxClient { return &MuxClient{conn: conn} }

// String names the peer, for errors and logs.
func (c *MuxClient) String() string { return "shard at " + c.conn.Target() }

var streamDesc = grpc.StreamDesc{StreamName: "LookupStream", ServerStreams: true, ClientStreams: true}

type muxStream struct {
	stream grpc.ClientStream
	ctx    context.Context
	cancel context.CancelFunc
	out    chan codec.Frame // messages for write
	sent   codec.Frame      // write's: the message being sent
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
	msg    codec.Frame   // the call message
	resp   []byte        // the reply's body, in its own message
	code   codes.Code
	broken bool // no reply: the stream broke
}

var muxCalls = sync.Pool{New: func() any { return &muxCall{done: make(chan struct{}, 1)} }}

// stream is the stream to send on, opened if there is none or it broke.
// Opening waits for the connection, but each caller only until its ctx
// ends.
func (c *MuxClient) stream(ctx context.Context) (*muxStream, error) {
	for {
		c.mu.Lock()
		if st := c.cur; st != nil && st.alive() {
			c.mu.Unlock()
			return st, nil
		}
		if c.opening == nil {
			c.opening = make(chan struct{})
			go c.open(c.opening)
		}
		opening := c.opening
		c.mu.Unlock()
		select {
		case <-opening:
			c.mu.Lock()
			st, err := c.cur, c.openErr
			c.mu.Unlock()
			if st == nil || !st.alive() {
				if err == nil {
					err = status.Error(codes.Unavailable, "lookup stream ended as it opened")
				}
				return nil, err
			}
			return st, nil
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
}

// open opens a stream in the background and closes done.
func (c *MuxClient) open(done chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	cs, err := c.conn.NewStream(ctx, &streamDesc, LookupStreamMethod, grpc.CallContentSubtype(codec.GRPCCodecName))
	var st *muxStream
	if err != nil {
		cancel()
		if c.conn.GetState() == connectivity.Shutdown {
			err = status.Error(codes.Canceled, "the connection to the shard is closed")
		}
		err = status.Convert(err).Err()
	} else {
		st = &muxStream{stream: cs, ctx: ctx, cancel: cancel, out: make(chan codec.Frame, streamQueue), calls: map[uint64]*muxCall{}}
		go st.read()
		go st.write()
	}
	c.mu.Lock()
	if st != nil {
		c.cur = st
	}
	c.openErr, c.opening = err, nil
	c.mu.Unlock()
	close(done)
}

func (st *muxStream) alive() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.err == nil
}

// fail breaks the stream with err (the first reason stands) and fails
// every call waiting on it.
func (st *muxStream) fail(err error) {
	st.cancel()
	st.mu.Lock()
	if st.err != nil {
		st.mu.Unlock()
		return
	}
	if s, ok := status.FromError(err); !ok || s.Code() == codes.Unknown {
		// io.EOF and the like: the shard (or the connection) went away.
		err = status.Errorf(codes.Unavailable, "lookup stream broke: %v", err)
	}
	st.err = err
	calls := st.calls
	st.calls = nil
	st.mu.Unlock()
	for _, call := range calls {
		call.broken = true
		call.done <- struct{}{}
	}
}

// read delivers replies to their calls until the stream breaks.
func (st *muxStream) read() {
	for {
		// Each message is a new slice (the codec copies what gRPC hands
		// it into a buffer of its pool); only the variable is reused.
		if err := st.stream.RecvMsg(&st.in); err != nil {
			st.fail(err)
			return
		}
		id, code, body, err := codec.ParseMuxReply(st.in)
		if err != nil {
			st.fail(status.Errorf(codes.Internal, "lookup stream: %v", err))
			return
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
}

// write sends what callers queue, one message at a time, until the
// stream breaks: a caller waits for room in the queue, not for the
// stream, and gives up when its context ends.
func (st *muxStream) write() {
	for {
		select {
		case st.sent = <-st.out:
			// SendMsg encodes the message before it returns (the bytes go
			// on to the transport, which is why a caller drops a message
			// it gave up on rather than reuse it).
			if err := st.stream.SendMsg(&st.sent); err != nil {
				st.fail(err)
				return
			}
		case <-st.ctx.Done():
			return
		}
	}
}

// Lookup implements Service. The returned bytes are the caller's.
func (c *MuxClient) Lookup(ctx context.Context, req []byte) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	st, err := c.stream(ctx)
	if err != nil {
		return nil, err
	}
	call := muxCalls.Get().(*muxCall)
	st.mu.Lock()
	if st.err != nil {
		err := st.err
		st.mu.Unlock()
		muxCalls.Put(call)
		return nil, err
	}
	st.next++
	id := st.next
	st.calls[id] = call
	st.mu.Unlock()
	var timeout int64
	if d, ok := ctx.Deadline(); ok {
		timeout = max(int64(time.Until(d)), 1)
	}
	call.msg = codec.AppendMuxCall(call.msg[:0], codec.MuxLookup, id, timeout, req)
	select {
	case st.out <- call.msg:
	case <-st.ctx.Done(): // broke: fail has taken the call, or will
	case <-ctx.Done():
		if st.forget(id) {
			muxCalls.Put(call) // never queued
			return nil, status.FromContextError(ctx.Err()).Err()
		}
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
		// Tell the shard to stop, if the queue has room (else the call's
		// own deadline stops it). The writer may still hold call.msg.
		call.msg = nil
		select {
		case st.out <- codec.AppendMuxCall(nil, codec.MuxCancel, id, 0, nil):
		default:
		}
		muxCalls.Put(call)
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// Recycle gives the buffer of an answer of Lookup's back to the codec's
// pool: the caller uses none of its bytes any more. b must be an answer
// this client's Lookup returned.
func (c *MuxClient) Recycle(b []byte) { codec.PutReplyBody(b) }

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
		return nil, err
	case call.code == codes.OK:
		return resp, nil
	}
	return nil, status.Error(call.code, string(resp))
}
