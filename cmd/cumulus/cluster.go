package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/adminhttp"
	"github.com/cumulus-serving/cumulus/internal/admit"
	"github.com/cumulus-serving/cumulus/internal/buildinfo"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/manager"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/server"
	"github.com/cumulus-serving/cumulus/shard"
)

// probeUsage is --probe-addr's help (router and manager).
const probeUsage = "plain HTTP address (no token, no client certificate) for Kubernetes' probes and scrapers: GET /healthz (alive), /readyz (ready to serve; the manager: etcd answers it; a shard: it holds what the map assigns it) and /metrics (default: none)"

// serveProbes serves adminhttp.Probes on addr (none if empty) and prints
// its address; stop stops it. served is the address it listens on ("":
// none).
func serveProbes(addr string, ready func(context.Context) error, who string) (stop func(), served string, err error) {
	if addr == "" {
		return func() {}, "", nil
	}
	p, err := adminhttp.Serve(addr, adminhttp.Probes(ready, prometheus.DefaultGatherer), 30*time.Second, nil, who)
	if err != nil {
		return nil, "", err
	}
	fmt.Printf("probes: http://%s\n", p.Addr())
	return p.Close, p.Addr(), nil
}

// defaultLoadRate is --load-rate's default (see shard.Options.LoadRate):
// no bound. On the 2-core machine scripts/scale.sh was run on, 128 MiB/s
// lowered the worst second's p99 of a scale-out but made the rebalance
// four times as long, and the p99 over it higher.
const defaultLoadRate = 0

const loadRateUsage = "bytes a second a shard reads from the repository to load partitions once it serves (a rebalance, a rollout), so that loading leaves CPU to serving, e.g. 128MB; a shard that has answered no lookup yet (starting, joining) loads at full speed (0: no bound)"

// diskReadsFlag is --disk-reads: how partitions served from disk are
// read (shard.Options.DiskReads).
type diskReadsFlag string

const diskReadsUsage = "how partitions served from disk are read: io_uring (a lookup's reads submitted together; preads where the kernel refuses it) or pread (a goroutine a read)"

func (f *diskReadsFlag) String() string {
	if *f == "" {
		return "io_uring"
	}
	return string(*f)
}

func (f *diskReadsFlag) Set(v string) error {
	if v != "io_uring" && v != "pread" {
		return fmt.Errorf("%q: want io_uring or pread", v)
	}
	*f = diskReadsFlag(v)
	return nil
}

func (f *diskReadsFlag) Type() string { return "io_uring|pread" }

func shardCommand() *cobra.Command {
	var id, repo, etcd, addr, advertise, dataDir, zone string
	var weight float64
	var cluster clusterFlag
	var etcdTLS tlsconf.Files
	var budget byteSize
	loadRate := byteSize(defaultLoadRate)
	var diskReads diskReadsFlag
	var drain drainFlag
	var adm admitFlags
	var httpAddr, probeAddr string
	var admin adminFlags
	var fault faultFlag
	var tlsf roleFlags
	var profile profileFlag
	cmd := &cobra.Command{
		Use:   "shard",
		Short: "Run a shard server: holds the partitions the manager assigns to it",
		Long: `shard serves the partitions the manager assigns it. Its gRPC health is
SERVING once it holds what the serving map assigns it. On SIGTERM or
SIGINT it drains: NOT_SERVING, leaves etcd, answers the lookups that still
come until a quiet second, lets those under way finish, and exits 0
(1 if --drain-timeout cut it short).

With --http-addr it serves /metrics, /healthz, /readyz (200 once it holds
what the map assigns it) and GET|PUT /admin/v1/fault ({"spec": "SPEC"},
"" clears; needs the admin token). With --tls-* that address is HTTPS:
it asks for a client certificate but answers probes and scrapers
without one; the fault API needs an operator's. --probe-addr serves
the probes and /metrics alone, in plain HTTP whatever the TLS flags.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			stop, err := profile.start()
			if err != nil {
				return err
			}
			defer stop()
			token, err := admin.resolve()
			if err != nil {
				return err
			}
			cli, err := etcdClient(cmd.Context(), etcd, etcdTLS)
			if err != nil {
				return err
			}
			defer cli.Close()
			if !cmd.Flags().Changed("memory-budget") {
				budget = byteSize(defaultBudget(1))
			}
			if budget > 0 {
				fmt.Printf("memory budget: %s resident\n", &budget)
			}
			tlsSrc, err := tlsf.load(cmd.Context(), cluster.c)
			if err != nil {
				return err
			}
			// The shard outlives the signal: Drain stops it.
			s, err := shard.Start(context.WithoutCancel(cmd.Context()), shard.Options{ID: id, TLS: tlsSrc, Repo: loader.Repo{Dir: repo}, Etcd: cli, Cluster: cluster.c, Build: buildinfo.String(), Weight: weight, Zone: zone,
				ListenAddr: addr, AdvertiseAddr: advertise, Registry: prometheus.DefaultRegisterer, MemoryBudget: int64(budget), DataDir: dataDir, LoadRate: int64(loadRate), DiskReads: string(diskReads),
				MaxInflight: adm.inflight, MaxInflightBytes: int64(adm.bytes), MaxQueueTime: adm.queue, Faults: fault.f, Starting: cmd.Context()})
			if err != nil {
				return err
			}
			defer s.Close()
			fmt.Printf("shard %s serving on %s\n", id, s.Addr())
			if fault.f != nil {
				fmt.Printf("injecting faults into lookups: %s\n", fault.f)
			}
			if httpAddr != "" {
				// With --tls-*, TLS asking for a certificate: probes and
				// scrapers present none, the fault API needs an operator's.
				var tc *tls.Config
				scheme := "http"
				if tlsSrc != nil {
					tc, scheme = tlsSrc.ServerAsking(), "https"
				}
				h, err := adminhttp.Serve(httpAddr, s.HTTPHandler(token, prometheus.DefaultGatherer), 30*time.Second, tc, "shard "+id)
				if err != nil {
					return err
				}
				defer h.Close()
				fmt.Printf("http: %s://%s\n", scheme, h.Addr())
			}
			stopProbes, _, err := serveProbes(probeAddr, s.CheckReady, "shard probes")
			if err != nil {
				return err
			}
			defer stopProbes()
			ctx, cancel := drain.await(cmd.Context())
			defer cancel()
			return s.Drain(ctx)
		},
	}
	cmd.Flags().StringVar(&id, "id", "", "shard name, unique in the cluster (required)")
	cluster.register(cmd)
	cmd.Flags().StringVar(&repo, "repo", "", "model repository directory (required)")
	cmd.Flags().StringVar(&etcd, "etcd", "http://127.0.0.1:2379", "etcd endpoints, comma-separated")
	registerEtcdTLS(cmd.Flags(), &etcdTLS)
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:0", "gRPC listen address")
	cmd.Flags().StringVar(&advertise, "advertise", "", "address routers dial (default: the listen address)")
	cmd.Flags().Var(&budget, "memory-budget", "resident table bytes and value caches (e.g. 8GB); a shard assigned more serves it from disk (directories resident, records read from the file, the most asked values cached), and a version being loaded beside the live one stays within it (default: half the machine's memory or cgroup limit; 0: no bound)")
	cmd.Flags().Var(&loadRate, "load-rate", loadRateUsage)
	cmd.Flags().Var(&diskReads, "disk-reads", diskReadsUsage)
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "directory, on disk, for the shard's own copies of partitions it serves mapped (default: cumulus-shard-CLUSTER-ID in the temporary directory, removed at exit)")
	cmd.Flags().Float64Var(&weight, "weight", 0, "this shard's share of the partitions, in GiB of memory budget (default: its --memory-budget in GiB); give it on every shard or none")
	cmd.Flags().StringVar(&zone, "zone", "", "failure domain (a rack, an availability zone): replicas of a partition go to distinct zones where there are enough")
	adm.register(cmd, "lookups", "ResourceExhausted: the router asks another replica", 8)
	cmd.Flags().StringVar(&httpAddr, "http-addr", "", "HTTP address (HTTPS with --tls-*) for /metrics, /healthz, /readyz and /admin/v1/fault (default: none)")
	cmd.Flags().StringVar(&probeAddr, "probe-addr", "", probeUsage)
	admin.register(cmd.Flags(), "")
	cmd.Flags().Var(&fault, "fault", faultUsage)
	tlsf.register(cmd.Flags(), "the shard (lookups are then mutual TLS: only routers and managers whose certificate --tls-ca signed are answered; --http-addr serves HTTPS)")
	drain.register(cmd)
	profile.register(cmd)
	cmd.MarkFlagRequired("id")
	cmd.MarkFlagRequired("repo")
	return cmd
}

// limitFlags are the request limits, deadline and admission bounds a
// router enforces.
type limitFlags struct {
	maxRows, maxIDs, maxBytes int
	maxValues                 int
	timeout                   time.Duration
	admit                     admitFlags
	receiving, perPeer        byteSize
	receiveTimeout            time.Duration
	connsPerPeer              int
	headerTimeout             time.Duration
}

func (l *limitFlags) register(cmd *cobra.Command) {
	cmd.Flags().IntVar(&l.maxRows, "max-batch-rows", 10_000, "largest batch (rows) a request may carry")
	cmd.Flags().IntVar(&l.maxIDs, "max-ids", 1<<20, "most feature ids (shared included) a request may carry")
	cmd.Flags().IntVar(&l.maxValues, "max-values", 1<<25, "most values a request may fetch from the shards: its distinct ids times the model's values per key (1 for LR, 1+fields·dim for FFM)")
	cmd.Flags().IntVar(&l.maxBytes, "max-request-bytes", 0, "largest HTTP request body (default: what --max-ids and --max-batch-rows need as JSON, 64 bytes an id); gRPC messages are bounded by what they need, if less")
	cmd.Flags().DurationVar(&l.timeout, "request-timeout", time.Second, "longest a request may take from its arrival; a caller's shorter deadline (gRPC's, or the timeout parameter) wins")
	l.admit.register(cmd, "requests", "gRPC ResourceExhausted, HTTP 429", 4)
	cmd.Flags().Var(&l.receiving, "max-receiving-bytes", "most bytes the requests still arriving may hold, all together; past it one is refused (default: half of --max-inflight-bytes, and at least two bodies of --max-request-bytes)")
	cmd.Flags().Var(&l.perPeer, "max-receiving-per-peer", "most bytes the requests arriving from one client address may hold (default: a quarter of --max-receiving-bytes, and at least one body of --max-request-bytes)")
	cmd.Flags().IntVar(&l.connsPerPeer, "max-conns-per-peer", 64, "most connections one client address may hold open on each front (gRPC, HTTP); past it a new one is held unread for --header-timeout, then closed")
	cmd.Flags().DurationVar(&l.headerTimeout, "header-timeout", 2*time.Second, "longest a connection may take to send its request headers (HTTP) or to establish itself (gRPC: TLS and the HTTP/2 preface)")
	cmd.Flags().DurationVar(&l.receiveTimeout, "receive-timeout", 200*time.Millisecond, "longest a request's bytes may take to arrive, plus 200ms per MB of an HTTP body's Content-Length; then HTTP 408 and the connection closed, or gRPC DeadlineExceeded, answered once --header-timeout has passed since the request arrived")
}

func (l *limitFlags) limits() router.Limits {
	return router.Limits{MaxRows: l.maxRows, MaxIDs: l.maxIDs, MaxValues: l.maxValues}
}

func (l *limitFlags) routerOptions(o router.Options) router.Options {
	o.Limits, o.DefaultTimeout = l.limits(), l.timeout
	return o
}

// serverOptions fills o's limits and admission from the flags.
func (l *limitFlags) serverOptions(o server.Options) server.Options {
	o.Limits, o.MaxRequestBytes, o.RequestTimeout = l.limits(), l.maxBytes, l.timeout
	o.MaxInflight, o.MaxInflightBytes, o.MaxQueueTime = l.admit.inflight, int64(l.admit.bytes), l.admit.queue
	o.MaxReceivingBytes, o.MaxReceivingPerPeer, o.ReceiveTimeout = int64(l.receiving), int64(l.perPeer), l.receiveTimeout
	o.MaxConnsPerPeer, o.HeaderTimeout = l.connsPerPeer, l.headerTimeout
	return o
}

// admitFlags bound the work a server admits at once (internal/admit).
type admitFlags struct {
	inflight int
	bytes    byteSize
	queue    time.Duration
}

func (a *admitFlags) register(cmd *cobra.Command, what, refusal string, perCPU int) {
	var inflightBytes int64
	admit.Defaults(&a.inflight, &inflightBytes, &a.queue, perCPU) // zero values: no error
	a.bytes = byteSize(inflightBytes)
	cmd.Flags().IntVar(&a.inflight, "max-inflight", a.inflight, fmt.Sprintf("most %s admitted at once, %d per CPU by default; past it one waits --max-queue-time, then is refused (%s)", what, perCPU, refusal))
	cmd.Flags().Var(&a.bytes, "max-inflight-bytes", fmt.Sprintf("most bytes of %s admitted at once", what))
	cmd.Flags().DurationVar(&a.queue, "max-queue-time", a.queue, fmt.Sprintf("longest one of the %s waits for admission before it is refused", what))
}

func routerCommand() *cobra.Command {
	var etcd, httpAddr, grpcAddr, id string
	var cluster clusterFlag
	var etcdTLS tlsconf.Files
	var lim limitFlags
	var drain drainFlag
	var hedging hedgeFlags
	var tlsf roleFlags
	var clientCA, probeAddr string
	var profile profileFlag
	cmd := &cobra.Command{
		Use:   "router",
		Short: "Run a router: KServe v2 gRPC and HTTP, fanning out to shards found in etcd",
		Long: `router serves KServe v2 over gRPC and HTTP. Readiness (/v2/health/ready,
gRPC health) says whether every assigned model can be served. On SIGTERM
or SIGINT it drains: not ready at once, GOAWAY to gRPC clients, no new
HTTP connections, the requests under way finish, and it exits 0 (1 if
--drain-timeout cut it short).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			stop, err := profile.start()
			if err != nil {
				return err
			}
			defer stop()
			opts := lim.routerOptions(router.Options{Cluster: cluster.c, Registry: prometheus.DefaultRegisterer, ID: id, Build: buildinfo.String(), Advertise: grpcAddr})
			if err := hedging.apply(&opts); err != nil {
				return err
			}
			if opts.ShardTLS, err = tlsf.load(cmd.Context(), cluster.c); err != nil {
				return err
			}
			var front *tlsconf.Source
			switch {
			case opts.ShardTLS != nil:
				f := tlsf.files
				f.CA = clientCA
				if front, err = tlsconf.Load(cmd.Context(), f); err != nil {
					return err
				}
			case clientCA != "":
				return errors.New("--client-ca needs --tls-cert, --tls-key and --tls-ca")
			}
			cli, err := etcdClient(cmd.Context(), etcd, etcdTLS)
			if err != nil {
				return err
			}
			defer cli.Close()
			opts.Etcd = cli
			// The router keeps its routing table and shard connections
			// until the requests under way are done.
			r, err := router.Start(context.WithoutCancel(cmd.Context()), opts)
			if err != nil {
				return err
			}
			defer r.Close()
			srv, err := server.Start(lim.serverOptions(server.Options{Predictor: r, GRPCAddr: grpcAddr, HTTPAddr: httpAddr, TLS: front}))
			if err != nil {
				return err
			}
			defer srv.Close()
			scheme := "http"
			if front != nil {
				scheme = "https"
			}
			fmt.Printf("http: %s://%s\ngrpc: %s\n", scheme, srv.HTTPAddr(), srv.GRPCAddr())
			stopProbes, probes, err := serveProbes(probeAddr, srv.Ready, "router probes")
			if err != nil {
				return err
			}
			defer stopProbes()
			// Where the managers read its metrics (the console's traffic):
			// the probes' plain HTTP if served, else the front's /metrics.
			if probes != "" {
				r.SetMetrics("http://" + probes + "/metrics")
			} else {
				r.SetMetrics(scheme + "://" + srv.HTTPAddr() + "/metrics")
			}
			ctx, cancel := drain.await(cmd.Context())
			defer cancel()
			return srv.Drain(ctx)
		},
	}
	cmd.Flags().StringVar(&etcd, "etcd", "http://127.0.0.1:2379", "etcd endpoints, comma-separated")
	registerEtcdTLS(cmd.Flags(), &etcdTLS)
	cmd.Flags().StringVar(&httpAddr, "http-addr", "127.0.0.1:8000", "HTTP/JSON, health and /metrics address")
	cluster.register(cmd)
	cmd.Flags().StringVar(&grpcAddr, "grpc-addr", "127.0.0.1:8001", "gRPC address")
	cmd.Flags().StringVar(&id, "id", "", "this router's name in the cluster (its registration routers/ID); default: host name and pid (a pod's name on Kubernetes)")
	lim.register(cmd)
	hedging.register(cmd)
	tlsf.register(cmd.Flags(), "the router, to shards (mutual TLS) and on its front (gRPC and HTTP)")
	cmd.Flags().StringVar(&probeAddr, "probe-addr", "", probeUsage)
	cmd.Flags().StringVar(&clientCA, "client-ca", "", "PEM CA certificate(s): the front then answers only clients whose certificate it signed (default: any client, over TLS with --tls-cert)")
	drain.register(cmd)
	profile.register(cmd)
	return cmd
}

func managerCommand() *cobra.Command {
	var etcd, repo string
	var replicas int
	var policy policyFlags
	var cluster clusterFlag
	var etcdTLS tlsconf.Files
	var admin adminFlags
	var tlsf roleFlags
	var probeAddr string
	var raft raftFlags
	var push pushServeFlags
	var profile profileFlag
	cmd := &cobra.Command{
		Use:   "manager",
		Short: "Run the manager: validates model versions, decides what is served, serves the admin API",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			stop, err := profile.start()
			if err != nil {
				return err
			}
			defer stop()
			token, err := admin.resolve()
			if err != nil {
				return err
			}
			if token == "" {
				return errors.New("the manager's admin API needs a token: give --admin-token, --admin-token-file or $" + adminTokenEnv)
			}
			popts, pushing, err := push.options(token, prometheus.DefaultRegisterer)
			if err != nil {
				return err
			}
			cli, err := etcdClient(cmd.Context(), etcd, etcdTLS)
			if err != nil {
				return err
			}
			defer cli.Close()
			tlsSrc, err := tlsf.load(cmd.Context(), cluster.c)
			if err != nil {
				return err
			}
			mo := manager.Options{Repo: loader.Repo{Dir: repo}, Etcd: cli, Cluster: cluster.c, Replicas: replicas, Registry: prometheus.DefaultRegisterer,
				ShardTLS: tlsSrc}
			if err := policy.apply(&mo); err != nil {
				return err
			}
			push.policy(&mo)
			if mo.Raft, err = raft.options(cmd, tlsSrc); err != nil {
				return err
			}
			m, err := manager.Start(cmd.Context(), mo)
			if err != nil {
				return err
			}
			defer m.Close()
			a, err := m.ServeAdmin(manager.AdminOptions{Addr: admin.addr, Token: token, Gatherer: prometheus.DefaultGatherer, TLS: tlsSrc})
			if err != nil {
				return err
			}
			defer a.Close()
			scheme := "http"
			if tlsSrc != nil {
				scheme = "https"
			}
			fmt.Printf("admin: %s://%s\n", scheme, a.Addr())
			fmt.Printf("console: %s://%s/console/\n", scheme, a.Addr())
			if pushing {
				popts.TLS = tlsSrc
				ps, err := m.ServePush(popts)
				if err != nil {
					return err
				}
				defer ps.Close()
				fmt.Printf("push: %s://%s\n", scheme, ps.Addr())
			}
			if g := m.Group(); g != nil {
				fmt.Printf("raft: %s at %s\n", g.ID(), g.Addr())
			}
			stopProbes, _, err := serveProbes(probeAddr, m.Ready, "manager probes")
			if err != nil {
				return err
			}
			defer stopProbes()
			<-cmd.Context().Done()
			return nil
		},
	}
	cmd.Flags().StringVar(&etcd, "etcd", "http://127.0.0.1:2379", "etcd endpoints, comma-separated")
	registerEtcdTLS(cmd.Flags(), &etcdTLS)
	cmd.Flags().StringVar(&repo, "repo", "", "model repository directory (required)")
	cmd.Flags().IntVar(&replicas, "replicas", 1, "replicas per partition")
	policy.register(cmd, 10*time.Second)
	cluster.register(cmd)
	admin.register(cmd.Flags(), "admin-addr")
	cmd.Flags().StringVar(&probeAddr, "probe-addr", "", probeUsage)
	tlsf.register(cmd.Flags(), "the manager, on its admin API (which then answers only operators whose certificate --tls-ca signed), to shards (its gate router) and between raft members (managers only)")
	raft.register(cmd)
	push.register(cmd, "")
	profile.register(cmd)
	cmd.MarkFlagRequired("repo")
	return cmd
}

// policyFlags are the manager's policy, for manager and dev.
type policyFlags struct {
	keepVersions, keepDeltas int
	autoPrune, compactAfter  int
	scan, routerWait         time.Duration
	validator                string
	validatorTimeout         time.Duration
	goldenTolerance          float64
	holdout                  []string // NAME=FILE
	holdoutMargin            float64
	gateTimeout, gateRetry   time.Duration
	maxMoves                 int
}

// apply sets the manager's policy options from the flags.
func (f *policyFlags) apply(o *manager.Options) error {
	o.KeepVersions, o.KeepDeltas = keepVersions(f.keepVersions), keepVersions(f.keepDeltas)
	o.ScanInterval, o.AutoPrune, o.CompactAfter, o.RouterWait = f.scan, f.autoPrune, keepVersions(f.compactAfter), f.routerWait
	o.Validator, o.ValidatorTimeout = f.validator, f.validatorTimeout
	o.MaxMoves = f.maxMoves
	if f.maxMoves == 0 {
		o.MaxMoves = -1 // Options: no bound
	}
	o.GoldenTolerance, o.HoldoutMargin, o.GateTimeout, o.GateRetry = f.goldenTolerance, f.holdoutMargin, f.gateTimeout, f.gateRetry
	if f.holdoutMargin == 0 {
		o.HoldoutMargin = -1 // Options: none
	}
	if f.gateTimeout <= 0 {
		return fmt.Errorf("--gate-timeout %v: must be positive", f.gateTimeout)
	}
	if !(f.goldenTolerance > 0) {
		return fmt.Errorf("--golden-tolerance %v: must be positive", f.goldenTolerance)
	}
	if !(f.holdoutMargin >= 0) {
		return fmt.Errorf("--holdout-margin %v: must not be negative", f.holdoutMargin)
	}
	if f.validator != "" {
		if st, err := os.Stat(f.validator); err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
			return fmt.Errorf("--validator %s: not an executable file (%v)", f.validator, err)
		}
	}
	for _, h := range f.holdout {
		name, file, ok := strings.Cut(h, "=")
		if !ok || !codec.ValidName(name) || file == "" {
			return fmt.Errorf("--holdout %q: want MODEL=FILE", h)
		}
		if st, err := os.Stat(file); err != nil || !st.Mode().IsRegular() {
			return fmt.Errorf("--holdout %s: %s is not a readable regular file (%v)", name, file, err)
		}
		if o.Holdout == nil {
			o.Holdout = map[string]string{}
		}
		if o.Holdout[name] != "" {
			return fmt.Errorf("--holdout: model %s given twice", name)
		}
		o.Holdout[name] = file
	}
	return nil
}

func (f *policyFlags) register(cmd *cobra.Command, scan time.Duration) {
	cmd.Flags().IntVar(&f.keepVersions, "keep-versions", 2, "full versions besides the live one kept loaded for rollback, with their deltas")
	cmd.Flags().IntVar(&f.keepDeltas, "keep-deltas", 20, "deltas on each kept full version kept loaded for rollback (the newest); older ones retire")
	cmd.Flags().IntVar(&f.autoPrune, "auto-prune", 0, "after each commit, remove the directories of versions nothing needs, keeping this many of them (the newest); 0: never (needs write access to the repository)")
	cmd.Flags().IntVar(&f.compactAfter, "compact-after", 500, fmt.Sprintf("compact the live version's chain into a new full version once it has this many deltas, below %d (the longest chain); 0: never (needs write access to the repository)", loader.MaxChain))
	cmd.Flags().DurationVar(&f.routerWait, "router-wait", 30*time.Second, "how long, once the shards hold a staged version, a router that cannot score it (its dense part not fetched) holds the commit back; past it the version goes live and that router answers 503 for the model until it can (negative: wait for ever)")
	cmd.Flags().StringVar(&f.validator, "validator", "", "a program run (without a shell) on each staged version's directory before it is committed: exit 0 accepts it, otherwise the version is rejected with its last stderr line as the reason (the validator gate)")
	cmd.Flags().DurationVar(&f.validatorTimeout, "validator-timeout", 60*time.Second, "longest a --validator run may take; past it the version is rejected")
	cmd.Flags().Float64Var(&f.goldenTolerance, "golden-tolerance", 1e-4, "the golden gate: how far a served score may be from a golden request's want (absolute, per score)")
	cmd.Flags().StringArrayVar(&f.holdout, "holdout", nil, "MODEL=FILE: the hold-out gate's set for MODEL, requests with \"labels\" (one KServe v2 JSON body per line); a staged version's mean log-loss on it may exceed the live version's by at most --holdout-margin (repeatable)")
	cmd.Flags().Float64Var(&f.holdoutMargin, "holdout-margin", 0.01, "the hold-out gate: how much a staged version's mean log-loss may exceed the live version's (absolute)")
	cmd.Flags().DurationVar(&f.gateTimeout, "gate-timeout", 60*time.Second, "longest a golden or hold-out gate run may take")
	cmd.Flags().DurationVar(&f.gateRetry, "gate-retry", 5*time.Second, "how long a gate that could not run (its hold-out set unreadable, the cluster not answering in time) waits before it runs again; the version waits meanwhile")
	cmd.Flags().IntVar(&f.maxMoves, "max-moves", 4, "partitions of a model moving onto one shard at once when the manager rebalances (shards join, leave or are cordoned); 0: no bound")
	cmd.Flags().DurationVar(&f.scan, "scan-interval", scan, "how often the whole repository is listed, besides watching it for changes (on a network filesystem, which reports no changes made on other hosts, this is how soon a version is found)")
}

// keepVersions maps the --keep-versions and --keep-deltas flags to
// manager.Options, where 0 means the default.
func keepVersions(n int) int {
	if n <= 0 {
		return -1
	}
	return n
}

// clusterFlag is --cluster: the name every etcd key sits under.
type clusterFlag struct{ c topo.Cluster }

func (f *clusterFlag) register(cmd *cobra.Command) {
	cmd.Flags().Var(f, "cluster", "cluster name: every etcd key sits under /cumulus/NAME/ (letters, digits, -)")
}

func (f *clusterFlag) String() string {
	if f.c == "" {
		return string(topo.DefaultCluster)
	}
	return string(f.c)
}

func (f *clusterFlag) Set(s string) error {
	if err := topo.Cluster(s).Validate(); err != nil {
		return err
	}
	f.c = topo.Cluster(s)
	return nil
}

func (f *clusterFlag) Type() string { return "name" }
