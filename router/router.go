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
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/hedge"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/model"
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
	// Dial connects to a shard. Default: gRPC, over mutual TLS with
	// ShardTLS, else plaintext. Tests use it to wrap shards with
	// controllable faults.
	Dial func(addr string) (shard.Service, io.Closer, error)
	// ShardTLS, if set, is the router's certificate and the CA it checks
	// shards against, with their role (tlsconf.RoleShard, in the cluster
	// its SetRoles names).
	ShardTLS *tlsconf.Source
	// Registry receives the router's metrics; nil registers nowhere.
	Registry prometheus.Registerer
	// Hedge is the policy against slow shards.
	Hedge HedgeOptions
	// ID names the router's registration (routers/ID). Default: the host
	// name and pid (and a number for a process's second router on).
	ID string
	// Advertise is the address of the front this router serves, shown
	// in its registration; Build its build. Both optional.
	Advertise, Build string
	// LeaseTTL is the registration lease in seconds. Default 10.
	LeaseTTL int64
	// Staged makes this the manager's gate router: requests pinned to a
	// model's Staged version are routed too (the validation gates send
	// them before the manager commits it), and the router does not
	// register (the rollout does not wait for it). Routers that face
	// users never set it.
	Staged bool
}

// HedgeOptions set how shard calls are hedged (see internal/hedge).
// Zero values mean the documented default.
type HedgeOptions struct {
	// Off sends no hedges; failed calls are still asked of another replica.
	Off bool
	// Delay, if set, is how long a call waits before it is hedged.
	// Default: the p95 latency of the replicas that could take it over,
	// at least hedge.Floor.
	Delay time.Duration
	// Budget bounds hedges to this fraction of shard calls over Window.
	// Default 0.05.
	Budget float64
	// Window is the budget's sliding window. Default 10s.
	Window time.Duration
	// Choice is how a replica is chosen for a request's first calls.
	// Default hedge.LeastLoaded. Hedges and retries always go to the least
	// loaded replica not yet asked.
	Choice hedge.Choice
}

func (h *HedgeOptions) fill() error {
	if h.Delay < 0 || h.Budget < 0 || h.Window < 0 {
		return errors.New("router: hedge delay, budget and window must not be negative")
	}
	if h.Budget == 0 {
		h.Budget = 0.05
	}
	if h.Window == 0 {
		h.Window = 10 * time.Second
	}
	return nil
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
		tls := o.ShardTLS
		o.Dial = func(addr string) (shard.Service, io.Closer, error) { return dialGRPC(addr, tls) }
	}
	if o.ID == "" {
		o.ID = defaultID()
	}
	if o.LeaseTTL == 0 {
		o.LeaseTTL = 10
	}
	return o.Hedge.fill()
}

func dialGRPC(addr string, tls *tlsconf.Source) (shard.Service, io.Closer, error) {
	creds, err := tls.GRPCClient(addr, tlsconf.RoleShard)
	if err != nil {
		return nil, nil, fmt.Errorf("router: shard %w", err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds),
		// The largest answer is a dense part (Extra), or a lookup of
		// Limits.MaxValues values.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(model.MaxDenseBytes+1<<20)),
		grpc.WithInitialWindowSize(shard.StreamWindow), grpc.WithInitialConnWindowSize(4*shard.StreamWindow),
		grpc.WithReadBufferSize(shard.SocketBuffer), grpc.WithWriteBufferSize(shard.SocketBuffer),
		experimental.WithBufferPool(codec.FramePool),
		// A shard that stops answering (a stopped process, a partition)
		// is found out within seconds: its lookup stream breaks and its
		// calls are asked elsewhere.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: shard.KeepaliveTime, Timeout: 5 * time.Second}))
	if err != nil {
		return nil, nil, err
	}
	return shard.NewMuxClient(conn), conn, nil
}

// Router answers predict calls by fanning out to shards. It is safe for
// concurrent use; requests never lock.
type Router struct {
	opts     Options
	tab      atomic.Pointer[table]
	pool     *ants.Pool
	rr       atomic.Uint64
	budget   *hedge.Budget
	cancel   context.CancelFunc
	done     sync.WaitGroup
	shardRPC *prometheus.HistogramVec
	delay    *prometheus.GaugeVec
	retries  *prometheus.CounterVec
	hedges   struct{ sent, won, overBudget prometheus.Counter }
	regMu    sync.Mutex
	reg      *topo.Registration     // nil until registered
	regValue string                 // what to register: the latest registration
	metrics  atomic.Pointer[string] // the URL of its metrics (SetMetrics)
	tracks   *tracks                // the watch goroutine's
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
	r := &Router{opts: opts, pool: pool, cancel: cancel, budget: hedge.NewBudget(opts.Hedge.Budget, opts.Hedge.Window)}
	r.shardRPC = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "cumulus_router_shard_call_seconds",
		Help:    "Router→shard lookup latency by shard and outcome (ok, error, or cancelled: the request was answered or gave up first).",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16),
	}, []string{"shard", "outcome"})
	r.delay = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "cumulus_router_hedge_delay_seconds",
		Help: "How long the latest call to each shard was to wait before it was hedged.",
	}, []string{"shard"})
	hedges := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cumulus_router_hedges_total",
		Help: "Hedged shard calls: sent, won (answered first), or not sent because the hedge budget was spent (over_budget).",
	}, []string{"outcome"})
	r.hedges.sent, r.hedges.won, r.hedges.overBudget = hedges.WithLabelValues("sent"), hedges.WithLabelValues("won"), hedges.WithLabelValues("over_budget")
	r.retries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cumulus_router_retries_total",
		Help: "Lookups asked again: of another replica of the same partitions (replica), or whole requests run again on a newer routing table (table).",
	}, []string{"kind"})
	r.tracks = newTracks()
	if opts.Registry != nil {
		for _, c := range append([]prometheus.Collector{r.shardRPC, r.delay, hedges, r.retries}, r.tracks.collectors()...) {
			if err := opts.Registry.Register(c); err != nil {
				cancel()
				return nil, fmt.Errorf("router: metrics: %w", err)
			}
		}
	}
	r.tab.Store(&table{models: map[string]*modelRoute{}, replaced: make(chan struct{})})
	r.regValue = r.registration(nil, newDenseCache())
	r.done.Add(1)
	go func() { defer r.done.Done(); r.watch(ctx) }()
	if !opts.Staged {
		r.done.Add(1)
		go func() { defer r.done.Done(); r.register(ctx) }()
	}
	return r, nil
}

// Close stops watching, leaves the cluster (its registration is
// deleted) and closes shard connections.
func (r *Router) Close() {
	r.cancel()
	r.done.Wait()
	r.regMu.Lock()
	if r.reg != nil {
		r.reg.Close()
	}
	r.regMu.Unlock()
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
		// Readers that decode only the records that changed.
		maps, reports := topo.NewMapReader(c), topo.NewShardReader(c)
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
			ev := event{shards: reports.Shards(shards), assigns: maps.Assignments(models), rev: rev}
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
	var slots slotAllocator
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
	dense := newDenseCache()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-events:
			shards, assigns, rev = ev.shards, ev.assigns, ev.rev
		case res := <-dense.results:
			dense.done(res)
		case <-retry.C:
		}
		live := map[string]bool{}
		for _, si := range shards {
			live[si.Addr] = true
			if b := backends[si.Addr]; b != nil {
				b.offer(si) // a shard restarted at the same address may be another build
				continue
			}
			svc, c, err := r.opts.Dial(si.Addr)
			if err != nil {
				slog.Error("router: dialing shard", "shard", si.ID, "addr", si.Addr, "err", err)
				continue
			}
			backends[si.Addr] = r.newBackend(si, svc, slots.get())
			closers[si.Addr] = c
		}
		if next := dense.update(ctx, r, shards, assigns, backends); !next.IsZero() {
			retry.Reset(time.Until(next))
		}
		tab := buildTable(shards, assigns, backends, dense, r.opts.Staged)
		r.tracks.label(tab)
		r.setRegistration(r.registration(assigns, dense))
		tab.rev = rev
		old := r.tab.Swap(tab)
		close(old.replaced)
		for addr := range backends {
			if b := backends[addr]; !live[addr] {
				leaving.close(closers[addr])
				r.dropBackend(b, backends)
				slots.put(b.slot)
				delete(backends, addr)
				delete(closers, addr)
			}
		}
	}
}

// newBackend is the router's view of shard si, reached through svc.
func (r *Router) newBackend(si topo.ShardInfo, svc shard.Service, slot int) *backend {
	b := &backend{id: si.ID, addr: si.Addr, svc: svc, slot: slot, delay: r.delay.WithLabelValues(si.ID)}
	b.calls.ok = r.shardRPC.WithLabelValues(si.ID, "ok")
	b.calls.failed = r.shardRPC.WithLabelValues(si.ID, "error")
	b.calls.cancelled = r.shardRPC.WithLabelValues(si.ID, "cancelled")
	b.offer(si)
	return b
}

// dropBackend forgets b's metrics, unless another backend (a shard that
// moved to a new address) reports under its name.
func (r *Router) dropBackend(b *backend, all map[string]*backend) {
	for _, o := range all {
		if o != b && o.id == b.id {
			return
		}
	}
	for _, o := range []string{"ok", "error", "cancelled"} {
		r.shardRPC.DeleteLabelValues(b.id, o)
	}
	r.delay.DeleteLabelValues(b.id)
}

// slotAllocator numbers backends densely, reusing the numbers of those
// gone: a request indexes its per-shard scratch by them. No table holds
// two backends of one number: a backend's number is freed only once a
// table without it is in place.
type slotAllocator struct {
	next int
	free []int
}

func (a *slotAllocator) get() int {
	if n := len(a.free); n > 0 {
		s := a.free[n-1]
		a.free = a.free[:n-1]
		return s
	}
	a.next++
	return a.next - 1
}

func (a *slotAllocator) put(s int) { a.free = append(a.free, s) }

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
	Name        string
	Ready       bool
	Live        uint64   // version answering unpinned requests; 0 if none
	Versions    []uint64 // every servable version, ascending
	model.Shape          // the live version's
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
		s.Ready, s.Live, s.Shape = true, mr.live.version, mr.live.shape
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

// WaitRoutable waits until the routing table routes version v of model
// (the gate router: its Staged version), or ctx ends.
func (r *Router) WaitRoutable(ctx context.Context, model string, v uint64) error {
	for {
		t := r.tab.Load()
		if mr := t.models[model]; mr != nil && mr.versions[v] != nil {
			return nil
		}
		select {
		case <-t.replaced:
		case <-ctx.Done():
			return ContextError(ctx, fmt.Sprintf("model %q version %d routed", model, v))
		}
	}
}

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
	d := draw(req)
	start := time.Now()
	for attempt := 1; ; attempt++ {
		resp, tm, err := r.predict(ctx, t, req, d)
		if err == nil || attempt == maxAttempts || ctx.Err() != nil || status.Code(err) != codes.FailedPrecondition {
			tm.observe(resp, err, start)
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

// predict answers req from routing table t, given its draw; it returns
// the metrics of the track it chose (nil: none).
func (r *Router) predict(ctx context.Context, t *table, req *Request, d uint64) (*Response, *trackMetrics, error) {
	vr, tm, err := r.version(t, req, d)
	if err != nil {
		return nil, nil, err
	}
	resp, err := r.answer(ctx, vr, req)
	return resp, tm, err
}

// answer scores req on version route vr.
func (r *Router) answer(ctx context.Context, vr *versionRoute, req *Request) (*Response, error) {
	// The calls still out when this attempt returns (hedges that lost, or
	// all of them when it failed) are cancelled, not left holding the
	// shards' admission while Predict waits for a newer table.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := getWork()
	defer w.release()
	if err := vr.check(w, req); err != nil {
		return nil, err
	}
	w.dedup(req)
	if n := len(w.ids.uniq) * vr.width(); n > r.opts.Limits.MaxValues {
		return nil, invalid("%d distinct ids of %d values each (%s) are %d values, over the limit of %d a request may fetch", len(w.ids.uniq), vr.width(), vr.shape, n, r.opts.Limits.MaxValues)
	}
	w.partition(vr)
	if err := r.fanOut(ctx, vr, w); err != nil {
		return nil, err
	}
	resp := &Response{Model: vr.model, Version: vr.version, Scores: make([]float32, req.Rows())}
	vr.score(resp.Scores, w)
	return resp, nil
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

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}
