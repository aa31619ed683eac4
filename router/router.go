package router

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/panjf2000/ants/v2"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/partition"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/shard"
)

// Options configure a router. Zero values mean the documented default.
type Options struct {
	// Etcd is the cluster store the router watches; required.
	Etcd *clientv3.Client
	// Cluster names the cluster; keys sit under /cumulus/NAME/. Default
	// "default".
	Cluster topo.Cluster
	// Limits bound each request.
	Limits Limits
	// FanoutWorkers is the number of pooled goroutines making shard
	// calls; past it, a call gets a goroutine of its own (admission is the
	// front's, see server.Options). Default 512.
	FanoutWorkers int
	// DefaultTimeout bounds every request: its deadline is the shorter of
	// its own and this. Default 1s.
	DefaultTimeout time.Duration
	// Dial connects to a shard. Default: gRPC without TLS. Tests use it
	// to wrap shards with controllable faults.
	Dial func(addr string) (shard.Service, io.Closer, error)
	// Registry receives the router's metrics; nil registers nowhere.
	Registry prometheus.Registerer
}

// Validate checks required fields and fills defaults.
func (o *Options) Validate() error {
	if o.Etcd == nil {
		return errors.New("router: Options.Etcd is required")
	}
	o.Cluster = o.Cluster.OrDefault()
	if err := o.Cluster.Validate(); err != nil {
		return err
	}
	var err error
	if o.Limits, err = o.Limits.OrDefault(); err != nil {
		return err
	}
	if o.FanoutWorkers == 0 {
		o.FanoutWorkers = 512
	}
	if o.DefaultTimeout == 0 {
		o.DefaultTimeout = time.Second
	}
	if o.Dial == nil {
		o.Dial = dialGRPC
	}
	return nil
}

func dialGRPC(addr string) (shard.Service, io.Closer, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20)))
	if err != nil {
		return nil, nil, err
	}
	return shard.NewClient(conn), conn, nil
}

// Router answers predict calls by fanning out to shards. It is safe for
// concurrent use; requests never lock.
type Router struct {
	opts     Options
	tab      atomic.Pointer[table]
	pool     *ants.Pool
	rr       atomic.Uint64
	cancel   context.CancelFunc
	done     sync.WaitGroup
	shardRPC *prometheus.HistogramVec
	retries  *prometheus.CounterVec
}

// Start begins watching etcd. It returns at once; Ready reports when
// every assigned model can be served.
func Start(ctx context.Context, opts Options) (*Router, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	// Non-blocking: a request never waits for a pooled worker.
	pool, err := ants.NewPool(opts.FanoutWorkers, ants.WithNonblocking(true))
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &Router{opts: opts, pool: pool, cancel: cancel}
	r.shardRPC = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "cumulus_router_shard_call_seconds", Help: "Router→shard lookup latency by outcome.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16),
	}, []string{"outcome"})
	r.retries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cumulus_router_retries_total",
		Help: "Lookups asked again: of another replica of the same partitions (replica), or whole requests run again on a newer routing table (table).",
	}, []string{"kind"})
	if opts.Registry != nil {
		for _, c := range []prometheus.Collector{r.shardRPC, r.retries} {
			if err := opts.Registry.Register(c); err != nil {
				cancel()
				return nil, fmt.Errorf("router: metrics: %w", err)
			}
		}
	}
	r.tab.Store(&table{models: map[string]*modelRoute{}, replaced: make(chan struct{})})
	r.done.Add(1)
	go func() { defer r.done.Done(); r.watch(ctx) }()
	return r, nil
}

// Close stops watching and closes shard connections.
func (r *Router) Close() {
	r.cancel()
	r.done.Wait()
	r.pool.Release()
}

// watch rebuilds the routing table whenever shards or assignments
// change. Connections are opened for new shard addresses and closed once
// a table without them is in place.
func (r *Router) watch(ctx context.Context) {
	type event struct {
		shards  map[string]topo.ShardInfo
		assigns map[string]topo.Assignment
		rev     int64
	}
	events := make(chan event, 1)
	var watcher sync.WaitGroup
	defer watcher.Wait() // after ctx ends, the watch returns
	// One watch over the whole cluster prefix: etcd delivers its events in
	// revision order, so when the router sees the manager commit a version
	// it has already seen the shard reports the manager committed on. The
	// manager's own state under the same prefix is not kept.
	// (Two watches, one per prefix, could show the commit first and leave
	// the router without a complete live version for a moment.)
	c := r.opts.Cluster
	watcher.Add(1)
	go func() {
		defer watcher.Done()
		serving := func(k string) bool {
			return strings.HasPrefix(k, c.ShardsPrefix()) || strings.HasPrefix(k, c.ModelsPrefix())
		}
		topo.WatchKeys(ctx, r.opts.Etcd, c.Prefix(), serving, func(kv map[string][]byte, rev int64) {
			shards, models := map[string][]byte{}, map[string][]byte{}
			for k, v := range kv {
				switch {
				case strings.HasPrefix(k, c.ShardsPrefix()):
					shards[k] = v
				case strings.HasPrefix(k, c.ModelsPrefix()):
					models[k] = v
				}
			}
			ev := event{shards: topo.DecodeAll[topo.ShardInfo](shards, c.ShardsPrefix()), assigns: topo.Assignments(models, c), rev: rev}
			select {
			case <-events: // keep only the newest
			default:
			}
			select {
			case events <- ev:
			case <-ctx.Done():
			}
		})
	}()
	backends := map[string]*backend{}
	closers := map[string]io.Closer{}
	var shards map[string]topo.ShardInfo
	var assigns map[string]topo.Assignment
	var rev int64
	leaving := &lingering{after: r.opts.DefaultTimeout, closers: map[*time.Timer]io.Closer{}}
	defer func() {
		for _, c := range closers {
			c.Close()
		}
		leaving.closeAll()
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-events:
			shards, assigns, rev = ev.shards, ev.assigns, ev.rev
		}
		live := map[string]bool{}
		for _, si := range shards {
			live[si.Addr] = true
			if backends[si.Addr] != nil {
				continue
			}
			svc, c, err := r.opts.Dial(si.Addr)
			if err != nil {
				slog.Error("router: dialing shard", "shard", si.ID, "addr", si.Addr, "err", err)
				continue
			}
			backends[si.Addr] = &backend{id: si.ID, addr: si.Addr, svc: svc}
			closers[si.Addr] = c
		}
		tab := buildTable(shards, assigns, backends)
		tab.rev = rev
		old := r.tab.Swap(tab)
		close(old.replaced)
		for addr := range backends {
			if !live[addr] {
				leaving.close(closers[addr])
				delete(backends, addr)
				delete(closers, addr)
			}
		}
	}
}

// lingering closes the connections of shards that left once the requests
// that may still be asking them are past their deadlines: a request
// routed by an older table may still be asking such a shard (a draining
// shard answers it), and closing the connection at once would cancel the
// call. No request lives past DefaultTimeout.
type lingering struct {
	after   time.Duration
	mu      sync.Mutex
	closers map[*time.Timer]io.Closer
}

// close closes c after l.after.
func (l *lingering) close(c io.Closer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var t *time.Timer
	t = time.AfterFunc(l.after, func() {
		l.mu.Lock()
		delete(l.closers, t)
		l.mu.Unlock()
		c.Close()
	})
	l.closers[t] = c
}

// closeAll closes every connection still waiting, at once.
func (l *lingering) closeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for t, c := range l.closers {
		if t.Stop() {
			c.Close()
		}
	}
}

// Revision is the etcd revision of the cluster state the routing table in
// use reflects.
func (r *Router) Revision() int64 { return r.tab.Load().rev }

// ModelStatus describes one model as served now.
type ModelStatus struct {
	Name     string
	Ready    bool
	Live     uint64   // version answering unpinned requests; 0 if none
	Versions []uint64 // every servable version, ascending
	Type     string
	Dim      int
}

// Models lists every assigned model.
func (r *Router) Models() []ModelStatus {
	t := r.tab.Load()
	var out []ModelStatus
	for name := range t.models {
		out = append(out, r.status(t, name))
	}
	slices.SortFunc(out, func(a, b ModelStatus) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// Model describes one model; ok is false if it is not assigned.
func (r *Router) Model(name string) (ModelStatus, bool) {
	t := r.tab.Load()
	if t.models[name] == nil {
		return ModelStatus{}, false
	}
	return r.status(t, name), true
}

func (r *Router) status(t *table, name string) ModelStatus {
	mr := t.models[name]
	s := ModelStatus{Name: name}
	for v := range mr.versions {
		s.Versions = append(s.Versions, v)
	}
	slices.Sort(s.Versions)
	if mr.live != nil {
		s.Ready, s.Live, s.Type, s.Dim = true, mr.live.version, mr.live.typ, mr.live.dim
	}
	return s
}

// Ready reports whether every assigned model is servable, and at least
// one model is assigned.
func (r *Router) Ready() bool {
	t := r.tab.Load()
	for _, mr := range t.models {
		if mr.live == nil {
			return false
		}
	}
	return len(t.models) > 0
}

// call is the work of one shard in one request. Its slices are reused
// by later requests.
type call struct {
	b     *backend
	parts []uint32 // partitions asked of this shard, ascending
	rpc   rpcBuf
	err   error
}

// rpcBuf is one lookup's reusable request scratch.
type rpcBuf struct {
	sections []codec.Section
	buf      []byte // the encoded request
}

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
	fmBuf     []float64
	calls     []call
}

var workPool = sync.Pool{New: func() any { return new(work) }}

// maxAttempts bounds how often Predict runs a request against a newer
// routing table after shards answered that they no longer hold what the
// table said.
const maxAttempts = 3

// Predict scores every row of req.
//
// The routing table can lag the shards by a moment (a shard drops a
// partition it handed over, or a version retired at a commit, before this
// router has seen the news). A shard then answers FailedPrecondition and
// its partitions are asked of another replica; if none has them, the
// request waits for the next routing table and runs again, within its
// deadline and at most maxAttempts times. A partition none of whose
// replicas can be reached fails the request at once (ErrUnavailable):
// waiting would only spend the caller's deadline.
//
// The request's deadline is the shorter of ctx's and DefaultTimeout; it
// reaches every shard call, and a missed one is ErrDeadlineExceeded.
func (r *Router) Predict(ctx context.Context, req *Request) (*Response, error) {
	if err := req.Validate(r.opts.Limits); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.DefaultTimeout)
	defer cancel()
	t := r.tab.Load()
	for attempt := 1; ; attempt++ {
		resp, err := r.predict(ctx, t, req)
		if err == nil || attempt == maxAttempts || ctx.Err() != nil || status.Code(err) != codes.FailedPrecondition {
			return resp, err
		}
		select {
		case <-t.replaced:
		case <-ctx.Done():
			return nil, ContextError(ctx, "a routing table where every partition is held")
		}
		r.retries.WithLabelValues("table").Inc()
		t = r.tab.Load()
	}
}

// predict answers req from routing table t.
func (r *Router) predict(ctx context.Context, t *table, req *Request) (*Response, error) {
	mr := t.models[req.Model]
	if mr == nil {
		return nil, fmt.Errorf("router: %w: model %q is not served", ErrNotFound, req.Model)
	}
	vr := mr.live
	if req.Version != 0 {
		if vr = mr.versions[req.Version]; vr == nil {
			return nil, fmt.Errorf("router: %w: model %q version %d is not served (servable: %v)", ErrNotFound, req.Model, req.Version, r.status(t, req.Model).Versions)
		}
	}
	if vr == nil {
		return nil, fmt.Errorf("router: %w: model %q has no version with every partition loaded yet", ErrUnavailable, req.Model)
	}
	w := workPool.Get().(*work)
	defer workPool.Put(w)

	// Dedup across the whole batch, shared features included.
	w.ids.reset(len(req.IDs) + len(req.SharedIDs))
	w.sharedPos = w.sharedPos[:0]
	for _, id := range req.SharedIDs {
		w.sharedPos = append(w.sharedPos, w.ids.index(id))
	}
	w.pos = w.pos[:0]
	for _, id := range req.IDs {
		w.pos = append(w.pos, w.ids.index(id))
	}
	uniq := w.ids.uniq

	// Group distinct ids by partition (counting sort).
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
	for u, p := range w.partOf {
		w.byPart[w.cursor[p]] = int32(u)
		w.keys[w.cursor[p]] = uniq[u]
		w.cursor[p]++
	}

	// One call per shard, one replica per partition, rotating replicas.
	rot := int(r.rr.Add(1))
	w.calls = w.calls[:0]
	for p := 0; p < P; p++ {
		if w.start[p] == w.start[p+1] {
			continue
		}
		reps := vr.replicas[p]
		b := reps[(rot+p)%len(reps)]
		ci := slices.IndexFunc(w.calls, func(c call) bool { return c.b == b })
		if ci < 0 {
			ci = len(w.calls)
			if ci < cap(w.calls) {
				w.calls = w.calls[:ci+1]
			} else {
				w.calls = append(w.calls, call{})
			}
			w.calls[ci].b, w.calls[ci].parts, w.calls[ci].err = b, w.calls[ci].parts[:0], nil
		}
		w.calls[ci].parts = append(w.calls[ci].parts, uint32(p))
	}

	width := vr.width()
	w.vals = resize(w.vals, len(uniq)*width)
	clear(w.vals) // absent features score zero
	var wg sync.WaitGroup
	for i := range w.calls {
		c := &w.calls[i]
		if i == len(w.calls)-1 {
			r.lookup(ctx, vr, w, c) // the last call runs on this goroutine
			continue
		}
		wg.Add(1)
		f := func() { defer wg.Done(); r.lookup(ctx, vr, w, c) }
		if r.pool.Submit(f) != nil {
			go f() // every pooled worker is busy
		}
	}
	wg.Wait()
	for i := range w.calls {
		if err := w.calls[i].err; err != nil {
			return nil, err
		}
	}

	resp := &Response{Model: vr.model, Version: vr.version, Scores: make([]float32, req.Rows())}
	switch vr.typ {
	case codec.TypeLR:
		scoreLR(resp.Scores, vr.bias, w.vals, req, w.sharedPos, w.pos)
	case codec.TypeFM:
		w.fmBuf = resize(w.fmBuf, 4*vr.dim)
		scoreFM(resp.Scores, vr.bias, vr.dim, w.vals, req, w.sharedPos, w.pos, w.fmBuf)
	}
	return resp, nil
}

// lookup asks one shard for its partitions' keys and scatters the values
// into w.vals. Each call writes only its own distinct ids' slots. A shard
// that no longer holds a partition (it has just handed it over) or is
// going away is not the end: each of its partitions is asked once more
// of the next replica that holds it.
func (r *Router) lookup(ctx context.Context, vr *versionRoute, w *work, c *call) {
	err := r.ask(ctx, vr, w, c.b, c.parts, &c.rpc)
	if err == nil || !retryable(ctx, err) {
		c.err = err
		return
	}
	// The retry path may allocate: it is taken only while the cluster
	// changes under the routing table.
	alts := map[*backend][]uint32{}
	for _, p := range c.parts {
		reps := vr.replicas[p]
		alt := reps[(slices.Index(reps, c.b)+1)%len(reps)]
		if alt == c.b {
			c.err = err // no other replica
			return
		}
		alts[alt] = append(alts[alt], p)
	}
	r.retries.WithLabelValues("replica").Inc()
	var rb rpcBuf
	for b, parts := range alts {
		if err := r.ask(ctx, vr, w, b, parts, &rb); err != nil {
			c.err = err
			return
		}
	}
}

// retryable reports whether err from one shard may be answered by
// another replica: the shard does not hold what was asked (codes.
// FailedPrecondition), could not be reached (codes.Unavailable), is at
// its bound of work in flight (codes.ResourceExhausted), or left while
// asked, its connection closed under the call (codes.Canceled while the
// request itself is not); and the request still has time.
func retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	switch status.Code(err) {
	case codes.FailedPrecondition, codes.Unavailable, codes.ResourceExhausted, codes.Canceled:
		return true
	}
	return false
}

// ask makes one lookup of shard b for the keys of parts and scatters the
// answer into w.vals.
func (r *Router) ask(ctx context.Context, vr *versionRoute, w *work, b *backend, parts []uint32, rb *rpcBuf) error {
	rb.sections = rb.sections[:0]
	n := 0
	for _, p := range parts {
		keys := w.keys[w.start[p]:w.start[p+1]]
		rb.sections = append(rb.sections, codec.Section{Partition: p, Keys: keys})
		n += len(keys)
	}
	// Lookup is synchronous, so the buffer is free again when it returns.
	rb.buf = codec.AppendLookupRequest(rb.buf[:0], vr.model, vr.version, rb.sections)
	t0 := time.Now()
	raw, err := b.svc.Lookup(ctx, rb.buf)
	outcome := "ok"
	defer func() { r.shardRPC.WithLabelValues(outcome).Observe(time.Since(t0).Seconds()) }()
	if err != nil {
		outcome = "error"
		rb.buf = nil // the transport may still hold it after an early error
		return shardError(ctx, b.id, err)
	}
	var resp codec.LookupResponse
	width := vr.width()
	if err := resp.Decode(raw, n, width); err != nil {
		outcome = "error"
		return fmt.Errorf("router: %w: shard %s answered badly: %v", ErrUnavailable, b.id, err)
	}
	i, k := 0, 0
	for _, p := range parts {
		for _, u := range w.byPart[w.start[p]:w.start[p+1]] {
			if resp.Found(i) {
				dst := w.vals[int(u)*width : int(u+1)*width]
				for j := range dst {
					dst[j] = resp.Value(k, j)
				}
				k++
			}
			i++
		}
	}
	return nil
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
