package router

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/hedge"
	"github.com/cumulus-serving/cumulus/internal/partition"
	"github.com/cumulus-serving/cumulus/internal/scratch"
	"github.com/cumulus-serving/cumulus/model"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A request's steps, each a method below: choose the version (Router.
// version), check what the version requires of it (versionRoute.check),
// dedup its ids (work.dedup), group them by partition
// (work.partition), fan out to the shards (Router.fanOut), merge each
// partition's answer once (work.merge, run by whichever call answered
// first) and score (versionRoute.score).
//
// The fan-out is hedged: a call not answered after its delay is sent to
// other replicas of its partitions as well (internal/hedge decides which,
// when and how many), and a call that fails is asked of another replica.
// Calls run on pooled goroutines; the request's goroutine only plans them
// and waits. A call fetches into its own buffer and merges what it won
// into the request's values; one that loses (or outlives the request's
// attempt) is cancelled when the attempt returns (predict's context),
// merges nothing, and keeps the request's scratch from reuse until it
// returns: the last of the request and its calls to finish puts the
// scratch back for reuse.

// work is a request's reusable scratch.
type work struct {
	ids       idIndex
	sharedPos []int32
	pos       []int32
	partOf    []uint32 // per distinct id
	start     []int32  // per partition: first index into byPart
	byPart    []int32  // distinct ids ordered by partition
	keys      []uint64 // byPart's ids
	cursor    []int32  // per partition: next free index into byPart
	vals      []float32
	batch     model.Batch   // the request as its scorer sees it
	scratch   model.Scratch // the scorer's

	// Fan-out state. merged (and the values it guards) is written by
	// calls; the rest only by the request's goroutine.
	merged   []atomic.Bool // per partition: its values are in vals
	asking   []int16       // per partition: calls outstanding for it
	tried    []uint64      // per partition: bit i, replica i was asked
	lagged   []bool        // per partition: a replica answered it does not hold it
	lag      error         // the first such answer
	calls    []*call       // this request's calls; calls[:n] in use
	n        int
	byShard  []int32 // per backend slot: its call while grouping calls, else -1
	due      []*call // while hedging: the calls being hedged
	timer    *time.Timer
	finished chan *call // calls post here as they end; buffered, see fanOut

	refs   atomic.Int32 // the request, and each call still running
	now    int64        // when the request was planned, for backend.load
	firsts int          // the request's first calls
}

// works keeps request scratch across garbage collections (see
// internal/scratch); one grown by a request of over a million ids is let
// go.
var works = scratch.New(8, func() *work {
	w := &work{timer: time.NewTimer(time.Hour)}
	w.timer.Stop()
	return w
}, func(w *work) bool {
	return len(w.ids.slots) <= 1<<21 && cap(w.vals) <= 1<<24 && w.scratch.Bytes() <= 64<<20
})

func getWork() *work {
	w := works.Get()
	w.refs.Store(1)
	w.n = 0
	return w
}

// release drops one reference; the last puts w back for reuse.
func (w *work) release() {
	if w.refs.Add(-1) == 0 {
		works.Put(w)
	}
}

// call is one lookup of one shard for some partitions' keys. Calls are
// reused by later requests; rpc.buf only once a call has succeeded.
type call struct {
	b     *backend
	parts []uint32
	reps  []uint8 // per part: b's index among its replicas
	rpc   rpcBuf
	kind  callKind
	at    time.Time // sent
	hedge time.Time // when to hedge it; zero: never
	done  bool      // seen finished by the request
	won   int       // partitions it merged
	err   error
	// hedged: another replica was asked for some of its partitions
	// because it was slow (not because it failed).
	hedged bool

	// What run, made once per call, needs: the goroutine running it gets
	// no closure allocated per request.
	run func()
	w   *work
	r   *Router
	ctx context.Context
	vr  *versionRoute
}

func (c *call) do() { c.r.ask(c.ctx, c.vr, c.w, c) }

type callKind uint8

const (
	first callKind = iota
	hedged
	retried
)

// rpcBuf is one lookup's reusable request scratch.
type rpcBuf struct {
	sections []codec.Section
	buf      []byte // the encoded request
}

// version is the version of t's model that answers req, given its draw
// (canary.go), with its track's metrics (nil for a pinned request).
func (r *Router) version(t *table, req *Request, d uint64) (*versionRoute, *trackMetrics, error) {
	mr := t.models[req.Model]
	if mr == nil {
		return nil, nil, fmt.Errorf("router: %w: model %q is not served", ErrNotFound, req.Model)
	}
	vr, tm, err := mr.choose(req, d)
	switch {
	case err != nil:
		return nil, nil, err
	case vr == nil && mr.why != "":
		// (Why names what failed to fetch, and from where.)
		return nil, nil, WithReason(fmt.Sprintf("model %q cannot be scored yet", req.Model), fmt.Errorf("router: %w: %s", ErrUnavailable, mr.why))
	case vr == nil:
		return nil, nil, fmt.Errorf("router: %w: model %q has no version with every partition loaded yet", ErrUnavailable, req.Model)
	}
	return vr, tm, nil
}

// dedup numbers the distinct ids of the whole batch, shared features
// included: pos and sharedPos map each occurrence to its number.
func (w *work) dedup(req *Request) {
	w.ids.reset(len(req.IDs) + len(req.SharedIDs))
	w.sharedPos = resize(w.sharedPos, len(req.SharedIDs))
	for i, id := range req.SharedIDs {
		w.sharedPos[i] = w.ids.index(id)
	}
	w.pos = resize(w.pos, len(req.IDs))
	for i, id := range req.IDs {
		w.pos[i] = w.ids.index(id)
	}
}

// rankedBytes is the record size from which distinct ids are numbered
// in partition order (partition): a cache line.
const rankedBytes = 64

// partition groups the distinct ids by partition (a counting sort):
// partition p's keys are keys[start[p]:start[p+1]], and byPart gives
// each one's number.
//
// Wide records (rankedBytes and more: FM of dim 16, FFM, DNN) are then
// numbered again, in that order: byPart[j] = j, pos and sharedPos mapped
// to the new numbers. So merge writes each answer's records into w.vals
// in one sequential run, where otherwise each record landed at a random
// place, several lines missed in cache a record (FFM: 324 bytes). The
// renumbering costs a pass over the occurrences, more than it saves on
// LR's 4-byte records.
func (w *work) partition(vr *versionRoute) {
	uniq := w.ids.uniq
	P := int(vr.partitions)
	w.start = resize(w.start, P+1)
	clear(w.start)
	w.partOf = resize(w.partOf, len(uniq))
	for u, id := range uniq {
		p := partition.Of(id, vr.partitions)
		w.partOf[u] = p
		w.start[p+1]++
	}
	for p := 1; p <= P; p++ {
		w.start[p] += w.start[p-1]
	}
	w.byPart = resize(w.byPart, len(uniq))
	w.keys = resize(w.keys, len(uniq))
	w.cursor = append(w.cursor[:0], w.start[:P]...)
	ranked := 4*vr.width() >= rankedBytes
	for u, p := range w.partOf {
		j := w.cursor[p]
		w.byPart[j] = int32(u)
		w.keys[j] = uniq[u]
		w.cursor[p]++
		if ranked {
			w.partOf[u] = uint32(j) // u's new number; p is not read again
		}
	}
	if ranked {
		for j := range w.byPart {
			w.byPart[j] = int32(j)
		}
		for i, u := range w.pos {
			w.pos[i] = int32(w.partOf[u])
		}
		for i, u := range w.sharedPos {
			w.sharedPos[i] = int32(w.partOf[u])
		}
	}
	w.vals = resize(w.vals, len(uniq)*vr.width())
}

// fanOut asks the shards for every partition's keys and returns once each
// partition's values are merged into w.vals, or with the error that left
// some partition unanswered.
func (r *Router) fanOut(ctx context.Context, vr *versionRoute, w *work) error {
	P := int(vr.partitions)
	w.merged = resize(w.merged, P)
	w.asking = resize(w.asking, P)
	w.tried = resize(w.tried, P)
	w.lagged = resize(w.lagged, P)
	w.lag = nil
	for p := range P {
		w.merged[p].Store(false)
	}
	clear(w.asking)
	clear(w.tried)
	clear(w.lagged)
	// Every call made posts to finished without blocking, even after the
	// request has gone: each asks a replica not asked before for at least
	// one partition, so there are at most (replicas per partition, summed)
	// of them.
	if limit := vr.asks; cap(w.finished) < limit {
		w.finished = make(chan *call, limit)
	}
	for len(w.finished) > 0 {
		<-w.finished
	}

	rot := int(r.rr.Add(1))
	pending := 0
	now := time.Now()
	w.now = now.UnixNano()
	for p := range P {
		if w.start[p] == w.start[p+1] {
			w.merged[p].Store(true)
			continue
		}
		pending++
		reps := vr.replicas[p]
		i := hedge.Pick(r.opts.Hedge.Choice, len(reps), rot+p, 0, func(i int) int64 { return reps[i].load(w.now) })
		w.add(vr, uint32(p), i)
	}
	r.budget.Calls(now, w.n)
	w.firsts = w.n
	r.send(ctx, vr, w, 0, first, now)

	for pending > 0 {
		var wake <-chan time.Time
		if next := w.nextHedge(); !next.IsZero() {
			w.timer.Reset(time.Until(next))
			wake = w.timer.C
		}
		select {
		case c := <-w.finished:
			w.timer.Stop()
			done, err := r.finished(ctx, vr, w, c)
			if err != nil {
				return err
			}
			pending -= done
		case <-wake:
			r.hedge(ctx, vr, w, time.Now())
		case <-ctx.Done():
			w.timer.Stop()
			return ContextError(ctx, "shards")
		}
	}
	w.settleHedges()
	return nil
}

// settleHedges tells each replica whose call was hedged how its hedge
// fared (hedge.Scale), once every partition is answered: the hedge lost
// if the call itself answered one of its partitions first, and won if
// the call was still out or answered none. A call that failed says
// nothing of straggling.
func (w *work) settleHedges() {
	for _, c := range w.calls[:w.n] {
		switch {
		case !c.hedged:
		case !c.done || c.err == nil && c.won == 0:
			c.b.scale.Won()
		case c.err == nil:
			c.b.scale.Lost()
		}
	}
}

// add puts partition p, to be asked of its replica i, into the call
// being grouped for that shard: calls[n:] are grouped, not yet sent.
func (w *work) add(vr *versionRoute, p uint32, i int) {
	b := vr.replicas[p][i]
	w.tried[p] |= 1 << i
	w.asking[p]++
	for len(w.byShard) <= b.slot {
		w.byShard = append(w.byShard, -1)
	}
	ci := w.byShard[b.slot]
	if ci < 0 {
		ci = int32(w.n)
		w.byShard[b.slot] = ci
		if w.n == len(w.calls) {
			c := &call{w: w}
			c.run = c.do
			w.calls = append(w.calls, c)
		}
		c := w.calls[w.n]
		w.n++
		c.b, c.parts, c.reps, c.done, c.won, c.err, c.hedged = b, c.parts[:0], c.reps[:0], false, 0, nil, false
	}
	c := w.calls[ci]
	c.parts = append(c.parts, p)
	c.reps = append(c.reps, uint8(i))
}

// send starts the calls grouped since calls[from:].
func (r *Router) send(ctx context.Context, vr *versionRoute, w *work, from int, kind callKind, now time.Time) {
	for _, c := range w.calls[from:w.n] {
		w.byShard[c.b.slot] = -1
		c.kind, c.at, c.hedge = kind, now, time.Time{}
		if r.opts.Hedge.Off || kind == hedged {
			// a hedge is not hedged again
		} else if d := r.hedgeDelay(vr, c); d > 0 {
			c.hedge = now.Add(d)
			c.b.delay.Set(d.Seconds())
		}
		w.refs.Add(1)
		c.r, c.ctx, c.vr = r, ctx, vr
		if r.pool.Submit(c.run) != nil {
			go c.run() // every pooled worker is busy
		}
	}
}

// hedgeDelay is how long c waits before it is hedged: fixed, or the p95
// of the replicas that could take its partitions over; 0 when none could.
func (r *Router) hedgeDelay(vr *versionRoute, c *call) time.Duration {
	var p95 time.Duration
	alt := false
	for _, p := range c.parts {
		for _, b := range vr.replicas[p] {
			if b != c.b {
				alt = true
				p95 = max(p95, b.latency.P95())
			}
		}
	}
	switch {
	case !alt:
		return 0
	case r.opts.Hedge.Delay > 0:
		return r.opts.Hedge.Delay
	}
	return c.b.scale.Of(hedge.Delay(p95))
}

// nextHedge is when the next outstanding call is due to be hedged; zero
// if none is, or if too many calls are outstanding for any to be a
// straggler (hedge.Straggling): then the request waits for an answer.
func (w *work) nextHedge() time.Time {
	var next time.Time
	out := 0
	for _, c := range w.calls[:w.n] {
		if !c.done {
			out++
		}
	}
	if !hedge.Straggling(out, w.firsts) {
		return next
	}
	for _, c := range w.calls[:w.n] {
		if !c.done && !c.hedge.IsZero() && (next.IsZero() || c.hedge.Before(next)) {
			next = c.hedge
		}
	}
	return next
}

// hedge asks other replicas for the unanswered partitions of every call
// due to be hedged at now, within the budget.
func (r *Router) hedge(ctx context.Context, vr *versionRoute, w *work, now time.Time) {
	from := w.n
	for _, c := range w.calls[:from] {
		if c.done || c.hedge.IsZero() || c.hedge.After(now) {
			continue
		}
		c.hedge = time.Time{}
		if added, _ := w.reask(vr, c, false); added > 0 {
			w.due = append(w.due, c)
		}
	}
	due := w.due
	w.due = w.due[:0]
	if w.n == from {
		return
	}
	if !r.budget.Take(now, w.n-from) {
		r.hedges.overBudget.Add(float64(w.n - from))
		w.ungroup(from)
		return
	}
	for _, c := range due {
		c.hedged = true
	}
	r.hedges.sent.Add(float64(w.n - from))
	r.send(ctx, vr, w, from, hedged, now)
}

// reask groups c's partitions that are not answered yet for asking of
// replicas not asked before. If c failed, every such partition is asked
// again, also one another call is still asking for (that call may be a
// straggler already hedged); it returns how many partitions it grouped,
// and how many no replica is left to answer. If c is slow, only
// partitions no hedge has been sent for are asked.
func (w *work) reask(vr *versionRoute, c *call, failed bool) (added, stranded int) {
	for _, p := range c.parts {
		if w.merged[p].Load() || (!failed && w.asking[p] > 1) {
			continue
		}
		reps := vr.replicas[p]
		i := hedge.Pick(hedge.LeastLoaded, len(reps), int(p), w.tried[p], func(i int) int64 { return reps[i].load(w.now) })
		if i >= 0 {
			w.add(vr, p, i)
			added++
		} else if failed && w.asking[p] == 0 {
			stranded++
		}
	}
	return added, stranded
}

// ungroup forgets the calls grouped since calls[from:], unsent.
func (w *work) ungroup(from int) {
	for _, c := range w.calls[from:w.n] {
		w.byShard[c.b.slot] = -1
		for j, p := range c.parts {
			w.asking[p]--
			w.tried[p] &^= 1 << c.reps[j]
		}
	}
	w.n = from
}

// finished takes in a call that has ended: it returns how many partitions
// the call answered, or the error that leaves one unanswered. A failed
// call's partitions are asked of other replicas when the error allows
// (retryable), whether or not the hedge budget has room: a dead replica's
// calls are always asked again.
func (r *Router) finished(ctx context.Context, vr *versionRoute, w *work, c *call) (int, error) {
	c.done = true
	for _, p := range c.parts {
		w.asking[p]--
	}
	if c.err == nil {
		if c.kind == hedged && c.won > 0 {
			r.hedges.won.Inc()
			r.budget.Won(time.Now(), 1)
		}
		return c.won, nil
	}
	if ctx.Err() != nil {
		return 0, ContextError(ctx, "shards")
	}
	if !retryable(ctx, c.err) {
		// It stands unless other calls are asking for all it left.
		for _, p := range c.parts {
			if !w.merged[p].Load() && w.asking[p] == 0 {
				return 0, c.err
			}
		}
		return 0, nil
	}
	if status.Code(c.err) == codes.FailedPrecondition {
		for _, p := range c.parts {
			w.lagged[p] = true
		}
		if w.lag == nil {
			w.lag = c.err
		}
	}
	from := w.n
	if _, stranded := w.reask(vr, c, true); stranded > 0 {
		w.ungroup(from)
		return 0, w.strandedError(c)
	}
	if w.n > from {
		r.retries.WithLabelValues("replica").Inc()
		r.send(ctx, vr, w, from, retried, time.Now())
	}
	return 0, nil
}

// strandedError is the error of failed call c, some of whose partitions
// no replica is left to answer: if a replica answered one of those that
// it does not hold, the routing table lags the cluster and the request
// may run again on the next one (Predict), whatever the order the
// replicas failed in; else c's own.
func (w *work) strandedError(c *call) error {
	for _, p := range c.parts {
		if !w.merged[p].Load() && w.asking[p] == 0 && w.lagged[p] {
			return w.lag
		}
	}
	return c.err
}

// ask makes call c and merges what it wins. It runs on its own goroutine
// and holds a reference to w until it has posted c to w.finished.
func (r *Router) ask(ctx context.Context, vr *versionRoute, w *work, c *call) {
	defer w.release()
	rb := &c.rpc
	rb.sections = rb.sections[:0]
	n := 0
	for _, p := range c.parts {
		keys := w.keys[w.start[p]:w.start[p+1]]
		rb.sections = append(rb.sections, codec.Section{Partition: p, Keys: keys})
		n += len(keys)
	}
	b := c.b
	// Records as stored (fp16, int8: a half or a quarter of the bytes)
	// from a shard that offers them; float32s from any other.
	enc := codec.EncFP32
	if vr.enc != codec.EncFP32 && b.offers(vr.enc) {
		enc = vr.enc
		rb.buf = codec.AppendStoredLookupRequest(rb.buf[:0], vr.model, vr.version, rb.sections)
	} else {
		rb.buf = codec.AppendLookupRequest(rb.buf[:0], vr.model, vr.version, rb.sections)
	}
	b.inflight.Add(1)
	raw, err := b.svc.Lookup(ctx, rb.buf)
	b.inflight.Add(-1)
	d := time.Since(c.at)
	var resp codec.LookupResponse
	failed := err != nil && ctx.Err() == nil // else cancelled: the request went on without it
	if err != nil {
		rb.buf = nil // the transport may still hold it
		c.err = shardError(ctx, b.id, c.parts, err)
	} else if err := resp.Decode(raw, n, vr.width(), enc); err != nil {
		c.err = WithReason(partsReason(ErrUnavailable, c.parts), fmt.Errorf("router: %w: shard %s answered badly: %v", ErrUnavailable, b.id, err))
		failed = true
	}
	switch {
	case c.err == nil:
		b.calls.ok.Observe(d.Seconds())
		b.latency.Observe(d)
		c.won = w.merge(vr, c.parts, &resp)
	case failed:
		b.calls.failed.Observe(d.Seconds())
		b.failedAt.Store(time.Now().UnixNano())
		// The reason (a refused TLS handshake, a shard gone) is logged
		// here only: the caller may see another replica's answer. Repeats
		// are rate-limited by the process's log handler.
		slog.Warn("router: shard call failed", "shard", b.id, "addr", b.addr, "err", c.err)
	default:
		b.calls.cancelled.Observe(d.Seconds())
	}
	if rc, ok := b.svc.(interface{ Recycle([]byte) }); ok && err == nil {
		rc.Recycle(raw) // merged: resp's bytes are read no more
	}
	w.finished <- c
}

// merge writes resp's values for each of parts not merged before into
// w.vals (zeros for ids the model lacks) and returns how many it merged.
// Partitions hold disjoint ids, so calls merge concurrently.
func (w *work) merge(vr *versionRoute, parts []uint32, resp *codec.LookupResponse) int {
	width := vr.width()
	won, i, k := 0, 0, 0
	for _, p := range parts {
		ids := w.byPart[w.start[p]:w.start[p+1]]
		if !w.merged[p].CompareAndSwap(false, true) {
			for range ids {
				if resp.Found(i) {
					k++
				}
				i++
			}
			continue
		}
		won++
		for _, u := range ids {
			dst := w.vals[int(u)*width : int(u+1)*width]
			if resp.Found(i) {
				resp.Record(k, dst)
				k++
			} else {
				clear(dst) // absent features score zero
			}
			i++
		}
	}
	return won
}
