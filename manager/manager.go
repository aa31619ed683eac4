package manager

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/raftgroup"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/loader"
)

// Options configure a manager. Zero values mean the documented default.
type Options struct {
	// Repo is the model repository to serve from; required.
	Repo loader.Repo
	// Etcd is the cluster store; required.
	Etcd *clientv3.Client
	// ShardTLS, if set, is the certificate and CA the manager's gate
	// router uses with shards (mutual TLS, see tlsconf).
	ShardTLS *tlsconf.Source
	// Cluster names the cluster; every key sits under /cumulus/NAME/.
	// Default "default".
	Cluster topo.Cluster
	// Replicas is how many shards hold each partition. Default 1.
	Replicas int
	// KeepVersions is how many full versions besides the live one stay
	// loaded on the shards for rollback, with their deltas. Default 2;
	// negative keeps none.
	KeepVersions int
	// KeepDeltas is how many deltas on each kept full version stay
	// loaded for rollback (the newest). Default 20; negative keeps none.
	KeepDeltas int
	// AutoPrune, when positive, prunes a model after each commit, keeping
	// that many removable versions (see OpPrune). It needs write access
	// to the repository.
	AutoPrune int
	// CompactAfter: when the live version's chain reaches this many
	// deltas, the manager compacts it into a new full version (see
	// loader.Repo.Compact), which rolls out like any version. It needs
	// write access to the repository. Default 500; negative: never; it
	// must stay below loader.MaxChain, the longest chain a version may
	// have.
	//
	// Why 500: a chain's length no longer costs lookups (a shard reads a
	// version's deltas through one overlay), so what bounds it is what a
	// compaction costs, a rewrite of the whole model, paid once per
	// CompactAfter deltas; the shards' overlay memory (about 50–84 bytes
	// per delta key, plus the deltas' records); the files a shard reads
	// to load a version afresh; and room below loader.MaxChain for the
	// deltas published while a compaction runs (they are copied onto
	// it): at a delta a second, 500 deltas are 8 minutes between
	// compactions, with as long again for one to finish.
	CompactAfter int
	// ScanInterval is how often the whole repository is scanned, besides
	// watching it for new versions (see watchRepo). Default 10s.
	ScanInterval time.Duration
	// Registry receives the manager's metrics; nil registers nowhere.
	Registry prometheus.Registerer
	// Writer names this manager in what it writes and in the leader
	// election. Default host:pid:random.
	Writer string
	// RouterWait is how long a router that cannot score a staged version
	// (a dense part it has not fetched) holds the version's commit back;
	// past it, the version goes live without it, and the router answers
	// 503 for the model until it can score it. Default 30s; negative:
	// for ever.
	RouterWait time.Duration
	// Validator, if set, is a program run on each staged version's
	// directory (its one argument, no shell) before the version is
	// committed: exit 0 accepts it; otherwise the version is rejected,
	// its last stderr line the reason. ValidatorTimeout bounds a run
	// (default 60s).
	Validator        string
	ValidatorTimeout time.Duration
	// GoldenTolerance is how far a staged version's served score may be
	// from a golden request's want (absolute, per score). Default 1e-4.
	GoldenTolerance float64
	// Holdout maps a model to its hold-out set, a file of requests with
	// labels (package golden): a staged version's mean log-loss on it may
	// exceed the live version's by at most HoldoutMargin (absolute;
	// default 0.01; negative: 0, no worse at all). The file is read at
	// each run.
	Holdout       map[string]string
	HoldoutMargin float64
	// GateTimeout bounds one run of the golden or the hold-out gate,
	// waiting for the gate router to route the staged version included.
	// Default 60s.
	GateTimeout time.Duration
	// MaxMoves bounds the partitions of each model moving onto one shard
	// at once: a rebalance loads at most this many of a model at a time
	// per shard, so that serving does not suffer (a partition with fewer
	// holders than replicas, because a shard left, moves at once
	// regardless). Default 4; negative: no bound.
	MaxMoves int
	// GateRetry is how long a gate that could not run (its hold-out set
	// unreadable, the cluster unable to answer) waits before it is asked
	// for again. Default 5s.
	GateRetry time.Duration
	// LeaderTTL is the lease, in seconds, under which this manager leads:
	// if it dies, another takes over after at most this long. Default 5.
	LeaderTTL int
	// PushProducerTTL and MaxPushProducers bound the push producers'
	// marks a model's state keeps (see Policy): defaults 24h and 1,024.
	PushProducerTTL  time.Duration
	MaxPushProducers int
	// Raft, if set, makes this manager a member of a raft group of
	// managers (Control plane III): the state lives in the group's log
	// and snapshots instead of etcd, the group's leader acts, and the
	// serving map is published in etcd fenced by the raft term
	// (fence.go). LeaderTTL and the etcd election are then unused.
	Raft *RaftOptions
}

// RaftOptions make a manager a member of a raft group.
type RaftOptions struct {
	// ID, Addr, Advertise, Dir, Peers and TLS: see raftgroup.Config.
	ID, Addr, Advertise, Dir string
	Peers                    []raftgroup.Peer
	TLS                      *tlsconf.Source
	// Audit bounds the audit log the group keeps.
	Audit AuditRetention
	// HeartbeatTimeout, ElectionTimeout, LeaderLease: see
	// raftgroup.Config (defaults 500ms, 500ms, 250ms).
	HeartbeatTimeout, ElectionTimeout, LeaderLease time.Duration
}

// Validate checks required fields and fills defaults.
func (o *Options) Validate() error {
	switch {
	case o.Repo.Dir == "":
		return errors.New("manager: Options.Repo is required")
	case o.Etcd == nil:
		return errors.New("manager: Options.Etcd is required")
	}
	o.Cluster = o.Cluster.OrDefault()
	if err := o.Cluster.Validate(); err != nil {
		return err
	}
	if o.Replicas == 0 {
		o.Replicas = 1
	}
	switch {
	case o.KeepVersions == 0:
		o.KeepVersions = 2
	case o.KeepVersions < 0:
		o.KeepVersions = 0
	}
	switch {
	case o.KeepDeltas == 0:
		o.KeepDeltas = 20
	case o.KeepDeltas < 0:
		o.KeepDeltas = 0
	}
	switch {
	case o.CompactAfter == 0:
		o.CompactAfter = 500
	case o.CompactAfter >= loader.MaxChain:
		return fmt.Errorf("manager: CompactAfter %d: a chain may hold at most %d deltas (loader.MaxChain); compact before, below %d", o.CompactAfter, loader.MaxChain, loader.MaxChain)
	}
	if o.ScanInterval == 0 {
		o.ScanInterval = 10 * time.Second
	}
	if o.ValidatorTimeout == 0 {
		o.ValidatorTimeout = 60 * time.Second
	}
	switch {
	case o.MaxMoves == 0:
		o.MaxMoves = 4
	case o.MaxMoves < 0:
		o.MaxMoves = 0 // Policy: no bound
	}
	if o.GateRetry <= 0 {
		o.GateRetry = 5 * time.Second
	}
	switch {
	case o.GateTimeout == 0:
		o.GateTimeout = 60 * time.Second
	case o.GateTimeout < 0:
		return errors.New("manager: GateTimeout must not be negative")
	}
	switch {
	case o.GoldenTolerance == 0:
		o.GoldenTolerance = 1e-4
	case !(o.GoldenTolerance > 0):
		return errors.New("manager: GoldenTolerance must be positive")
	}
	switch {
	case o.HoldoutMargin == 0:
		o.HoldoutMargin = 0.01
	case o.HoldoutMargin < 0:
		o.HoldoutMargin = 0
	case !(o.HoldoutMargin > 0):
		return errors.New("manager: HoldoutMargin is not a number")
	}
	switch {
	case o.RouterWait == 0:
		o.RouterWait = 30 * time.Second
	case o.RouterWait < 0:
		o.RouterWait = 0 // Policy: for ever
	}
	o.PushProducerTTL = cmp.Or(o.PushProducerTTL, 24*time.Hour)
	o.MaxPushProducers = cmp.Or(o.MaxPushProducers, 1024)
	if o.MaxPushProducers < 0 || o.MaxPushProducers > codec.MaxPushProducers || o.PushProducerTTL < 0 {
		return fmt.Errorf("manager: MaxPushProducers must be 1 to %d, PushProducerTTL not negative", codec.MaxPushProducers)
	}
	if o.LeaderTTL == 0 {
		o.LeaderTTL = 5
	}
	if o.Repo.Manifests == nil {
		// Scans, validations and sealed pushes read the kept chains'
		// manifests again and again: parsed once each.
		o.Repo.Manifests = loader.NewManifestCache()
	}
	if o.Writer == "" {
		host, _ := os.Hostname()
		o.Writer = fmt.Sprintf("%s:%d:%s", host, os.Getpid(), rand.Text()[:6])
	}
	return nil
}

// Manager owns what is served. One goroutine applies events — repository
// scans, validation results, shard reports, operator commands — one at a
// time through Decide, persists the result and publishes the serving map,
// both in one conditional etcd transaction.
type Manager struct {
	opts     Options
	policy   Policy
	st       store
	commands chan request
	rescan   chan struct{}
	news     chan struct{}          // a new version may be in the repository: a quick scan
	reload   chan struct{}          // another manager wrote the state
	elected  chan bool              // the election's news: true on winning, false on losing
	stopped  chan struct{}          // closed when the loop returns
	leading  atomic.Bool            // whether this manager acts (loop goroutine writes)
	adminURL atomic.Pointer[string] // its console's URL, once ServeAdmin serves it
	sealed   sealedSet              // deltas it sealed, not read back (validate)
	// identities, shared by the validators: a delta's partition
	// identities extend its parent's hashes.
	identities codec.IdentityCache
	acting     atomic.Bool   // it leads and has scanned the repository since it came to
	reign      atomic.Uint64 // times acting was set: what the push server's windows belong to
	results    chan Event    // from the validator, one version at a time
	gates      chan RunGates // to the gate runner
	gr         gateRouter    // the gate runner's
	queue      validateQueue
	cancel     context.CancelFunc
	done       sync.WaitGroup
	view       atomic.Pointer[State] // the newest state; never modified
	// persisted is the state as last written; loop goroutine only.
	persisted *State
	// stored is persisted, for other goroutines: what the serving map in
	// etcd says (the view may hold decisions not yet written).
	stored  atomic.Pointer[State]
	written time.Time // when persisted was written
	held    bool      // the view has changes apply held back
	// removed is what the last prune removed; loop goroutine only.
	removed []uint64
	// compacting holds the models being compacted (auto-compaction).
	compacting sync.Map
	// noPrune and noCompact are why the repository could not be written
	// when auto-prune or compaction last tried ("" if it could), so that
	// each is logged once; loop goroutine only.
	noPrune, noCompact string
	// mismatches counts, per model, the shard × version pairs reporting
	// other content than validated; loop goroutine only.
	mismatches map[string]int
	// damagedNow counts, per model, versions whose files changed or went
	// after validation; loop goroutine only.
	damagedNow map[string]int
	metrics    metrics
	routers    atomic.Pointer[map[string]topo.RouterInfo] // the latest registrations read

	// With Options.Raft: the group, its state machine, the fence the
	// serving map is published through, the state machine's generation as
	// this manager last read or wrote it (loop goroutine), and the term it
	// leads.
	group  *raftgroup.Group
	fsm    *replicated
	fence  fence
	seen   uint64
	term   atomic.Uint64
	notify chan bool // raft's leadership notifications
	// takeoverErr is why the last takeover failed, while it keeps failing.
	takeoverErr atomic.Pointer[error]
	leadNews    chan struct{} // followRaft's signal to look at the leadership
	// unpublished are models whose serving map records a failed
	// publication left behind; loop goroutine only.
	unpublished map[string]bool
	// pub writes the serving map's records; loop goroutine only.
	pub *publisher
	// patchEntries: every member of the raft group reads entries of
	// schema 2 (patches), as its record says.
	patchEntries atomic.Bool
}

type request struct {
	cmd   Command
	reply chan reply
}

// reply is a command's outcome: the state right after it, before any
// later event, and for a prune what it removed.
type reply struct {
	st      *State
	err     error
	removed []uint64
}

type metrics struct {
	damaged     *prometheus.CounterVec
	damagedNow  prometheus.Gauge
	compactions *prometheus.CounterVec
	compared    prometheus.Counter
	conflicts   prometheus.Counter
	commits     prometheus.Counter
	mismatches  prometheus.Gauge
	// pushLive is, for each pushed delta that went live, the time from
	// its sealing to the commit that made it live.
	pushLive prometheus.Histogram
}

// Start reads the persisted state and begins managing. It returns once
// the state is read.
func Start(ctx context.Context, opts Options) (*Manager, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	m := &Manager{opts: opts, policy: Policy{Replicas: opts.Replicas, KeepVersions: opts.KeepVersions, KeepDeltas: opts.KeepDeltas, RouterWait: opts.RouterWait, StagedGates: stagedGates(opts),
		Holdout: slices.Sorted(maps.Keys(opts.Holdout)), MaxMoves: opts.MaxMoves, PushProducerTTL: opts.PushProducerTTL, MaxPushProducers: opts.MaxPushProducers},
		st:       store{cli: opts.Etcd, cluster: opts.Cluster, writer: opts.Writer},
		pub:      newPublisher(opts.Etcd, opts.Cluster),
		commands: make(chan request), rescan: make(chan struct{}, 1), news: make(chan struct{}, 1), reload: make(chan struct{}, 1), elected: make(chan bool), stopped: make(chan struct{}), results: make(chan Event), gates: make(chan RunGates, 64)}
	m.queue.init()
	m.mismatches, m.damagedNow = map[string]int{}, map[string]int{}
	m.metrics = metrics{
		damaged: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cumulus_manager_damaged_versions_total",
			Help: "Validated versions found changed (files edited, truncated, replaced) or removed (a live version's directory) in the repository, by what."}, []string{"what"}),
		damagedNow: prometheus.NewGauge(prometheus.GaugeOpts{Name: "cumulus_manager_damaged_versions",
			Help: "Versions the manager keeps whose files changed or went after validation (shards serve the copies they verified; none can load them again)."}),
		compactions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cumulus_manager_compactions_total",
			Help: "Chains compacted into a full version (--compact-after), by result: ok, superseded (a version off the chain came first), failed."}, []string{"result"}),
		compared: prometheus.NewCounter(prometheus.CounterOpts{Name: "cumulus_manager_models_compared_total",
			Help: "Models an event may have changed, compared with what etcd holds before writing: each costs in proportion to the model's state."}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{Name: "cumulus_manager_write_conflicts_total",
			Help: "State writes refused because another manager wrote first; each is followed by a fresh read."}),
		commits: prometheus.NewCounter(prometheus.CounterOpts{Name: "cumulus_manager_commits_total",
			Help: "Versions made live (rollouts and rollbacks)."}),
		mismatches: prometheus.NewGauge(prometheus.GaugeOpts{Name: "cumulus_manager_identity_mismatches",
			Help: "Shard × model version pairs whose reported content differs from what the manager validated."}),
		pushLive: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "cumulus_push_sealed_to_live_seconds",
			Help:    "From a push window's sealing to the commit that made its delta live: validated, loaded by every assigned shard, and in the serving map routers follow.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 12)}),
	}
	if opts.Registry != nil {
		for _, c := range []prometheus.Collector{m.metrics.damaged, m.metrics.damagedNow, m.metrics.compactions, m.metrics.compared, m.metrics.conflicts, m.metrics.commits, m.metrics.mismatches, m.metrics.pushLive, servedPushAge{m}} {
			if err := opts.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("manager: metrics: %w", err)
			}
		}
	}
	if opts.Raft != nil {
		if err := m.startRaft(); err != nil {
			return nil, err
		}
		m.setPersisted(m.raftState())
	} else {
		lctx, lcancel := context.WithTimeout(ctx, 10*time.Second)
		loaded, err := m.st.load(lctx)
		lcancel()
		if err != nil {
			return nil, fmt.Errorf("%w (is etcd reachable at the given endpoints?)", err)
		}
		m.setPersisted(loaded)
	}
	m.view.Store(m.persisted)
	ctx, cancel := context.WithCancel(ctx)
	m.cancel = cancel
	shards := make(chan map[string]topo.ShardInfo, 1)
	routers := make(chan map[string]topo.RouterInfo, 1)
	m.done.Add(6 + validators)
	go func() { defer m.done.Done(); m.watchRepo(ctx) }()
	m.done.Add(1)
	go func() { defer m.done.Done(); removeLeftovers(opts.Repo.Dir) }()
	if m.group != nil {
		go func() { defer m.done.Done(); m.followRaft(ctx) }()
		go func() { defer m.done.Done(); m.raftChanges(ctx) }()
		m.done.Add(2)
		go func() { defer m.done.Done(); m.drainNotify(ctx) }()
		go func() { defer m.done.Done(); m.reportMember(ctx) }()
	} else {
		go func() { defer m.done.Done(); m.campaign(ctx) }()
		go func() {
			defer m.done.Done()
			// Another manager's write makes this one's view stale: read
			// again rather than wait for a write of its own to fail.
			topo.Watch(ctx, opts.Etcd, m.st.guardKey(), func(kv map[string][]byte, _ int64) {
				g, err := topo.Decode[guardRecord](m.st.guardKey(), kv[m.st.guardKey()])
				if err != nil || g.Writer == opts.Writer {
					return
				}
				select {
				case m.reload <- struct{}{}:
				default:
				}
			})
		}()
	}
	go func() {
		defer m.done.Done()
		reports := topo.NewShardReader(opts.Cluster) // decodes only the records that changed
		topo.Watch(ctx, opts.Etcd, opts.Cluster.ShardsPrefix(), func(kv map[string][]byte, _ int64) {
			infos := reports.Shards(kv)
			select { // keep only the newest
			case <-shards:
			default:
			}
			shards <- infos
		})
	}()
	go func() {
		defer m.done.Done()
		topo.Watch(ctx, opts.Etcd, opts.Cluster.RoutersPrefix(), func(kv map[string][]byte, _ int64) {
			infos := topo.DecodeAll[topo.RouterInfo](kv, opts.Cluster.RoutersPrefix())
			select { // keep only the newest
			case <-routers:
			default:
			}
			routers <- infos
		})
	}()
	for range validators {
		go func() { defer m.done.Done(); m.validator(ctx) }()
	}
	m.done.Add(1)
	go func() { defer m.done.Done(); m.runGates(ctx) }()
	go func() { defer m.done.Done(); m.loop(ctx, shards, routers) }()
	return m, nil
}

// Routers are the routers' latest registrations, as this manager has
// read them (leading or not).
func (m *Manager) Routers() map[string]topo.RouterInfo {
	if r := m.routers.Load(); r != nil {
		return *r
	}
	return nil
}

// stagedGates are the gates opts configure to run on staged versions.
func stagedGates(o Options) []string {
	if o.Validator != "" {
		return []string{GateValidator}
	}
	return nil
}

// Rescan asks for a repository scan now.
func (m *Manager) Rescan() {
	select {
	case m.rescan <- struct{}{}:
	default:
	}
}

// newVersions asks for a quick scan (quickScan): the repository's
// listing changed, or a push was sealed.
func (m *Manager) newVersions() {
	select {
	case m.news <- struct{}{}:
	default:
	}
}

// ErrNotLeader is returned by Do on a manager that is not the one acting.
var ErrNotLeader = errors.New("manager: this manager is on standby; send state-changing calls to the leading manager")

// Ready says whether the manager can do its part: etcd answers it (a
// read that needs etcd's quorum). A manager on standby is ready too: it
// follows the state the leader writes, and takes over from it.
func (m *Manager) Ready(ctx context.Context) error {
	if _, err := m.opts.Etcd.Get(ctx, m.opts.Cluster.ManagerPrefix()+"guard"); err != nil {
		return fmt.Errorf("etcd does not answer: %w", err)
	}
	if m.group != nil {
		return m.raftReady()
	}
	return nil
}

// WaitLeading waits until this manager leads and has scanned the
// repository since (a single manager, such as cumulus dev's, once it has
// won its election), or ctx ends.
func (m *Manager) WaitLeading(ctx context.Context) error {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for !m.acting.Load() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("manager: not leading: %w", ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// Leading reports whether this manager is the one acting: of the
// managers of a cluster, one at a time leads (an etcd election); the
// others follow the state it writes and take over if it dies.
func (m *Manager) Leading() bool { return m.leading.Load() }

// campaign runs the leader election until ctx ends, telling the loop when
// this manager wins and when it loses the lead.
func (m *Manager) campaign(ctx context.Context) {
	key := m.opts.Cluster.ManagerPrefix() + "leader"
	for ctx.Err() == nil {
		session, err := concurrency.NewSession(m.opts.Etcd, concurrency.WithTTL(m.opts.LeaderTTL), concurrency.WithContext(ctx))
		if err != nil {
			slog.Warn("manager: joining the leader election; retrying", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		el := concurrency.NewElection(session, key)
		won := make(chan error, 1)
		go func() { won <- el.Campaign(ctx, m.opts.Writer) }()
		select {
		case err = <-won:
		case <-ctx.Done():
			// A Campaign cancelled resigns with the etcd client's own
			// context: with etcd out of reach, until the client is
			// closed. Close must not wait for that (a manager whose etcd
			// is gone would not stop on SIGTERM); the campaign ends when
			// its owner closes the client. One that has just won gives
			// the lead back at once rather than at its lease's end.
			select {
			case err := <-won:
				if err == nil {
					rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					el.Resign(rctx)
					cancel()
				}
				session.Close()
			default:
			}
			return
		}
		if err == nil {
			slog.Info("manager: leading", "writer", m.opts.Writer)
			m.tell(ctx, true)
			select {
			case <-session.Done():
				slog.Warn("manager: lost the lead (its etcd lease expired)")
			case <-ctx.Done():
			}
			m.tell(context.Background(), false)
			rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			el.Resign(rctx)
			cancel()
		}
		session.Close()
	}
}

func (m *Manager) tell(ctx context.Context, leading bool) {
	if !leading {
		m.leading.Store(false) // at once: Do must not queue on a deposed manager
	}
	select {
	case m.elected <- leading:
	case <-ctx.Done():
	case <-m.stopped:
	}
}

// Do applies an operator's command and returns once its result is
// persisted and the serving map written, or the command refused
// (ErrNotFound, ErrConflict, ErrInvalid), or its result could not be
// written (ErrUnconfirmed: the state shown is then what etcd holds). If
// ctx ends first, the command may still be applied. The state returned
// is the one right after the command, whatever came after it: it
// describes the call's own result.
func (m *Manager) Do(ctx context.Context, c Command) (*State, error) {
	r, err := m.do(ctx, c)
	return r.st, err
}

func (m *Manager) do(ctx context.Context, c Command) (reply, error) {
	if !m.leading.Load() {
		return reply{}, m.notLeader()
	}
	req := request{cmd: c, reply: make(chan reply, 1)}
	select {
	case m.commands <- req:
	case <-ctx.Done():
		return reply{}, ctx.Err()
	}
	select {
	case r := <-req.reply:
		return r, r.err
	case <-ctx.Done():
		return reply{}, ctx.Err()
	}
}

// State returns the newest state. The caller must not modify it.
func (m *Manager) State() *State { return m.view.Load() }

// Close stops the manager. The serving map stays as last written.
func (m *Manager) Close() {
	if m.group != nil && m.group.Leading() {
		// Another member leads at once, rather than after an election
		// timeout.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := m.group.HandOver(ctx); err != nil {
			slog.Warn("manager: handing the raft group's lead over before stopping", "err", err)
		}
		cancel()
	}
	m.cancel()
	m.done.Wait()
	if m.group != nil {
		if err := m.group.Close(); err != nil {
			slog.Warn("manager: stopping its raft member", "err", err)
		}
	}
}

// notLeader is ErrNotLeader naming the leader, as far as etcd tells.
func (m *Manager) notLeader() error {
	if m.group != nil {
		if id, addr := m.group.Leader(); id != "" {
			return fmt.Errorf("%w (the leader is %s, raft address %s)", ErrNotLeader, id, addr)
		}
		return fmt.Errorf("%w (no leader elected yet)", ErrNotLeader)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := m.opts.Etcd.Get(ctx, m.opts.Cluster.ManagerPrefix()+"leader", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(1))
	if err != nil || len(resp.Kvs) == 0 {
		return fmt.Errorf("%w (no leader elected yet)", ErrNotLeader)
	}
	return fmt.Errorf("%w (the leader is %s)", ErrNotLeader, resp.Kvs[0].Value)
}

// loop applies events one at a time. A manager that does not lead only
// follows the state the leader writes: it decides nothing. The shards'
// reports are applied only once the routers' registrations have come
// (until then nothing is placed or committed): a version is committed
// only when every router can score it.
func (m *Manager) loop(ctx context.Context, shards <-chan map[string]topo.ShardInfo, routers <-chan map[string]topo.RouterInfo) {
	defer close(m.stopped)
	tick := time.NewTicker(m.opts.ScanInterval)
	defer tick.Stop()
	var latest map[string]topo.ShardInfo
	var latestRouters map[string]topo.RouterInfo
	var flush <-chan time.Time       // armed while changes are held back
	wait := time.NewTimer(time.Hour) // a router's wait on a staged version runs out
	wait.Stop()
	for {
		lead := m.leading.Load()
		if !m.held || !lead {
			flush = nil
		} else if flush == nil {
			flush = time.After(maxHold - time.Since(m.written))
		}
		// Armed for a deadline still to come only: one already past is
		// decided by the next event (a past one re-armed would spin).
		if t := m.view.Load().RouterDeadline(m.policy); lead && latestRouters != nil && time.Until(t) > 0 {
			wait.Reset(time.Until(t))
		}
		select {
		case <-ctx.Done():
			return
		case <-flush:
			flush = nil
			m.flush(ctx)
		case won := <-m.elected:
			m.acting.Store(false)
			if !won && m.held {
				// Deposed with decisions held back: they are not this
				// manager's to write; show what was persisted.
				m.unhold()
			}
			if !won {
				m.leading.Store(false) // also over a win told just before
			}
			if won {
				m.refresh(ctx)
				m.leading.Store(true)
				if latestRouters != nil {
					m.apply(ctx, RoutersChanged{Routers: latestRouters})
				}
				if latest != nil && latestRouters != nil {
					m.apply(ctx, ShardsChanged{Shards: latest})
				}
				m.scan(ctx)
				m.reign.Add(1)
				m.acting.Store(true)
				for _, ms := range m.view.Load().Models {
					m.maybeCompact(ms) // one a restart interrupted
				}
			}
		case s := <-shards:
			latest = s
			if lead && latestRouters != nil {
				m.apply(ctx, ShardsChanged{Shards: s})
			}
		case r := <-routers:
			first := latestRouters == nil
			latestRouters = r
			m.routers.Store(&r)
			if lead {
				m.apply(ctx, RoutersChanged{Routers: r})
				if first && latest != nil {
					m.apply(ctx, ShardsChanged{Shards: latest})
				}
			}
		case <-wait.C:
			if lead && latestRouters != nil {
				m.apply(ctx, RoutersChanged{Routers: latestRouters})
			}
		case <-tick.C:
			if lead && m.group != nil {
				if err := m.publishPending(ctx, m.persisted); err != nil {
					slog.Error("manager: publishing the serving map", "err", err)
				}
			}
			if lead {
				m.scan(ctx)
			}
		case <-m.rescan:
			if lead {
				m.scan(ctx)
			}
		case <-m.news:
			if lead {
				m.quickScan(ctx)
			}
		case <-m.reload:
			m.refresh(ctx)
		case ev := <-m.results:
			c, checked := ev.(Checked)
			if checked {
				// Finished only now: while the loop has results to apply,
				// the queue is busy and the writes wait for the last one.
				m.queue.finish(Validate{Model: c.Model, Version: c.Version})
			}
			if lead {
				m.apply(ctx, ev)
			}
			// A result for files that changed while they were checked is
			// dropped (the scan that saw the change asked for a validation
			// the queue merged with this one): check them as they are.
			if v := m.view.Load().version(c.Model, c.Version); checked && lead && v != nil && v.Files != c.Files {
				m.queue.push(Validate{Model: c.Model, Version: c.Version})
			}
		case req := <-m.commands:
			if !lead {
				req.reply <- reply{err: m.notLeader()}
				continue
			}
			switch req.cmd.Op {
			case OpRescan:
				m.scan(ctx) // the operator's: every kept version's files looked at again
			case OpUnpin:
			default:
				m.quickScan(ctx) // a version published a moment ago is known to the command
			}
			if req.cmd.Op == OpPrune {
				m.listForPrune(&req.cmd)
			}
			m.removed = nil
			err := m.apply(ctx, req.cmd)
			req.reply <- reply{st: m.view.Load(), err: err, removed: m.removed}
		}
	}
}

// refresh reads the persisted state again after another manager wrote
// it (or a write's outcome is unknown), keeping the shards' reports. It
// reports whether it could read; nothing is read when etcd's state is the
// one this manager last wrote.
func (m *Manager) refresh(ctx context.Context) bool {
	if m.group != nil {
		m.refreshRaft()
		return true
	}
	rctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	resp, err := m.opts.Etcd.Get(rctx, m.st.guardKey())
	if err == nil && (len(resp.Kvs) == 0 && m.st.rev == 0 || len(resp.Kvs) == 1 && resp.Kvs[0].ModRevision == m.st.rev) {
		return true // etcd holds what this manager last read or wrote
	}
	fresh, err := m.st.load(rctx)
	if err != nil {
		slog.Error("manager: reading the state from etcd", "err", err)
		return false
	}
	if m.leading.Load() {
		slog.Warn("manager: the state in etcd was written by another manager (or by a write whose answer was lost); following it")
	} else {
		slog.Debug("manager: following the leading manager's state")
	}
	fresh.Shards, fresh.Routers = m.view.Load().Shards, m.view.Load().Routers
	m.view.Store(fresh)
	m.setPersisted(fresh)
	m.held = false
	m.pub = newPublisher(m.opts.Etcd, m.opts.Cluster) // another writer's records: read again before writing
	return true
}

// scan lists the repository and applies what it found. When the
// repository cannot be read at all, nothing changes.
func (m *Manager) scan(ctx context.Context) { m.scanWith(ctx, false) }

// quickScan is a scan that takes the versions the state has validated
// (or rejected) as they were last scanned, reading nothing of theirs: a
// scan a new version asked for (a watch event, a sealed push) costs the
// listing and what is new, not the kept versions' files. The periodic
// scan still checks them.
func (m *Manager) quickScan(ctx context.Context) { m.scanWith(ctx, true) }

func (m *Manager) scanWith(ctx context.Context, quick bool) {
	ev, err := scanRepo(m.opts.Repo, scanModes(m.view.Load(), quick))
	if err != nil {
		slog.Error("manager: scanning repository; keeping the current state", "err", err)
		return
	}
	m.apply(ctx, ev)
}

// scanModes says how a scan reads each version directory, given the
// state view: in a quick scan, what the state has validated is taken as
// last scanned.
func scanModes(view *State, quick bool) func(model string, v uint64) (scanMode, *Found) {
	return func(model string, v uint64) (scanMode, *Found) {
		ms := view.Models[model]
		var known *Version
		if ms != nil {
			known = ms.version(v)
		}
		switch {
		case quick && known != nil && known.Files != "" && !known.Phase.pending() && !known.Gone && !known.Damaged:
			return scanKnown, &Found{Version: v, Kind: known.Kind, Parent: known.Parent, Files: known.Files}
		case ms == nil || v > ms.Floor || known != nil:
			return scanFull, nil
		case ms.Chained[v] != "":
			if quick {
				// The fingerprint alone, as a full scan lists it: the
				// entry whole never matched, and every quick scan (one a
				// sealed push) had every chained version validated again.
				return scanKnownPrint, &Found{Files: chainedPrint(ms.Chained[v])}
			}
			return scanPrint, nil
		}
		return scanSkip, nil
	}
}

// writeTimeout bounds one write of the state (and one read after a
// failed write), so an unreachable etcd cannot hold the loop forever.
const writeTimeout = 5 * time.Second

// maxHold bounds how long changes are held back while validations run.
const maxHold = 250 * time.Millisecond

// maxApply bounds how often one event is decided again after another
// manager's write made this one's view stale.
const maxApply = 5

// apply decides ev on the current state, persists the result and
// publishes the serving map, deciding again on a fresh read if another
// writer got there first. It returns Decide's refusal of a command, or
// the error that kept the result from being persisted.
//
// While validations are queued or under way, what changes is held back
// (up to maxHold after the last write, then flushed by the loop) and
// written together: versions found by one scan and validated within that
// time reach the map at once, so a router rarely sees one model of a
// repository without the others it would see a moment later. Commands
// are written at once. (A result held back and lost to a conflicting
// write is not lost for good: the next scan queues versions still
// pending again.)
func (m *Manager) apply(ctx context.Context, ev Event) error {
	for attempt := 1; ; attempt++ {
		if !m.leading.Load() {
			return m.notLeader() // deposed meanwhile: the new leader decides
		}
		cur := m.view.Load()
		p := m.policy
		p.Now = time.Now()
		next, acts, refused := Decide(cur, ev, p)
		m.view.Store(next)
		m.after(cur, next, acts)
		if _, cmd := ev.(Command); !cmd && m.queue.busy() && time.Since(m.written) < maxHold {
			m.held = true
			return nil
		}
		err := m.write(ctx, next, acts)
		if err == nil {
			return refused
		}
		if errors.Is(err, ErrTooLarge) {
			// Nothing was written, for certain: say so, not "unconfirmed".
			slog.Error("manager: not persisted", "event", fmt.Sprintf("%T", ev), "err", err)
			m.unhold()
			return err
		}
		if !errors.Is(err, ErrStale) || attempt == maxApply {
			// Whether a write that timed out took effect is unknown: show
			// what etcd holds, or the last state known to be written.
			// The decision is dropped (a later event decides again), and the
			// view shows what etcd holds: the last state written, or a newer
			// one if the write took effect after all.
			slog.Error("manager: not persisted; showing what etcd holds", "event", fmt.Sprintf("%T", ev), "err", err)
			m.unhold()
			m.refresh(ctx)
			return fmt.Errorf("%w: %v", ErrUnconfirmed, err)
		}
		m.metrics.conflicts.Inc()
		m.refresh(ctx)
	}
}

// write persists next (with acts' audit entries) and publishes its
// serving map.
func (m *Manager) write(ctx context.Context, next *State, acts []Action) error {
	wctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	c := m.changes(m.persisted, next, acts)
	if m.group != nil {
		committed, err := m.commitRaft(wctx, c, next)
		if !committed {
			return err
		}
		if err != nil {
			// The change stands (the group holds it); the map follows
			// when a publication succeeds.
			slog.Error("manager: committed, but the serving map is not published yet; trying again", "err", err)
		}
	} else {
		states, done, err := m.st.stateOps(c, m.persisted, next)
		if err != nil {
			return err
		}
		err = m.pub.publish(wctx, next, slices.Concat(c.maps, c.gone), func(ops txnOps) error {
			ops.Add(states)
			return m.st.commit(wctx, c, ops)
		})
		if err != nil {
			return err
		}
		done()
	}
	prev := m.persisted
	m.setPersisted(next)
	m.written, m.held = time.Now(), false
	m.carryOut(ctx, prev, next, acts)
	return nil
}

// setPersisted records s as the state last written. Loop goroutine
// only.
func (m *Manager) setPersisted(s *State) {
	m.persisted = s
	m.stored.Store(s)
}

// ShardState is a shard's state in placement (State.ShardState), but
// "empty" only once the serving map in etcd assigns it nothing: a shard
// shown empty can be stopped without a router still sending to it.
func (m *Manager) ShardState(id string) string {
	st := m.State().ShardState(id)
	if st == "empty" && m.stored.Load().ShardState(id) != "empty" {
		return "cordoned"
	}
	return st
}

// unhold drops decisions not written (held back, or whose write failed):
// the view is again the state last persisted. Loop goroutine only.
func (m *Manager) unhold() {
	m.view.Store(m.persisted)
	m.held = false
}

// flush writes what apply held back. What a conflicting write makes
// stale is dropped (the next scan finds versions still pending).
func (m *Manager) flush(ctx context.Context) {
	if !m.held || !m.leading.Load() {
		return
	}
	if err := m.write(ctx, m.view.Load(), nil); err != nil {
		if !errors.Is(err, ErrStale) {
			slog.Error("manager: not persisted; showing what etcd holds", "err", err)
		}
		m.unhold()
		m.refresh(ctx)
	}
}

// changes is changesOf, counted.
func (m *Manager) changes(cur, next *State, acts []Action) change {
	c, compared := changesOf(cur, next, acts)
	m.metrics.compared.Add(float64(compared))
	return c
}

// changesOf is what differs between two states, as records to write, and
// how many models it compared. A model next shares with cur (Decide
// copies only what an event touches) is not looked at.
func changesOf(cur, next *State, acts []Action) (c change, compared int) {
	c = change{patches: map[string]modelPatch{}}
	for name, nm := range next.Models {
		om := cur.Models[name]
		if om == nm {
			continue
		}
		compared++
		if p, ok := patchOf(om, nm); ok {
			c.patches[name] = p
		}
		if nm.Partitions == 0 {
			continue // nothing to serve yet
		}
		// Seq counts the changes of the model's map (ModelState.count).
		if om == nil || om.Partitions == 0 || om.Seq != nm.Seq {
			c.maps = append(c.maps, name)
		}
	}
	for name := range cur.Models {
		if next.Models[name] == nil {
			c.gone = append(c.gone, name)
		}
	}
	slices.Sort(c.gone)
	slices.Sort(c.maps)
	if !slices.Equal(cur.Cordoned, next.Cordoned) {
		c.cordons, _ = json.Marshal(cordonRecord{Schema: recordSchema, Shards: append([]string{}, next.Cordoned...)})
	}
	for _, a := range acts {
		if e, ok := a.(AuditEntry); ok {
			c.audit = append(c.audit, e)
		}
	}
	return c, compared
}

// after carries out a persisted decision's actions and logs what
// changed.
func (m *Manager) after(cur, next *State, acts []Action) {
	for _, a := range acts {
		switch a := a.(type) {
		case Validate:
			m.queue.push(a)
		case RunGates:
			select {
			case m.gates <- a:
			default:
				slog.Error("manager: too many gate runs queued; this one waits for the version to be staged again", "model", a.Model, "version", a.Version)
			}
		}
	}
	shardsChanged := !sameShards(cur.Shards, next.Shards)
	for _, name := range slices.Sorted(maps.Keys(next.Models)) {
		nm, om := next.Models[name], cur.Models[name]
		if nm == om && !shardsChanged {
			continue // untouched by this event
		}
		if om != nil {
			for _, v := range om.Versions {
				if v.Version <= nm.Floor && nm.version(v.Version) == nil {
					slog.Info("manager: version retired", "model", name, "version", v.Version, "was", v.Phase)
				}
			}
		}
		damaged := 0
		for _, v := range nm.Versions {
			var was Version
			if om != nil {
				if x := om.version(v.Version); x != nil {
					was = *x
				}
			}
			if v.Damaged || v.Gone || v.Broken != "" {
				damaged++
			}
			switch {
			case v.Broken != "" && was.Broken == "":
				m.metrics.damaged.WithLabelValues("chain").Inc()
				slog.Error("manager: a version's chain can no longer be loaded", "model", name, "version", v.Version, "phase", v.Phase, "reason", v.Broken)
			case v.Damaged && !was.Damaged:
				m.metrics.damaged.WithLabelValues("changed").Inc()
				slog.Error("manager: a validated version's files changed in the repository", "model", name, "version", v.Version, "phase", v.Phase, "reason", v.Reason)
			case v.Gone && !was.Gone:
				m.metrics.damaged.WithLabelValues("removed").Inc()
				slog.Error("manager: a live version's directory was removed from the repository", "model", name, "version", v.Version, "reason", v.Reason)
			}
			if was.Phase != v.Phase {
				l := slog.Info
				if v.Phase == PhaseRejected {
					l = slog.Error
				}
				l("manager: version "+string(v.Phase), "model", name, "version", v.Version, "reason", v.Reason)
			}
		}
		if om != nil && om.Live != nm.Live && nm.Live != 0 {
			m.metrics.commits.Inc()
			if v := nm.version(nm.Live); v != nil && !v.PushedAt.IsZero() && nm.Live > om.Live && m.leading.Load() { // not a rollback
				m.metrics.pushLive.Observe(time.Since(v.PushedAt).Seconds())
			}
		}
		was := cur.Mismatches(name)
		n := 0
		for id, vs := range next.Mismatches(name) {
			n += len(vs)
			if len(was[id]) != len(vs) {
				slog.Error("manager: shard reports content other than validated; not assigning it this model", "shard", id, "model", name, "versions", vs)
			}
		}
		m.mismatches[name] = n
		m.damagedNow[name] = damaged
	}
	for name := range m.mismatches {
		if next.Models[name] == nil {
			delete(m.mismatches, name)
			delete(m.damagedNow, name)
		}
	}
	total, damaged := 0, 0
	for name, n := range m.mismatches {
		total += n
		damaged += m.damagedNow[name]
	}
	m.metrics.mismatches.Set(float64(total))
	m.metrics.damagedNow.Set(float64(damaged))
}

// sameShards reports whether a and b are the same reports (the same map,
// as Decide passes them on unless they changed).
func sameShards(a, b map[string]topo.ShardInfo) bool {
	return len(a) == len(b) && (len(a) == 0 || reflect.ValueOf(a).UnsafePointer() == reflect.ValueOf(b).UnsafePointer())
}

// validators is how many versions are validated at once: a delta does
// not wait behind a large full version's checksums, and a burst of
// versions does not take every core.
const validators = 3

// validator validates versions one at a time, off the loop, so a large
// version's checksums never hold up commands or rollouts of others;
// several run.
func (m *Manager) validator(ctx context.Context) {
	for {
		v, ok := m.queue.pop(ctx)
		if !ok {
			return
		}
		select {
		case m.results <- Started(v):
		case <-ctx.Done():
			return
		}
		checked := validate(m.opts.Repo, v, m.sealed.take(v), &m.identities) // the loop marks it finished when it applies the result
		select {
		case m.results <- checked:
		case <-ctx.Done():
			return
		}
	}
}

// sealedSet is the versions this manager sealed from pushes, with their
// files' fingerprints, until the validator takes them (validate). At
// most maxSealed are kept: a version never validated here (the lead
// lost) is forgotten.
type sealedSet struct {
	mu    sync.Mutex
	fps   map[Validate]string
	order []Validate
}

const maxSealed = 256

func (s *sealedSet) add(v Validate, fp string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fps == nil {
		s.fps = map[Validate]string{}
	}
	s.fps[v] = fp
	s.order = append(s.order, v)
	for len(s.order) > maxSealed {
		delete(s.fps, s.order[0])
		s.order = s.order[1:]
	}
}

// take returns v's fingerprint and forgets it ("" if none).
func (s *sealedSet) take(v Validate) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	fp := s.fps[v]
	delete(s.fps, v)
	return fp
}

// validateQueue is the validator's queue: a version is queued once until
// its validation finishes.
type validateQueue struct {
	mu     sync.Mutex
	items  []Validate
	queued map[Validate]bool
	wake   chan struct{}
}

func (q *validateQueue) init() {
	q.queued = map[Validate]bool{}
	q.wake = make(chan struct{}, 1)
}

func (q *validateQueue) push(v Validate) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.queued[v] {
		return
	}
	q.queued[v] = true
	q.items = append(q.items, v)
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *validateQueue) pop(ctx context.Context) (Validate, bool) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			v := q.items[0]
			q.items = q.items[1:]
			q.mu.Unlock()
			return v, true
		}
		q.mu.Unlock()
		select {
		case <-q.wake:
		case <-ctx.Done():
			return Validate{}, false
		}
	}
}

// busy reports whether validations are queued or under way.
func (q *validateQueue) busy() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queued) > 0
}

func (q *validateQueue) finish(v Validate) {
	q.mu.Lock()
	delete(q.queued, v)
	q.mu.Unlock()
}
