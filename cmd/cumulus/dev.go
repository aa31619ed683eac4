package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/cumulus-serving/cumulus/internal/buildinfo"
	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
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
		cluster                  clusterFlag
		admin                    adminFlags
		drain                    drainFlag
		hedging                  hedgeFlags
		fault                    faultFlag
		cpuProfile               string
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
			if cpuProfile != "" {
				stop, err := startCPUProfile(cpuProfile)
				if err != nil {
					return err
				}
				defer stop()
			}
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
			var internal, front *tlsconf.Source
			var clientFiles, devFiles tlsconf.Files
			var etcdTLS *tlsconf.Files
			if useTLS {
				if internal, front, devFiles, clientFiles, err = devTLS(ctx); err != nil {
					return err
				}
				etcdTLS = &devFiles
				defer os.RemoveAll(filepath.Dir(clientFiles.CA))
				ropts.ShardTLS = internal
			}
			reg := prometheus.NewRegistry()
			// The process's own figures, as the separate processes serve them
			// (prometheus' default registry has both).
			reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
			// The cluster outlives the signal until the front has drained.
			c, err := devcluster.Start(context.WithoutCancel(ctx), devcluster.Options{Repo: repo, DataDir: dataDir, Shards: shards, Replicas: replicas, Registry: reg,
				MemoryBudget: int64(budget), Cluster: cluster.c, ScanInterval: policy.scan, Build: buildinfo.String(), EtcdTLS: etcdTLS,
				Manager: func(o *manager.Options) {
					_ = policy.apply(o) // checked above
					o.ShardTLS = internal
				},
				Router: ropts, Shard: func(i int, o *shard.Options) {
					o.LoadRate, o.TLS = int64(loadRate), internal
					if i == 0 {
						o.Faults = fault.f
					}
				}})
			if err != nil {
				return err
			}
			defer c.Close()
			srv, err := server.Start(lim.serverOptions(server.Options{Predictor: c.Router, GRPCAddr: grpcAddr, HTTPAddr: httpAddr, Registry: reg, Gatherer: reg,
				TLS: front}))
			if err != nil {
				return err
			}
			defer srv.Close()
			adm, err := c.Manager.ServeAdmin(manager.AdminOptions{Addr: admin.addr, Token: token, Gatherer: reg, TLS: internal})
			if err != nil {
				return err
			}
			defer adm.Close()
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
				fmt.Printf("tls: --tls-ca %s --tls-cert %s --tls-key %s\n", clientFiles.CA, clientFiles.Cert, clientFiles.Key)
			}
			fmt.Printf("http: %s://%s\n", scheme, srv.HTTPAddr())
			fmt.Printf("grpc: %s\n", srv.GRPCAddr())
			fmt.Printf("admin: %s://%s token %s\n", scheme, adm.Addr(), token)
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
	cmd.Flags().BoolVar(&useTLS, "tls", false, "make a throwaway CA and use it: shards, router and manager talk mutual TLS, the admin API and the embedded etcd ask for a client certificate, the front serves TLS without asking one; prints the client's --tls-* flags (for etcd: --etcd-cert, --etcd-key, --etcd-ca with the same files)")
	cmd.Flags().IntVar(&shards, "shards", 4, "number of shard servers")
	cmd.Flags().IntVar(&replicas, "replicas", 1, "replicas per partition")
	cmd.Flags().StringVar(&httpAddr, "http-addr", "127.0.0.1:8000", "HTTP/JSON (KServe v2), health and /metrics address")
	cmd.Flags().StringVar(&grpcAddr, "grpc-addr", "127.0.0.1:8001", "gRPC (KServe v2) address")
	lim.register(cmd)
	hedging.register(cmd)
	cmd.Flags().Var(&fault, "fault", "shard-0 only: "+faultUsage)
	cmd.Flags().Var(&loadRate, "load-rate", "per shard (the shards load one partition at a time between them): "+loadRateUsage)
	cmd.Flags().Var(&budget, "memory-budget", "per shard: resident table bytes (e.g. 1.5GB); partitions beyond it are served from mapped files (default: half the machine's memory or cgroup limit, shared by the shards; 0: no bound)")
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "directory for etcd's data (DIR/etcd) and each shard's copies of partitions it serves mapped (DIR/shard-N); kept on exit (default: a temporary directory, removed on exit)")
	policy.register(cmd, 2*time.Second)
	cluster.register(cmd)
	admin.register(cmd.Flags(), "admin-addr")
	cmd.Flags().DurationVar(&readyTimeout, "ready-timeout", 5*time.Minute, "give up if models are not servable by then")
	drain.register(cmd)
	cmd.Flags().StringVar(&cpuProfile, "cpu-profile", "", "write a CPU profile of the whole process to this file, from start to exit (go tool pprof)")
	cmd.Flags().MarkHidden("cpu-profile")
	return cmd
}

// startCPUProfile profiles the process into file until stop is called.
func startCPUProfile(file string) (stop func(), err error) {
	f, err := os.Create(file)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// devTLS makes a throwaway CA in a new temporary directory, a
// certificate (files) for every part of dev (all on loopback: etcd too)
// and one for its clients, and loads them: internal for mutual TLS
// between the parts and on the admin API, front for the front (no
// client certificate asked).
func devTLS(ctx context.Context) (internal, front *tlsconf.Source, files, client tlsconf.Files, err error) {
	dir, err := os.MkdirTemp("", "cumulus-dev-tls-")
	if err != nil {
		return nil, nil, files, client, err
	}
	ca, err := tlsconf.NewCA("cumulus dev CA")
	if err == nil {
		client, err = ca.WriteIssued(dir, "client", "localhost")
	}
	if err == nil {
		files, err = ca.WriteIssued(dir, "dev", "127.0.0.1", "::1", "localhost")
	}
	if err == nil {
		internal, err = tlsconf.Load(ctx, files)
	}
	if err == nil {
		front, err = tlsconf.Load(ctx, tlsconf.Files{Cert: files.Cert, Key: files.Key})
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, files, client, fmt.Errorf("dev --tls: %w", err)
	}
	return internal, front, files, client, nil
}
