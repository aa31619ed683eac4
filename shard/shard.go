package shard

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"maps"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/admit"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
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
	// Cluster names the cluster; keys sit under /cumulus/NAME/. Default
	// "default".
	Cluster topo.Cluster
	// Build is the binary's version, reported in the registration.
	Build string
	// ListenAddr is the gRPC listen address. Default 127.0.0.1:0.
	ListenAddr string
	// TLS, if set, makes lookups mutual TLS: the shard presents its
	// certificate and answers only clients whose certificate its CA
	// signed (see tlsconf). Nil: plaintext.
	TLS *tlsconf.Source
	// AdvertiseAddr is the address routers dial. Default: the listener's.
	AdvertiseAddr string
	// LeaseTTL is the registration lease in seconds. Default 10.
	LeaseTTL int64
	// Starting, if set, bounds Start: once it is done, a Start still
	// registering in etcd (which waits for etcd as long as it takes, and
	// for a crashed predecessor's lease) gives up. The shard's own
	// lifetime is Start's ctx, which a draining process keeps alive past
	// the signal that ends Starting.
	Starting context.Context
	// MaxRequestBytes bounds one lookup request. Default 64 MiB.
	MaxRequestBytes int
	// MemoryBudget bounds the bytes of tables held resident (huge-page
	// memory) and of the value caches of those that are not. A partition
	// that does not fit is served from disk: from the shard's own copy
	// of its file (see DataDir), its directory resident, its records
	// read with pread, its most asked values cached (cache.go).
	// 0 means no bound: everything resident.
	MemoryBudget int64
	// Weight is the shard's share of partitions, reported to the manager
	// (topo.ShardInfo.Weight). Default: MemoryBudget in GiB, or 1 with no
	// budget. Zone is its failure domain, reported likewise; optional.
	Weight float64
	Zone   string
	// LoadRate bounds the bytes a second the shard reads from the
	// repository to load partitions once it has answered a lookup (a
	// shard starting, or joining, loads at full speed until routers send
	// it lookups): reading and checking a
	// partition costs about a nanosecond a byte of the CPU that answers
	// lookups, so a rebalance or rollout loading at full speed shows in
	// the serving p99. 0: no bound.
	LoadRate int64
	// DiskReads is how partitions served from disk are read: "io_uring"
	// (the default, ""), a lookup's reads submitted together, or preads
	// where the kernel refuses io_uring; "pread", a goroutine a read.
	DiskReads string
	// LoadTurn, if set, is shared by the shards of one process (cumulus
	// dev's): they then load one partition at a time between them, as a
	// shard process alone does. A load holds the turn while it waits for
	// LoadRate. Reading and checking a partition is CPU work, and four
	// in-process shards loading at once crowded out their lookups.
	LoadTurn chan struct{}
	// DataDir holds the copies of partitions served from disk: never the
	// repository's files, which may change under a reader. Copies are
	// unlinked once mapped, so it needs disk space but holds no files;
	// Start creates it and removes copies a crashed run left (a copy
	// being written is locked and left alone). Put it on a disk, not
	// tmpfs, which is memory. Default: cumulus-shard-CLUSTER-ID under
	// os.TempDir(), removed when the shard closes.
	DataDir string
	// Registry receives the shard's metrics; nil registers nowhere.
	Registry prometheus.Registerer
	// HotInterval is how often the value caches of partitions served
	// from disk learn from sampled traffic. Default 500ms.
	HotInterval time.Duration
	// DrainQuiet is how long a draining shard waits with no lookup
	// arriving before it stops (see Drain). Default 1s.
	DrainQuiet  time.Duration
	tempDataDir bool // DataDir is the default, removed on Close

	// BeforeLoad, if set, is called before each partition load and may
	// block (until ctx ends, when the shard closes) or fail the load: tests
	// use it to hold a shard back mid-rollout.
	BeforeLoad func(ctx context.Context, model string, version uint64, partition uint32) error
	// MaxInflight bounds the lookups answered at once, and
	// MaxInflightBytes their request bytes; past either, a lookup waits
	// at most MaxQueueTime, then is refused with ResourceExhausted (the
	// router asks another replica). Defaults: 8 per CPU, 256 MiB, 5ms.
	MaxInflight      int
	MaxInflightBytes int64
	MaxQueueTime     time.Duration
	// BeforeLookup, if set, is called as each admitted lookup begins (ctx is the
	// call's) and may block: tests use it to hold a lookup under way.
	BeforeLookup func(ctx context.Context)
	// Faults are injected into lookups from the start (see Faults and
	// SetFaults).
	Faults *Faults
}

// weight is the share the shard reports: Weight, else its memory budget
// in GiB, else 1.
func (o *Options) weight() float64 {
	switch {
	case o.Weight > 0:
		return o.Weight
	case o.MemoryBudget > 0:
		return float64(o.MemoryBudget) / (1 << 30)
	}
	return 1
}

// Validate checks required fields and fills defaults.
func (o *Options) Validate() error {
	switch {
	case o.ID == "":
		return errors.New("shard: Options.ID is required")
	case !topo.ValidID(o.ID):
		return fmt.Errorf("shard: ID %q: use letters, digits, '.', '_', ':', '@' or '-', starting with a letter or digit (no '/': reports sit under the ID)", o.ID)
	case o.Etcd == nil:
		return errors.New("shard: Options.Etcd is required")
	case o.Repo.Dir == "":
		return errors.New("shard: Options.Repo is required")
	case o.Weight < 0 || math.IsNaN(o.Weight) || math.IsInf(o.Weight, 0):
		return errors.New("shard: Options.Weight must be a positive number (0: the default)")
	case len(o.Zone) > 64:
		return errors.New("shard: Options.Zone is at most 64 bytes")
	case o.LoadTurn != nil && cap(o.LoadTurn) == 0:
		return errors.New("shard: Options.LoadTurn needs room for one (make(chan struct{}, 1))")
	case o.LoadRate < 0:
		return errors.New("shard: Options.LoadRate must not be negative (0: no bound)")
	case o.HotInterval < 0:
		return errors.New("shard: Options.HotInterval must not be negative (0: the default)")
	case o.DiskReads != "" && o.DiskReads != "io_uring" && o.DiskReads != "pread":
		return fmt.Errorf("shard: Options.DiskReads %q: want io_uring or pread", o.DiskReads)
	}
	o.Cluster = o.Cluster.OrDefault()
	if err := o.Cluster.Validate(); err != nil {
		return err
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
	if err := admit.Defaults(&o.MaxInflight, &o.MaxInflightBytes, &o.MaxQueueTime, 8); err != nil {
		return fmt.Errorf("shard: %w", err)
	}
	if o.HotInterval == 0 {
		o.HotInterval = 500 * time.Millisecond
	}
	if o.DataDir == "" {
		o.DataDir, o.tempDataDir = defaultDataDir(o.Cluster, o.ID), true
	}
	if o.DrainQuiet == 0 {
		o.DrainQuiet = time.Second
	}
	return nil
}

type metrics struct {
	keys      prometheus.Counter
	loads     prometheus.Counter
	loadFails prometheus.Counter
	refused   prometheus.Counter
	faults    *prometheus.CounterVec
	cacheHits prometheus.Counter
	diskReads prometheus.Counter
	cached    prometheus.GaugeFunc
}

func (m *metrics) all() []prometheus.Collector {
	return []prometheus.Collector{m.keys, m.loads, m.loadFails, m.refused, m.faults, m.cacheHits, m.diskReads, m.cached}
}

// Shard is a running parameter-store process.
type Shard struct {
	opts    Options
	snap    atomic.Pointer[snapshot]
	lis     net.Listener
	srv     *grpc.Server
	health  *health.Server
	reg     *topo.Registration
	ctx     context.Context // ends when the shard closes
	cancel  context.CancelFunc
	done    sync.WaitGroup
	stop    sync.Once
	quiet   chan struct{} // closed once a drain has seen no lookup for DrainQuiet: lookup streams end
	metrics metrics
	faults  atomic.Pointer[Faults]

	// Admission of lookups: one slot each, and their request bytes.
	slots, bytes *admit.Gate
	// Lookups under way and begun, counted for Drain.
	inflight atomic.Int64
	begun    atomic.Uint64

	pending chan map[string]topo.Assignment // latest assignments, capacity 1
	retired []retiredSnap                   // replaced, not yet reclaimed; loader goroutine only
	swaps   uint64                          // snapshots installed; loader goroutine only
	// resident is the bytes of the current snapshot's resident tables,
	// residentHot those of the value caches of the others; written by
	// the loader.
	resident, residentHot atomic.Int64
	// unplaced is the bytes of resident tables loaded and not yet
	// installed; loader goroutine only.
	unplaced int64
	// overlayBytes is the memory of the overlays (views.go); written by
	// the loader.
	overlayBytes atomic.Int64
	ovs          overlays // loader goroutine only
	// Loader goroutine only:
	failed     map[string]*failure        // "model/version[/partition]" → why, and when to try again
	mismatched map[string]topo.Loaded     // "model/version" → partitions refused for content other than the map expects
	applied    map[string]uint64          // model → Seq of the map record reconciled to
	cur        map[string]topo.Assignment // the map reconciled to
	acked      map[string]topo.HeldRecord // model → the held report last made
	passLoads  int                        // partition files loaded by this reconcile; loader goroutine only
	samples    *sampler                   // lookups of the tables served from disk, for their value caches
	onDisk     map[*Table]struct{}        // the current snapshot's tables served from disk; loader goroutine only
	heard      heard                      // the samples' buffers; loader goroutine only
	// standbyWarm: every partition of the newest standby versions had a
	// warm cache at the last tick (keepStandby logs when it becomes so).
	// Loader goroutine only.
	standbyWarm bool
	// maintained counts the loader's ticks (maintainCaches), for tests.
	maintained atomic.Uint64
	// served is the tables served from disk at the last tick, so that
	// the next knows which went live since; loader goroutine only.
	served     map[*Table]bool
	deadCaches []*valueCache       // dropped, freed once no lookup reads them; loader goroutine only
	cold       *ColdReads          // bounds the reads from disk of all lookups
	background *ColdReads          // standby warming's: one read at a time (standbyReaders)
	identities codec.IdentityCache // the chains loaded last: a delta's identities extend its parent's
	ready      bool                // health says SERVING
	// reported is when loadVersion last reported progress; loader
	// goroutine only.
	reported time.Time
	// servedWritten: the registration etcd holds (the last one written)
	// was made while the shard served what was assigned; loader goroutine.
	servedWritten bool
}

// Start listens, registers in etcd and begins loading what the manager
// assigns to this shard. It returns once the shard serves lookups (for
// what it holds: nothing, at first).
func Start(ctx context.Context, opts Options) (*Shard, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if err := prepareDataDir(opts.DataDir); err != nil {
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
	if opts.LoadRate > 0 {
		opts.Repo.Throttle = loader.NewThrottle(ctx, opts.LoadRate)
	}
	if opts.Repo.Manifests == nil {
		// A delta a second must not re-read its whole chain's manifests
		// (identities are checked against the map all the same).
		opts.Repo.Manifests = loader.NewManifestCache()
	}
	s := &Shard{opts: opts, lis: lis, ctx: ctx, cancel: cancel, pending: make(chan map[string]topo.Assignment, 1), failed: map[string]*failure{},
		ovs:        overlays{byKey: map[ovKey]*overlay{}, all: map[*overlay]bool{}},
		mismatched: map[string]topo.Loaded{},
		acked:      map[string]topo.HeldRecord{},
		slots:      admit.NewGate(int64(opts.MaxInflight), opts.MaxQueueTime), bytes: admit.NewGate(opts.MaxInflightBytes, opts.MaxQueueTime)}
	s.snap.Store(&snapshot{models: map[string]map[uint64]*version{}})
	s.cold, s.samples, s.onDisk = NewColdReads(coldReaders), new(sampler), map[*Table]struct{}{}
	s.background = NewColdReads(standbyReaders)
	switch {
	case opts.DiskReads == "pread":
		s.cold, s.background = s.cold.Pread(), s.background.Pread()
	case opts.MemoryBudget > 0: // (with no budget nothing is served from disk: no ring to try)
		if _, err := rings(); err != nil {
			slog.Info("shard: partitions served from disk will be read with pread: the kernel refuses io_uring", "shard", opts.ID, "err", err)
		}
	}
	s.quiet = make(chan struct{})
	label := prometheus.Labels{"shard": opts.ID}
	s.metrics = metrics{
		keys:      prometheus.NewCounter(prometheus.CounterOpts{Name: "cumulus_shard_lookup_keys_total", Help: "Keys looked up.", ConstLabels: label}),
		loads:     prometheus.NewCounter(prometheus.CounterOpts{Name: "cumulus_shard_partition_loads_total", Help: "Partitions loaded.", ConstLabels: label}),
		loadFails: prometheus.NewCounter(prometheus.CounterOpts{Name: "cumulus_shard_partition_load_failures_total", Help: "Partition loads refused.", ConstLabels: label}),
		refused:   prometheus.NewCounter(prometheus.CounterOpts{Name: "cumulus_shard_lookups_refused_total", Help: "Lookups refused as overload (ResourceExhausted).", ConstLabels: label}),
		faults:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cumulus_shard_faults_injected_total", Help: "Faults injected into lookups on purpose (--fault), by kind.", ConstLabels: label}, []string{"kind"}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{Name: "cumulus_shard_cache_hits_total", Help: "Keys of partitions served from disk answered by their value caches.", ConstLabels: label}),
		diskReads: prometheus.NewCounter(prometheus.CounterOpts{Name: "cumulus_shard_disk_reads_total", Help: "Keys of partitions served from disk read from disk (not in the value cache).", ConstLabels: label}),
		cached: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "cumulus_shard_cache_bytes", Help: "Memory of the value caches of partitions served from disk (within --memory-budget).", ConstLabels: label},
			func() float64 { return float64(s.residentHot.Load()) }),
	}
	s.faults.Store(opts.Faults)
	if opts.Registry != nil {
		for _, c := range s.metrics.all() {
			if err := opts.Registry.Register(c); err != nil {
				cancel()
				lis.Close()
				return nil, fmt.Errorf("shard: metrics: %w", err)
			}
		}
	}
	// Fixed flow-control windows, large enough for a lookup's answer,
	// turn off gRPC's bandwidth probing: a ping and a window update per
	// few messages on a router's lookup stream otherwise.
	sopts := []grpc.ServerOption{grpc.MaxRecvMsgSize(opts.MaxRequestBytes),
		grpc.InitialWindowSize(StreamWindow), grpc.InitialConnWindowSize(4 * StreamWindow),
		grpc.WriteBufferSize(SocketBuffer), grpc.ReadBufferSize(SocketBuffer),
		experimental.BufferPool(codec.FramePool),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: KeepaliveTime / 2, PermitWithoutStream: true})}
	if opts.TLS != nil {
		sopts = append(sopts, grpc.Creds(opts.TLS.GRPC("shard "+opts.ID, tlsconf.RoleRouter, tlsconf.RoleManager)))
	}
	s.srv = grpc.NewServer(sopts...)
	RegisterService(s.srv, s)
	// Not ready until it serves what the map assigns it (setReady).
	s.health = health.NewServer()
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	healthpb.RegisterHealthServer(s.srv, s.health)
	s.done.Add(1)
	go func() { defer s.done.Done(); s.srv.Serve(lis) }()

	// Starting ended while registering: the shard is not to be.
	abort := func() bool { return true }
	if opts.Starting != nil {
		abort = context.AfterFunc(opts.Starting, cancel)
	}
	first, _ := s.info()
	s.reg, err = topo.Register(ctx, opts.Etcd, opts.Cluster.ShardKey(opts.ID), first, opts.LeaseTTL)
	if !abort() {
		s.Close()
		return nil, fmt.Errorf("shard %s: stopped before it had registered in etcd (%w)", opts.ID, context.Cause(opts.Starting))
	}
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("shard %s: registering in etcd: %w", opts.ID, err)
	}
	s.done.Add(2)
	go func() {
		defer s.done.Done()
		maps := topo.NewMapReader(opts.Cluster) // decodes only the records that changed
		topo.Watch(ctx, opts.Etcd, opts.Cluster.ModelsPrefix(), func(kv map[string][]byte, _ int64) {
			as := maps.Assignments(kv)
			select { // keep only the newest
			case <-s.pending:
			default:
			}
			s.pending <- as
		})
	}()
	go func() {
		defer s.done.Done()
		// The first tick comes at a random point of the interval: the
		// shards of one process (cumulus dev's) started together would
		// otherwise all tick at once, each tick's work (draining samples,
		// learning, warming a standby cache) then taking every core for
		// that moment instead of one shard's share of it.
		hotTick := time.NewTicker(time.Duration(1 + rand.Int64N(int64(opts.HotInterval))))
		defer hotTick.Stop()
		phased := false
		retry := time.NewTimer(time.Hour)
		defer retry.Stop()
		var as map[string]topo.Assignment
		for ctx.Err() == nil { // also after a reconcile: a map may be pending beside ctx's end
			select {
			case <-ctx.Done():
				return
			case as = <-s.pending:
			case <-retry.C:
			case <-hotTick.C:
				if !phased {
					hotTick.Reset(opts.HotInterval)
					phased = true
				}
				learn, cancel := context.WithTimeout(ctx, opts.HotInterval)
				s.maintainCaches(learn)
				cancel()
				s.maintained.Add(1)
				continue
			case <-s.reg.Wrote():
				s.setReady(as)
				continue
			}
			s.reconcile(ctx, as)
			s.setReady(as)
			// Failed loads are tried again after their backoff.
			retry.Reset(s.nextRetry(time.Now()))
		}
	}()
	return s, nil
}

// KeepaliveTime is how often a router pings a shard's connection; the
// shard accepts pings twice as often.
const KeepaliveTime = 10 * time.Second

// SocketBuffer is how many bytes a shard's or a router's gRPC
// transport reads or writes a system call: a wide lookup's answer is
// megabytes (FFM: 324 bytes a key), sent at gRPC's default of 32 KiB a
// write in a hundred calls. gRPC shares write buffers (held only while
// writing), so an idle connection does not keep one.
const SocketBuffer = 256 << 10

// StreamWindow is the HTTP/2 flow-control window of a lookup stream,
// at the shard and the router: fixed, not probed.
const StreamWindow = 16 << 20

// SetFaults replaces the faults the shard injects into its lookups; nil
// injects none.
func (s *Shard) SetFaults(f *Faults) { s.faults.Store(f) }

// Faults are the faults the shard injects now; nil if none.
func (s *Shard) Faults() *Faults { return s.faults.Load() }

// Addr is the address routers dial.
func (s *Shard) Addr() string { return s.opts.AdvertiseAddr }

// ID is the shard's name.
func (s *Shard) ID() string { return s.opts.ID }

// Loaded reports what the shard holds.
func (s *Shard) Loaded() []topo.Loaded { return s.snap.Load().report() }

// Close deregisters and stops serving at once: lookups under way fail
// (routers ask another replica). Drain stops gracefully.
func (s *Shard) Close() { s.halt(false) }

// Crash stops serving as a killed process would: the registration stays in
// etcd until its lease runs out, and nothing is handed over. For
// fault-injection tests.
func (s *Shard) Crash() { s.halt(true) }

// halt stops everything at once; the first call decides, later ones do
// nothing.
func (s *Shard) halt(crash bool) {
	s.stop.Do(func() {
		switch {
		case s.reg == nil:
		case crash:
			s.reg.Abandon()
		default:
			s.reg.Close()
		}
		s.cancel()
		s.srv.Stop()
		s.done.Wait()
		if s.opts.tempDataDir && s.reg != nil {
			// Ours alone, in the temporary directory: not left behind.
			// (Only once registered: a shard refused because its ID is
			// taken must not remove the directory of the one that has it.)
			os.RemoveAll(s.opts.DataDir)
		}
		if s.opts.Registry != nil { // a shard of the same ID may start again in this process
			for _, c := range s.metrics.all() {
				s.opts.Registry.Unregister(c)
			}
		}
	})
}

// report writes the shard's registration and its reports of what it
// holds (only what changed is written).
func (s *Shard) report() {
	v, subs := s.info()
	s.reg.SetReport(v, subs)
}

// info is the shard's registration and its reports (topo's
// shardreports.go): in schema 4 once every model of the map it follows
// is of AssignmentSchema 4 (its managers read that form); until then in
// schema 1, every version's identities in the registration, as managers
// of an older build read it.
func (s *Shard) info() (string, map[string]string) {
	info := topo.ShardInfo{Schema: topo.ShardInfoSchema, ID: s.opts.ID, Addr: s.opts.AdvertiseAddr, Build: s.opts.Build,
		Weight: s.opts.weight(), Zone: s.opts.Zone, Budget: s.opts.MemoryBudget, Encodings: StoredEncodings}
	var subs map[string]string
	if s.newForm() {
		subs = s.heldReports()
	} else {
		info.Schema, info.Applied, info.Loaded = topo.ShardInfoLegacySchema, s.applied, s.Loaded()
		snap := s.snap.Load()
		for i, l := range info.Loaded {
			if a, ok := s.cur[l.Model]; ok && l.Version == a.Staged {
				cold := s.coldParts(snap, l.Model, a)
				for j := len(l.Have) - 1; j >= 0; j-- {
					if cold[int(l.Have[j])] {
						l.Have, l.IDs = slices.Delete(l.Have, j, j+1), slices.Delete(l.IDs, j, j+1)
					}
				}
				info.Loaded[i] = l
			}
		}
	}
	// What fails now, not a history: a load that later succeeds, or is no
	// longer asked for, leaves the report.
	for _, k := range slices.Sorted(maps.Keys(s.failed)) {
		if len(info.Errors) == 20 {
			info.Errors = append(info.Errors, fmt.Sprintf("and %d more", len(s.failed)-20))
			break
		}
		info.Errors = append(info.Errors, k+": "+s.failed[k].err.Error())
	}
	for _, k := range slices.Sorted(maps.Keys(s.mismatched)) {
		info.Mismatched = append(info.Mismatched, s.mismatched[k])
	}
	b, _ := json.Marshal(info)
	return string(b), subs
}

func sameExcept(a, b topo.Except) bool {
	return a.Version == b.Version && slices.Equal(a.Missing, b.Missing)
}

// newForm reports whether the map followed is all of AssignmentSchema 4
// or later (and there is one).
func (s *Shard) newForm() bool {
	for _, a := range s.cur {
		if a.Schema < topo.AssignmentSchema {
			return false
		}
	}
	return len(s.cur) > 0
}

// heldReports are the shard's reports of each model of the map it
// follows: the partitions assigned to it that it holds (of any version
// kept), and per kept version those of them it lacks, relative to the
// map record it applied. They hold no identities: a partition is held
// only with the identity the map names (reconcile refuses any other).
func (s *Shard) heldReports() map[string]string {
	out := map[string]string{}
	snap := s.snap.Load()
	// What was reported of models the map no longer has goes with them.
	maps.DeleteFunc(s.acked, func(name string, _ topo.HeldRecord) bool { _, ok := s.cur[name]; return !ok })
	for _, name := range slices.Sorted(maps.Keys(s.cur)) {
		a := s.cur[name]
		kept := a.Kept()
		held := make([]*version, len(kept))
		infos := make([]*topo.VersionInfo, len(kept))
		for i, v := range kept {
			held[i], infos[i] = snap.get(name, v), a.Info(v)
		}
		cold := s.coldParts(snap, name, a)
		// Held with the identity the map names, and no other.
		has := func(i int, p int) bool {
			ver, info := held[i], infos[i]
			return ver != nil && info != nil && p < len(ver.layers) && ver.layers[p] != nil && p < len(info.IDs) && ver.ids[p] == info.IDs[p] &&
				!(kept[i] == a.Staged && cold[p])
		}
		var parts []uint32
		for p, reps := range a.Replicas {
			if !slices.Contains(reps, s.opts.ID) {
				continue
			}
			for i := range kept {
				if has(i, p) {
					parts = append(parts, uint32(p))
					break
				}
			}
		}
		if parts == nil {
			continue // nothing of it here
		}
		h := topo.HeldRecord{Schema: topo.ShardInfoSchema, Seq: s.applied[name]}
		for i, v := range kept {
			var missing []uint32
			for _, p := range parts {
				if !has(i, int(p)) {
					missing = append(missing, p)
				}
			}
			if missing != nil {
				h.Except = append(h.Except, topo.Except{Version: v, Missing: missing})
			}
		}
		slices.SortFunc(h.Except, func(a, b topo.Except) int { return cmp.Compare(a.Version, b.Version) })
		// The Seq last reported stands while it says the same: no version
		// kept since, no move since, nothing else missing.
		if last, ok := s.acked[name]; ok && last.Seq <= h.Seq && a.PlaceSeq <= last.Seq && slices.EqualFunc(last.Except, h.Except, sameExcept) &&
			!slices.ContainsFunc(kept, func(v uint64) bool { return a.KeptSinceOf(v) > last.Seq }) {
			h.Seq = last.Seq
		}
		s.acked[name] = h
		hb, _ := json.Marshal(h)
		pb, _ := json.Marshal(topo.PartsRecord{Schema: topo.ShardInfoSchema, Parts: parts})
		out["held/"+name], out["parts/"+name] = string(hb), string(pb)
	}
	return out
}

// residentBytes is the size of the tables held in resident memory and
// of the overlays of their deltas;
// with hot false, value caches (which give way to anything else) are
// left out.
// It is kept as snapshots are installed (reclaim.go), not summed.
func (s *Shard) residentBytes(hot bool) int64 {
	n := s.resident.Load() + s.overlayBytes.Load()
	if hot {
		n += s.residentHot.Load()
	}
	return n
}

// fits reports whether n more resident bytes stay within the budget.
// Value caches do not count: cacheRoom drops them to make the room.
func (s *Shard) fits(n int64) bool {
	return s.opts.MemoryBudget == 0 || s.residentBytes(false)+s.unplaced+n <= s.opts.MemoryBudget
}

// cacheRoom drops the value caches if n more resident bytes would not
// fit beside them: resident tables come first, and the loader sizes the
// caches again to what is left at its next HotInterval. Loader goroutine
// only.
func (s *Shard) cacheRoom(n int64) {
	fits := func() bool {
		return s.opts.MemoryBudget == 0 || s.residentBytes(true)+s.unplaced+n <= s.opts.MemoryBudget
	}
	if fits() {
		return
	}
	// The caches of versions not served go first (the newest standby's,
	// kept in the room the live ones leave: a delta's overlay would
	// otherwise drop every live cache), then, if that is not room
	// enough, all.
	served := s.servedTables()
	if s.dropCachesBut(func(t *Table) bool { return served[t] }); !fits() {
		s.dropCachesBut(func(*Table) bool { return false })
	}
}

// dropCachesBut drops the value caches of the tables served from disk
// that keep does not name, and frees those no lookup reads. Loader
// goroutine only.
func (s *Shard) dropCachesBut(keep func(*Table) bool) {
	for t := range s.onDisk {
		if c := t.cache.Load(); c != nil && !keep(t) {
			s.residentHot.Add(-c.Bytes() - t.growthBytes())
			s.dropCache(t)
		}
	}
	s.freeCaches(reclaimWait)
}

// loadPartition loads into resident memory if the budget allows and
// mapped is false, else maps the shard's own copy of the file. A delta
// is resident whatever the budget (the caches give way to it, cacheRoom):
// it is small and read through its base's overlay, and mapped, each
// partition of each delta of a chain held a file open and a layer read
// from disk apart: at 1,024 partitions a chain of a hundred deltas
// reached the process's 20,000 open files. The manager's compaction
// (CompactAfter) bounds what a chain's deltas take.
func (s *Shard) loadPartition(m *codec.Manifest, p uint32, mapped bool) (*Table, error) {
	read := s.readPartition
	if f, _ := m.File(p); m.Kind != codec.KindDelta && (mapped || !s.fits(f.Size)) {
		read = s.mapCopy
	} else {
		s.cacheRoom(f.Size)
	}
	pt, err := read(m, p)
	if err != nil {
		return nil, err
	}
	t := NewTable(pt)
	if t.Mapped {
		t.sample = s.samples
	}
	return t, nil
}
