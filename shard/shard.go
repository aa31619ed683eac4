package shard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/loader"
)

// Options configure a shard. Zero values mean the documented default.
type Options struct {
	// ID names the shard in assignments; required, unique per cluster.
	ID string
	// Repo is the model repository the shard loads partitions from.
	Repo loader.Repo
	// Etcd is the cluster store; required.
	Etcd *clientv3.Client
	// ListenAddr is the gRPC listen address. Default 127.0.0.1:0.
	ListenAddr string
	// AdvertiseAddr is the address routers dial. Default: the listener's.
	AdvertiseAddr string
	// LeaseTTL is the registration lease in seconds. Default 10.
	LeaseTTL int64
	// MaxRequestBytes bounds one lookup request. Default 64 MiB.
	MaxRequestBytes int
	// MemoryBudget bounds the bytes of tables held resident (huge-page
	// memory). A partition that does not fit is served from a read-only
	// mapping of its file: the kernel keeps its hot pages in memory and
	// reads the rest from disk. 0 means no bound: everything resident.
	MemoryBudget int64
	// Registry receives the shard's metrics; nil registers nowhere.
	Registry prometheus.Registerer
	// HotInterval is how often the hot tiers of mapped partitions are
	// rebuilt from sampled traffic. Default 2s.
	HotInterval time.Duration
	// BeforeLoad, if set, is called before each partition load and may
	// block: tests use it to hold a shard back mid-rollout.
	BeforeLoad func(model string, version uint64, partition uint32)
}

// Validate checks required fields and fills defaults.
func (o *Options) Validate() error {
	switch {
	case o.ID == "":
		return errors.New("shard: Options.ID is required")
	case o.Etcd == nil:
		return errors.New("shard: Options.Etcd is required")
	case o.Repo.Dir == "":
		return errors.New("shard: Options.Repo is required")
	}
	if o.ListenAddr == "" {
		o.ListenAddr = "127.0.0.1:0"
	}
	if o.LeaseTTL == 0 {
		o.LeaseTTL = 10
	}
	if o.MaxRequestBytes == 0 {
		o.MaxRequestBytes = 64 << 20
	}
	if o.HotInterval == 0 {
		o.HotInterval = 2 * time.Second
	}
	return nil
}

type metrics struct {
	keys      prometheus.Counter
	loads     prometheus.Counter
	loadFails prometheus.Counter
}

// Shard is a running parameter-store process.
type Shard struct {
	opts    Options
	snap    atomic.Pointer[snapshot]
	lis     net.Listener
	srv     *grpc.Server
	reg     *topo.Registration
	cancel  context.CancelFunc
	done    sync.WaitGroup
	metrics metrics

	pending chan map[string]topo.Assignment // latest assignments, capacity 1
	failed  map[string]error                // "model/version/partition" → why; loader goroutine only
	hot     hotState                        // loader goroutine only
	errs    []string                        // newest first, at most 10
}

// Start listens, registers in etcd and begins loading what the manager
// assigns to this shard. It returns once the shard serves lookups (for
// what it holds: nothing, at first).
func Start(ctx context.Context, opts Options) (*Shard, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", opts.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("shard: %w", err)
	}
	if opts.AdvertiseAddr == "" {
		opts.AdvertiseAddr = lis.Addr().String()
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Shard{opts: opts, lis: lis, cancel: cancel, pending: make(chan map[string]topo.Assignment, 1), failed: map[string]error{}}
	s.snap.Store(&snapshot{models: map[string]map[uint64]*version{}})
	label := prometheus.Labels{"shard": opts.ID}
	s.metrics = metrics{
		keys:      prometheus.NewCounter(prometheus.CounterOpts{Name: "cumulus_shard_lookup_keys_total", Help: "Keys looked up.", ConstLabels: label}),
		loads:     prometheus.NewCounter(prometheus.CounterOpts{Name: "cumulus_shard_partition_loads_total", Help: "Partitions loaded.", ConstLabels: label}),
		loadFails: prometheus.NewCounter(prometheus.CounterOpts{Name: "cumulus_shard_partition_load_failures_total", Help: "Partition loads refused.", ConstLabels: label}),
	}
	if opts.Registry != nil {
		for _, c := range []prometheus.Collector{s.metrics.keys, s.metrics.loads, s.metrics.loadFails} {
			if err := opts.Registry.Register(c); err != nil {
				cancel()
				lis.Close()
				return nil, fmt.Errorf("shard: metrics: %w", err)
			}
		}
	}
	s.srv = grpc.NewServer(grpc.MaxRecvMsgSize(opts.MaxRequestBytes))
	RegisterService(s.srv, s)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(s.srv, hs)
	s.done.Add(1)
	go func() { defer s.done.Done(); s.srv.Serve(lis) }()

	s.reg, err = topo.Register(ctx, opts.Etcd, topo.ShardKey(opts.ID), s.info(), opts.LeaseTTL)
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("shard %s: registering in etcd: %w", opts.ID, err)
	}
	s.done.Add(2)
	go func() {
		defer s.done.Done()
		topo.Watch(ctx, opts.Etcd, topo.ModelsPrefix, func(kv map[string][]byte) {
			as := topo.DecodeAll[topo.Assignment](kv, topo.ModelsPrefix)
			select { // keep only the newest
			case <-s.pending:
			default:
			}
			s.pending <- as
		})
	}()
	go func() {
		defer s.done.Done()
		hotTick := time.NewTicker(opts.HotInterval)
		defer hotTick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case as := <-s.pending:
				s.reconcile(ctx, as)
			case <-hotTick.C:
				s.maintainHot()
			}
		}
	}()
	return s, nil
}

// Addr is the address routers dial.
func (s *Shard) Addr() string { return s.opts.AdvertiseAddr }

// ID is the shard's name.
func (s *Shard) ID() string { return s.opts.ID }

// Loaded reports what the shard holds.
func (s *Shard) Loaded() []topo.Loaded { return s.snap.Load().report() }

// Close deregisters and stops serving.
func (s *Shard) Close() {
	if s.reg != nil {
		s.reg.Close()
	}
	s.cancel()
	s.srv.Stop()
	s.done.Wait()
}

func (s *Shard) info() string {
	b, _ := json.Marshal(topo.ShardInfo{ID: s.opts.ID, Addr: s.opts.AdvertiseAddr, Loaded: s.Loaded(), Errors: s.errs})
	return string(b)
}

// reconcile loads what as assigns to this shard and then drops what it no
// longer needs. A version's partitions are dropped only once every
// partition of the newly assigned version is held, so the old version
// keeps serving through a rollout and after a refused load.
func (s *Shard) reconcile(ctx context.Context, as map[string]topo.Assignment) {
	want := map[string]map[uint32]bool{} // model → partitions of the assigned version
	for name, a := range as {
		for p, reps := range a.Replicas {
			if slices.Contains(reps, s.opts.ID) {
				if want[name] == nil {
					want[name] = map[uint32]bool{}
				}
				want[name][uint32(p)] = true
			}
		}
	}
	for _, name := range slices.Sorted(maps.Keys(want)) {
		a := as[name]
		vkey := fmt.Sprintf("%s/%d", name, a.Version)
		if s.failed[vkey] != nil {
			continue
		}
		chain, err := s.opts.Repo.Chain(name, a.Version)
		if err == nil && chain[0].Partitions != a.Partitions {
			err = fmt.Errorf("manifest has %d partitions, assignment %d", chain[0].Partitions, a.Partitions)
		}
		if err != nil {
			s.refuse(vkey, err)
			continue
		}
		m := chain[0]
		versions := make([]uint64, len(chain))
		for i, c := range chain {
			versions[i] = c.Version
		}
		for _, p := range slices.Sorted(maps.Keys(want[name])) {
			if ctx.Err() != nil {
				return
			}
			pkey := fmt.Sprintf("%s/%d", vkey, p)
			if v := s.snap.Load().get(name, a.Version); v != nil && v.layers[p] != nil || s.failed[pkey] != nil {
				continue
			}
			if s.opts.BeforeLoad != nil {
				s.opts.BeforeLoad(name, a.Version, p)
			}
			layers, err := s.loadStack(chain, p)
			if err != nil {
				s.refuse(pkey, err)
				continue
			}
			s.snap.Store(s.snap.Load().with(m, versions, p, layers))
			s.reg.Set(s.info())
		}
	}
	// Retire: keep the committed version and the target's assigned
	// partitions. Before the first commit (Live 0), keep everything until
	// the target is complete here.
	complete := func(name string) bool {
		v := s.snap.Load().get(name, as[name].Version)
		if v == nil {
			return false
		}
		for p := range want[name] {
			if v.layers[p] == nil {
				return false
			}
		}
		return true
	}
	after, dropped := s.snap.Load().keepOnly(func(name string, v uint64, p uint32) bool {
		a, ok := as[name]
		switch {
		case !ok || want[name] == nil:
			return false // no longer assigned here at all
		case v == a.Version:
			return want[name][p]
		case v == a.Live:
			return true
		case a.Live == 0:
			return !complete(name)
		}
		return false
	})
	if dropped {
		s.snap.Store(after)
		s.reg.Set(s.info())
		// Tables live outside the Go heap and are unmapped by cleanups
		// that run after a collection; the heap hardly grows when they are
		// dropped, so ask for one rather than hold the memory until chance.
		runtime.GC()
	}
	s.promote(ctx, as)
}

// residentBytes is the size of the tables held in resident memory;
// with hot false, hot tiers (which give way to anything else) are left out.
func (s *Shard) residentBytes(hot bool) int64 {
	var n int64
	s.snap.Load().tables(func(t *Table) {
		if !t.Mapped && (hot || t.hotOf == nil) {
			n += t.Bytes()
		}
	})
	return n
}

// fits reports whether n more resident bytes stay within the budget. Hot
// tiers do not count: they shrink at their next rebuild.
func (s *Shard) fits(n int64) bool {
	return s.opts.MemoryBudget == 0 || s.residentBytes(false)+n <= s.opts.MemoryBudget
}

// promote moves mapped partitions of committed versions into resident
// memory while the budget allows, one at a time: the same version's bytes
// replace each other, so lookups never see a mix of versions, and memory
// grows by at most one partition before the mapping is released.
func (s *Shard) promote(ctx context.Context, as map[string]topo.Assignment) {
	for _, name := range slices.Sorted(maps.Keys(as)) {
		a := as[name]
		if a.Live == 0 || a.Live != a.Version {
			continue
		}
		v := s.snap.Load().get(name, a.Live)
		if v == nil {
			continue
		}
		for p, l := range v.layers {
			// Deltas are small and loaded resident; the base is what may
			// be mapped.
			if ctx.Err() != nil || l == nil || !l[len(l)-1].Mapped || !s.fits(l[len(l)-1].Bytes()) {
				continue
			}
			base, err := s.opts.Repo.Manifest(name, v.chain[len(v.chain)-1])
			var pt *codec.Partition
			if err == nil {
				pt, err = s.opts.Repo.ReadPartition(base, uint32(p))
			}
			if err != nil {
				slog.Warn("shard: promoting a mapped partition failed; it stays mapped", "shard", s.opts.ID, "model", name, "partition", p, "err", err)
				continue
			}
			layers := append(slices.Clone(l[:len(l)-1]), NewTable(pt))
			s.snap.Store(s.snap.Load().with(v.m, v.chain, uint32(p), layers))
			runtime.GC() // release the mapping now
			slog.Info("shard: partition now resident", "shard", s.opts.ID, "model", name, "version", a.Live, "partition", p)
		}
	}
}

// loadStack returns partition p's tables for a version's chain, newest
// first, reusing tables already held for any link.
func (s *Shard) loadStack(chain []*codec.Manifest, p uint32) ([]*Table, error) {
	layers := make([]*Table, len(chain))
	for i, c := range chain {
		if t := s.snap.Load().file(c.Name, c.Version, p); t != nil {
			layers[i] = t
			continue
		}
		t0 := time.Now()
		t, err := s.loadPartition(c, p)
		if err != nil {
			return nil, err
		}
		layers[i] = t
		s.metrics.loads.Inc()
		slog.Info("shard: loaded partition", "shard", s.opts.ID, "model", c.Name, "version", c.Version, "kind", c.Kind, "partition", p,
			"keys", t.Len(), "bytes", t.Bytes(), "mapped", t.Mapped, "took", time.Since(t0).Round(time.Millisecond))
	}
	return layers, nil
}

// loadPartition loads into resident memory if the budget allows, else
// maps the file.
func (s *Shard) loadPartition(m *codec.Manifest, p uint32) (*Table, error) {
	read := s.opts.Repo.ReadPartition
	if !s.fits(m.Files[p].Size) {
		read = s.opts.Repo.MapPartition
	}
	pt, err := read(m, p)
	if err != nil {
		return nil, err
	}
	return NewTable(pt), nil
}

func (s *Shard) refuse(key string, err error) {
	slog.Error("shard: refusing partition; keeping what is loaded", "shard", s.opts.ID, "partition", key, "err", err)
	s.metrics.loadFails.Inc()
	s.failed[key] = err
	s.errs = append([]string{key + ": " + err.Error()}, s.errs[:min(len(s.errs), 9)]...)
	s.reg.Set(s.info())
}
