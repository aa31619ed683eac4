package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cumulus-serving/cumulus/internal/peerlimit"
	"github.com/cumulus-serving/cumulus/router"
)

// A request is received before it is admitted: while its bytes arrive it
// holds no request slot, only the memory they take, counted here against
// a budget for all requests in reception (Options.MaxReceivingBytes) and
// one for each client address (Options.MaxReceivingPerPeer), and only
// for its receive time (Options.ReceiveTimeout). So slow senders, however
// many, cannot hold the slots that requests ready to be worked on need,
// and cannot buy more memory than the bytes they actually send.
//
// What is counted: an HTTP body by the pooled chunks it has been read
// into (body.go), a gRPC message by its DATA frames' bytes as they
// arrive (h2watch.go) and whole once it has, and every request a fixed
// overhead for what it holds besides (a goroutine, a connection's
// buffers), so that a client address is also bounded in the number of
// requests it has in reception.

// receiveOverhead is what every request in reception is counted at
// besides its bytes.
const receiveOverhead = 4 << 10

// bodyCharge is the most an HTTP body of n bytes is charged in
// reception: the overhead and its chunks.
func bodyCharge(n int64) int64 {
	return receiveOverhead + firstChunk + chunkSize + n
}

// reception counts the bytes of requests in reception, in all and by
// client address. Safe for concurrent use; one lock, taken a few times a
// request (once per chunk of a body).
type reception struct {
	total, perPeer int64
	mu             sync.Mutex
	room           *sync.Cond // on mu: signalled when bytes are given back
	held           int64
	peers          map[string]int64
	// arriving counts the requests in reception: under load they are
	// about to want a slot, and the refusal admission makes before
	// reading counts them as queued (admitting).
	arriving atomic.Int64
}

func newReception(o *Options) *reception {
	r := &reception{total: o.MaxReceivingBytes, perPeer: o.MaxReceivingPerPeer, peers: map[string]int64{}}
	r.room = sync.NewCond(&r.mu)
	return r
}

// receiving is one request's share of reception. Not safe for
// concurrent use; done must be called once.
type receiving struct {
	r        *reception
	peer     string
	n        int64
	arriving bool // counted in r.arriving
}

// begin starts a request's reception from addr (a "host:port" remote
// address), charging it overhead.
func (r *reception) begin(addr string, overhead int64) (*receiving, error) {
	x := &receiving{r: r, peer: peerlimit.Host(addr)}
	if err := x.take(overhead); err != nil {
		return x, err
	}
	r.arriving.Add(1)
	x.arriving = true
	return x, nil
}

// arrived ends the request's reception: its bytes are all here (or
// never will be).
func (x *receiving) arrived() {
	if x == nil || !x.arriving {
		return
	}
	x.r.arriving.Add(-1)
	x.arriving = false
}

// admitting is how many requests are about to queue for a slot: those
// in reception. Slow senders are among them, so they make a front at
// its capacity refuse sooner; they cannot make one below it refuse
// (admit.Gate.Refusing).
func (r *reception) admitting() int64 { return r.arriving.Load() }

// errReceiving names the reception bound a request was refused by:
// "receiving" (all requests) or "peer" (its client address).
type errReceiving struct{ bound string }

func (e errReceiving) Error() string {
	if e.bound == "peer" {
		return "the requests in reception from this client address hold as many bytes as one address may"
	}
	return "the requests in reception hold as many bytes as the server allows"
}

// take charges n more bytes, or refuses them when a bound would be past.
func (x *receiving) take(n int64) error {
	r := x.r
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.peers[x.peer]+n > r.perPeer:
		return errReceiving{"peer"}
	case r.held+n > r.total:
		return errReceiving{"receiving"}
	}
	x.charge(n)
	return nil
}

// force charges n more bytes whatever the bounds: bytes already read
// (h2watch), which the caller then waits to see reception back within
// its bounds for (within).
func (x *receiving) force(n int64) {
	x.r.mu.Lock()
	defer x.r.mu.Unlock()
	x.charge(n)
}

// charge adds n (negative: gives back -n) to x's charge, its address's
// and all reception's. Called with x.r.mu held.
func (x *receiving) charge(n int64) {
	r := x.r
	r.held += n
	x.n += n
	if p := r.peers[x.peer] + n; p > 0 {
		r.peers[x.peer] = p
	} else {
		delete(r.peers, x.peer)
	}
}

// within waits until reception, all of it and x's address's share, is
// within its bounds again, and reports whether it was by deadline, and
// before stop said to give up.
func (x *receiving) within(deadline time.Time, stop func() bool) bool {
	r := x.r
	wake := time.AfterFunc(time.Until(deadline), r.wake)
	defer wake.Stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	for r.held > r.total || r.peers[x.peer] > r.perPeer {
		if stop() || !time.Now().Before(deadline) {
			return false
		}
		r.room.Wait()
	}
	return true
}

// wake wakes the waiters of within, to look again (at stop).
func (r *reception) wake() {
	r.mu.Lock()
	r.room.Broadcast()
	r.mu.Unlock()
}

// give gives back n of what x was charged.
func (x *receiving) give(n int64) {
	if n <= 0 {
		return
	}
	r := x.r
	r.mu.Lock()
	defer r.mu.Unlock()
	x.charge(-n)
	r.room.Broadcast()
}

// done gives back everything the request was charged.
func (x *receiving) done() {
	x.arrived()
	if x != nil {
		x.give(x.n)
	}
}

// bytes is what all requests in reception are charged now.
func (r *reception) bytes() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.held
}

// receiveDeadline is when a request that arrived at t0 must have arrived
// whole: ReceiveTimeout, plus 200ms per MB of an announced length (an
// HTTP body's Content-Length; -1 when unknown), and never after the
// request's own deadline.
func (s *Server) receiveDeadline(t0 time.Time, announced int64, request time.Time) time.Time {
	d := s.opts.ReceiveTimeout
	if announced > 0 {
		d += time.Duration(announced) * receivePerByte
	}
	if at := t0.Add(d); at.Before(request) {
		return at
	}
	return request
}

// receivePerByte is the receive time an announced byte adds: 200ms per
// MB, 5 MB/s, slower than any client a ranking service runs.
const receivePerByte = 200 * time.Millisecond / 1e6

// receiveRefusal is the error for a request refused by a reception bound.
func (s *Server) receiveRefusal(api string, e errReceiving, t0 time.Time) error {
	s.adm.refused.WithLabelValues(api, e.bound).Inc()
	s.adm.refusedIn.Observe(time.Since(t0).Seconds())
	return fmt.Errorf("server: %w: %s; retry later", router.ErrResourceExhausted, e.Error())
}

// A request cut off for arriving too slowly is answered late: it gets
// its 408 or DeadlineExceeded once HeaderTimeout has passed since it
// arrived. Answered at once, a sender that opens a request again
// whenever one is cut would open them as fast as the front cuts them:
// 300 streams from one address, each trickling a byte a second, cut at
// the 200ms receive time, were reopened 1,500 times a second and cost
// the router 12% of a core on this project's 2-core machine (held: 1%;
// cumulus bench hostile --slow grpc --streams 300).
//
// Meanwhile an HTTP request's connection is not read. A gRPC stream's
// read goes on (grpc-go has opened its window for the whole message),
// its DATA counted in reception as it arrives (h2watch); it is answered
// at once if its message arrives whole after all, the message freed. So
// a held request holds what its bytes weigh, counted, for longer than
// its receive time: it is answered at once instead while reception for
// all requests is past half its bound, where other clients' requests
// want the room (its own address's share full costs only that address).
// The wait also ends when a gRPC client gives up (its deadline, a
// cancel; the front's RequestTimeout does not end it) and when the front
// stops. Past maxHeldCuts held at once, all clients together, a cut
// request is answered at once.
const maxHeldCuts = 1024

// holdCut waits, for a request that arrived at t0 and was cut off for
// arriving too slowly, until HeaderTimeout after t0, ctx's end,
// ended's close (nil: never) or the front's stop; not at all while
// reception is pressed.
func (s *Server) holdCut(ctx context.Context, t0 time.Time, ended <-chan struct{}) {
	wait := time.Until(t0.Add(s.opts.HeaderTimeout))
	if wait <= 0 || s.recv.pressed() {
		return
	}
	if s.heldCuts.Add(1) > maxHeldCuts {
		s.heldCuts.Add(-1)
		return
	}
	defer s.heldCuts.Add(-1)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-ended:
	case <-s.holds.Done():
	case <-t.C:
	}
}

// pressed reports whether reception for all requests is past half its
// bound.
func (r *reception) pressed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.held > r.total/2
}

// errReceiveTimeout is the error for a request whose bytes did not arrive
// within its receive time: got of them did.
// (-1: not known).
func errReceiveTimeout(what string, got int64, d time.Duration) error {
	arrived := ""
	if got >= 0 {
		arrived = fmt.Sprintf(" (%d of its bytes did)", got)
	}
	return fmt.Errorf("server: %w: %s did not arrive within its receive time of %s%s; send it faster or split it",
		errReceiveTooSlow, what, d.Round(time.Millisecond), arrived)
}

// errReceiveTooSlow marks a request cut off for arriving too slowly (HTTP
// 408, gRPC DeadlineExceeded), as opposed to one that missed its own
// deadline (504).
var errReceiveTooSlow = errors.New("request timeout")
