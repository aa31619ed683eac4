package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"runtime/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/cumulus-serving/cumulus/internal/buildinfo"
	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/manager"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/server"
	"github.com/cumulus-serving/cumulus/shard"
)

func devCommand() *cobra.Command {
	var (
		repo, httpAddr, grpcAddr string
		dataDir                  string
		shards, replicas         int
		policy                   policyFlags
		readyTimeout             time.Duration
		lim                      limitFlags
		budget                   byteSize
		loadRate                 = byteSize(defaultLoadRate)
		diskReads                diskReadsFlag
		cluster                  clusterFlag
		admin                    adminFlags
		push                     pushServeFlags
		drain                    drainFlag
		hedging                  hedgeFlags
		fault                    faultFlag
		profile                  profileFlag
		useTLS                   bool
	)
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run a whole cluster on this machine: embedded etcd, shards, manager and router",
		Long: `dev starts an embedded etcd, a manager, --shards shard servers and a router on
localhost, serves every model in --repo (or a generated demo model when no
--repo is given), prints the addresses and serves until interrupted.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			stop, err := profile.start()
			if err != nil {
				return err
			}
			defer stop()
			if repo == "" {
				dir, err := os.MkdirTemp("", "cumulus-demo-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				fmt.Println("no --repo given: generating the demo model (LR, 1,000,000 features, ids 0..999999)")
				if _, err := (loader.Repo{Dir: dir}).Generate(loader.GenSpec{Name: "demo", Shape: model.Shape{Type: model.LR}, Params: 1_000_000, Partitions: 8, Seed: 1, Dense: true}); err != nil {
					return err
				}
				repo = dir
			}
			token, err := admin.resolve()
			if err != nil {
				return err
			}
			if token == "" {
				token = rand.Text()
			}
			if t, _ := push.tok.resolve(); t == "" && push.addr != "" {
				push.tok.token = rand.Text()
			}
			if !cmd.Flags().Changed("memory-budget") {
				budget = byteSize(defaultBudget(shards))
			}
			ropts := lim.routerOptions(router.Options{Advertise: grpcAddr, Build: buildinfo.String()})
			if err := hedging.apply(&ropts); err != nil {
				return err
			}
			if err := policy.apply(&manager.Options{}); err != nil {
				return err
			}
			var pki devPKI
			var etcdTLS *tlsconf.Files
			if useTLS {
				if pki, err = devTLS(ctx, cluster.c); err != nil {
					return err
				}
				etcdTLS = &pki.etcd
				defer os.RemoveAll(pki.dir)
				ropts.ShardTLS = pki.router
			}
			reg := prometheus.NewRegistry()
			// The process's own figures, as the separate processes serve them
			// (prometheus' default registry has both).
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			popts, pushing, err := push.options(token, reg)
			if err != nil {
				return err
			}
			// The cluster outlives the signal until the front has drained.
			c, err := devcluster.Start(context.WithoutCancel(ctx), devcluster.Options{Repo: repo, DataDir: dataDir, Shards: shards, Replicas: replicas, Registry: reg,
				MemoryBudget: int64(budget), Cluster: cluster.c, ScanInterval: policy.scan, Build: buildinfo.String(), EtcdTLS: etcdTLS,
				Manager: func(o *manager.Options) {
					_ = policy.apply(o) // checked above
					push.policy(o)
					o.ShardTLS = pki.manager
				},
				Router: ropts, Shard: func(i int, o *shard.Options) {
					o.LoadRate, o.TLS, o.DiskReads = int64(loadRate), pki.shard, string(diskReads)
					if i == 0 {
						o.Faults = fault.f
					}
				}})
			if err != nil {
				return err
			}
			defer c.Close()
			srv, err := server.Start(lim.serverOptions(server.Options{Predictor: c.Router, GRPCAddr: grpcAddr, HTTPAddr: httpAddr, Registry: reg, Gatherer: reg,
				TLS: pki.front}))
			if err != nil {
				return err
			}
			defer srv.Close()
			adm, err := c.Manager.ServeAdmin(manager.AdminOptions{Addr: admin.addr, Token: token, Gatherer: reg, TLS: pki.manager})
			if err != nil {
				return err
			}
			defer adm.Close()
			var ps *manager.PushServer
			if pushing {
				popts.TLS = pki.manager
				if ps, err = c.Manager.ServePush(popts); err != nil {
					return err
				}
				defer ps.Close()
			}
			fmt.Printf("etcd: %s\n", c.EtcdAddr)
			if fault.f != nil {
				fmt.Printf("shard-0 injects faults into its lookups: %s\n", fault.f)
			}
			for _, s := range c.Shards {
				fmt.Printf("shard: %s %s\n", s.ID(), s.Addr())
			}
			scheme := "http"
			if useTLS {
				scheme = "https"
				op := pki.operator
				fmt.Printf("tls: --tls-ca %s --tls-cert %s --tls-key %s\n", op.CA, op.Cert, op.Key)
			}
			c.Router.SetMetrics(scheme + "://" + srv.HTTPAddr() + "/metrics")
			fmt.Printf("http: %s://%s\n", scheme, srv.HTTPAddr())
			fmt.Printf("console: %s://%s/console/ (the admin token below)\n", scheme, adm.Addr())
			fmt.Printf("grpc: %s\n", srv.GRPCAddr())
			fmt.Printf("admin: %s://%s token %s\n", scheme, adm.Addr(), token)
			if ps != nil {
				fmt.Printf("push: %s://%s token %s\n", scheme, ps.Addr(), popts.Token)
			}
			if budget > 0 {
				fmt.Printf("memory budget: %s per shard\n", &budget)
			}
			if names, _ := (loader.Repo{Dir: repo}).Models(); len(names) == 0 {
				// Nothing to wait for: serve what gets published.
				fmt.Printf("no models in %s yet: publish one (cumulus model gen|import --repo %s); it is served as soon as it is valid\n", repo, repo)
			} else {
				wctx, cancel := context.WithTimeout(ctx, readyTimeout)
				err = c.WaitReady(wctx)
				cancel()
				if err != nil {
					return err
				}
			}
			for _, m := range c.Router.Models() {
				fmt.Printf("model: %s version %d (%s)\n", m.Name, m.Live, m.Type)
			}
			fmt.Println("ready")
			dctx, cancel := drain.await(ctx)
			defer cancel()
			fmt.Println("shutting down")
			return srv.Drain(dctx)
		},
	}
	cmd.Flags().StringVar(&repo, "repo", "", "model repository directory (default: a generated demo model)")
	cmd.Flags().BoolVar(&useTLS, "tls", false, "make a throwaway CA and use it: shards, router and manager talk mutual TLS with a certificate per role (spiffe://CLUSTER/ROLE: shards answer routers and managers, the admin API operators), the embedded etcd asks for a client certificate, the front serves TLS without asking one; prints an operator's --tls-* flags (their directory holds every role's certificate, ROLE.pem, and etcd.pem for etcd's --etcd-cert, --etcd-key, --etcd-ca)")
	cmd.Flags().IntVar(&shards, "shards", 4, "number of shard servers")
	cmd.Flags().IntVar(&replicas, "replicas", 1, "replicas per partition")
	cmd.Flags().StringVar(&httpAddr, "http-addr", "127.0.0.1:8000", "HTTP/JSON (KServe v2), health and /metrics address")
	cmd.Flags().StringVar(&grpcAddr, "grpc-addr", "127.0.0.1:8001", "gRPC (KServe v2) address")
	lim.register(cmd)
	hedging.register(cmd)
	cmd.Flags().Var(&fault, "fault", "shard-0 only: "+faultUsage)
	cmd.Flags().Var(&loadRate, "load-rate", "per shard (the shards load one partition at a time between them): "+loadRateUsage)
	cmd.Flags().Var(&diskReads, "disk-reads", diskReadsUsage)
	cmd.Flags().Var(&budget, "memory-budget", "per shard: resident table bytes and value caches (e.g. 1.5GB); a shard assigned more serves it from disk, the most asked values cached (default: half the machine's memory or cgroup limit, shared by the shards; 0: no bound)")
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "directory for etcd's data (DIR/etcd) and each shard's copies of partitions it serves mapped (DIR/shard-N); kept on exit (default: a temporary directory, removed on exit)")
	policy.register(cmd, 2*time.Second)
	cluster.register(cmd)
	admin.register(cmd.Flags(), "admin-addr")
	push.register(cmd, "127.0.0.1:8003")
	cmd.Flags().DurationVar(&readyTimeout, "ready-timeout", 5*time.Minute, "give up if models are not servable by then")
	drain.register(cmd)
	profile.register(cmd)
	return cmd
}

// profileFlag is the hidden --cpu-profile of every process: a file to
// write a CPU profile of the whole process to, from start to exit.
type profileFlag string

func (p *profileFlag) register(cmd *cobra.Command) {
	cmd.Flags().StringVar((*string)(p), "cpu-profile", "", "write a CPU profile of the whole process to this file, from start to exit (go tool pprof)")
	cmd.Flags().MarkHidden("cpu-profile")
}

// start profiles the process until stop is called (nothing without
// the flag).
func (p profileFlag) start() (stop func(), err error) {
	if p == "" {
		return func() {}, nil
	}
	f, err := os.Create(string(p))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// devPKI is what cumulus dev --tls issues and loads, in dir: a
// certificate for each role (tlsconf.Roles) named ROLE.pem, for loopback
// and spiffe://CLUSTER/ROLE/dev, and one for etcd (server and clients).
type devPKI struct {
	dir string
	// Loaded: each part's, with its roles checked in cluster; front is
	// the router's for its front (no client certificate asked).
	shard, router, manager, front *tlsconf.Source
	etcd, operator                tlsconf.Files
}

func devTLS(ctx context.Context, cluster topo.Cluster) (devPKI, error) {
	p, err := issueDevPKI(ctx, cluster)
	if err != nil {
		os.RemoveAll(p.dir)
		return devPKI{}, fmt.Errorf("dev --tls: %w", err)
	}
	return p, nil
}

func issueDevPKI(ctx context.Context, cluster topo.Cluster) (p devPKI, err error) {
	if p.dir, err = os.MkdirTemp("", "cumulus-dev-tls-"); err != nil {
		return p, err
	}
	ca, err := tlsconf.NewCA("cumulus dev CA")
	if err != nil {
		return p, err
	}
	hosts := []string{"127.0.0.1", "::1", "localhost"}
	if p.etcd, err = ca.WriteIssued(p.dir, "etcd", hosts...); err != nil {
		return p, err
	}
	files := map[tlsconf.Role]tlsconf.Files{}
	for _, r := range tlsconf.Roles {
		id := tlsconf.Identity{Cluster: string(cluster.OrDefault()), Role: r, ID: "dev"}
		if files[r], err = ca.WriteIssued(p.dir, string(r), append(hosts, id.String())...); err != nil {
			return p, err
		}
	}
	p.operator = files[tlsconf.RoleOperator]
	for _, l := range []struct {
		to    **tlsconf.Source
		files tlsconf.Files
	}{{&p.shard, files[tlsconf.RoleShard]}, {&p.router, files[tlsconf.RoleRouter]}, {&p.manager, files[tlsconf.RoleManager]},
		{&p.front, tlsconf.Files{Cert: files[tlsconf.RoleRouter].Cert, Key: files[tlsconf.RoleRouter].Key}}} {
		if *l.to, err = tlsconf.Load(ctx, l.files); err != nil {
			return p, err
		}
		(*l.to).SetRoles(string(cluster.OrDefault()), tlsconf.RolesEnforce)
	}
	return p, nil
}
