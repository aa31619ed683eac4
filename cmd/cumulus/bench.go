package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/server"
	"github.com/cumulus-serving/cumulus/shard"
)

func benchCommand() *cobra.Command {
	var (
		workloads, addr, modelName, repo string
		shape                            shapeFlags
		protocols, httpAddr              string
		params                           int64
		shards, conns, replicas          int
		l                                benchLoad
		hedging                          hedgeFlags
		fault                            faultFlag
		tlsf                             tlsFlags
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Drive predict load and print QPS, p50/p99/p999 and request bytes",
		Long: `bench runs the rank200 and small workloads against a router.

With --addr, it targets a running router; --repo tells it the model's
generator settings (the model must come from 'cumulus model gen').
Without --addr, it generates a model of --params features, starts a dev
cluster of --shards shards on loopback and targets that.

--protocol sends the calls over KServe gRPC (grpc, the default), REST
with JSON tensors (rest) or REST with the binary tensor extension
(rest-binary); a comma-separated list runs each workload over each in
turn, on the same requests. REST goes to --http-addr with --addr, else
to the dev cluster's HTTP address.

By default the load is closed loop: --concurrency callers, one request in
flight each. With --rate, it is open loop: requests are sent at that rate,
evenly spaced, whether or not earlier ones were answered, each with a
deadline of --timeout from when it was due; latency counts from then too.
It prints goodput, refusals (ResourceExhausted) with their own latency,
errors by gRPC code, and requests the client could not send in time.

With --pid, or in open loop without --addr (then the dev cluster is this
process), it reads the process's VmRSS from /proc before the load, every
100ms during it, and --settle after it; in closed loop it also prints the
process's CPU time (utime+stime) per request.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if l.rate < 0 || l.timeout < 0 || l.settle < 0 {
				return fmt.Errorf("--rate, --timeout and --settle must not be negative")
			}
			if l.rate > 0 && (cmd.Flags().Changed("concurrency") || cmd.Flags().Changed("requests")) {
				return fmt.Errorf("--concurrency and --requests are for the closed loop; in open loop, --rate and --duration set the load")
			}
			protos, err := benchProtocols(protocols, addr, httpAddr)
			if err != nil {
				return err
			}
			if l.pid == 0 && addr == "" && l.rate > 0 {
				l.pid = os.Getpid()
			}
			if addr != "" && (repo == "" || modelName == "") {
				return fmt.Errorf("with --addr, give --repo and --model: bench draws its requests' ids from the model's generator settings, read from its manifest in the repository (the model must come from 'cumulus model gen')")
			}
			if addr != "" && (cmd.Flags().Changed("replicas") || cmd.Flags().Changed("fault") || hedgeFlagsChanged(cmd)) {
				return fmt.Errorf("--replicas, --fault and the hedging flags set up bench's own dev cluster: not with --addr")
			}
			if addr == "" {
				var ropts router.Options
				if err := hedging.apply(&ropts); err != nil {
					return err
				}
				lb, err := startLocalBench(ctx, shape, params, devcluster.Options{Shards: shards, Replicas: replicas, Router: ropts,
					Shard: func(i int, o *shard.Options) {
						if i == 0 {
							o.Faults = fault.f
						}
					}})
				if err != nil {
					return err
				}
				defer lb.close()
				repo, modelName = lb.repo, lb.model
				addr, httpAddr = lb.srv.GRPCAddr(), lb.srv.HTTPAddr()
				fmt.Printf("dev cluster: %d shards, router at %s (gRPC), %s (HTTP)\n", shards, addr, httpAddr)
			}
			m, err := generatedModel(repo, modelName)
			if err != nil {
				return err
			}
			creds, err := tlsf.grpcCreds(cmd.Context(), addr)
			if err != nil {
				return err
			}
			if tlsf.files.Set() && slices.ContainsFunc(protos, func(p string) bool { return p != "grpc" }) {
				return errors.New("bench: --tls-* are for --protocol grpc only")
			}
			clients, closeClients, err := benchClients(protos, addr, httpAddr, conns, creds)
			if err != nil {
				return err
			}
			defer closeClients()
			names := strings.Split(workloads, ",")
			if workloads == "all" {
				names = []string{"rank200", "small"}
			}
			if l.rate > 0 {
				fmt.Printf("model %s v%d: %s, %d features, %d partitions; open loop at %g/s, evenly spaced, %s per workload and protocol (%s)\n",
					m.Name, m.Version, m.Shape, m.Params, m.Partitions, l.rate, l.duration, strings.Join(protos, ", "))
			} else {
				fmt.Printf("model %s v%d: %s, %d features, %d partitions; concurrency %d, %s per workload and protocol (%s)\n",
					m.Name, m.Version, m.Shape, m.Params, m.Partitions, l.concurrency, l.duration, strings.Join(protos, ", "))
			}
			if l.pid == os.Getpid() {
				fmt.Printf("rss of pid %d: this process, the dev cluster and the load generator together\n", l.pid)
			}
			for _, name := range names {
				w, ok := bench.Workloads[name]
				if !ok {
					return fmt.Errorf("unknown workload %q (have rank200, small)", name)
				}
				for _, p := range protos {
					// The same seed for every protocol: the same requests.
					g, err := bench.ForModel(w, m, 42)
					if err != nil {
						return err
					}
					label := name
					if len(protos) > 1 {
						label = name + "/" + p
					}
					if err := l.run(ctx, clients[p], modelName, label, g); err != nil {
						return err
					}
				}
			}
			return nil
		},
	}
	cmd.AddCommand(benchTableCommand(), benchOverBudgetCommand(), benchOverBudgetChild(), benchRollbackCommand(), benchHostileCommand(), benchFreshnessCommand(), benchTailCommand(), benchRequestCommand(), benchPushCommand())
	cmd.Flags().StringVar(&workloads, "workload", "all", "rank200, small, or all (comma-separated)")
	cmd.Flags().StringVar(&addr, "addr", "", "router gRPC address (default: start a dev cluster)")
	cmd.Flags().StringVar(&httpAddr, "http-addr", "", "router HTTP address, with --addr, for --protocol rest and rest-binary")
	tlsf.registerClient(cmd.Flags(), "this client (with --addr, to a router serving TLS; gRPC only)")
	cmd.Flags().StringVar(&protocols, "protocol", "grpc", "grpc, rest (JSON), rest-binary (binary tensor extension), or several comma-separated")
	cmd.Flags().StringVar(&modelName, "model", "", "model name, with --addr")
	cmd.Flags().StringVar(&repo, "repo", "", "repository holding --model, with --addr")
	shape.register(cmd, "without --addr: ")
	cmd.Flags().Int64Var(&params, "params", 1_000_000, "without --addr: features in the generated model")
	cmd.Flags().IntVar(&shards, "shards", 4, "without --addr: shard servers")
	cmd.Flags().IntVar(&replicas, "replicas", 1, "without --addr: replicas per partition")
	cmd.Flags().Var(&fault, "fault", "without --addr, shard-0 only: "+faultUsage)
	hedging.register(cmd)
	cmd.Flags().IntVar(&l.concurrency, "concurrency", 4, "closed loop: requests in flight")
	cmd.Flags().IntVar(&conns, "connections", 1, "gRPC connections the calls are spread over, in turn")
	cmd.Flags().DurationVar(&l.duration, "duration", 10*time.Second, "time per workload")
	cmd.Flags().IntVar(&l.maxRequests, "requests", 0, "closed loop: stop a workload after this many requests (0: only --duration)")
	cmd.Flags().Float64Var(&l.rate, "rate", 0, "open loop: requests offered per second (0: closed loop)")
	cmd.Flags().DurationVar(&l.timeout, "timeout", 0, "each request's deadline (0: 2s in open loop, none in closed loop)")
	cmd.Flags().BoolVar(&l.retry, "retry-unavailable", false, fmt.Sprintf("resend a request answered Unavailable, within its deadline, up to %d times", bench.MaxRetries))
	cmd.Flags().IntVar(&l.pid, "pid", 0, "report this process's VmRSS before, during and after each workload, and in closed loop its CPU time per request (default: this process in open loop without --addr)")
	cmd.Flags().DurationVar(&l.settle, "settle", 5*time.Second, "with memory observed: wait this long after the load before reading VmRSS again")
	return cmd
}

// benchLoad is how bench loads each workload.
type benchLoad struct {
	concurrency, maxRequests  int // closed loop
	rate                      float64
	duration, timeout, settle time.Duration
	retry                     bool
	pid                       int // whose memory to watch; 0 for none
}

// run drives one workload and prints what it measured, with pid's memory
// and CPU time per request around it when one is watched.
func (l benchLoad) run(ctx context.Context, client bench.Inferer, model, name string, g *bench.Generator) error {
	var err error
	var answered int
	load := func() {
		if l.rate == 0 {
			res := bench.Run(ctx, bench.LoadOptions{Client: client, Model: model, Generator: g, Concurrency: l.concurrency,
				Duration: l.duration, MaxRequests: l.maxRequests, Timeout: l.timeout, RetryUnavailable: l.retry})
			res.Print(os.Stdout, name)
			answered = res.Requests + res.Errors
			return
		}
		var res bench.OpenResult
		res, err = bench.OpenLoop(ctx, bench.OpenLoopOptions{Client: client, Model: model, Generator: g,
			Rate: l.rate, Duration: l.duration, Timeout: l.timeout, RetryUnavailable: l.retry})
		if err == nil {
			res.Print(os.Stdout, name)
		}
	}
	if l.pid == 0 {
		load()
		return err
	}
	before, cpuErr := bench.ReadCPUTicks(l.pid)
	bench.WatchRSS(ctx, l.pid, 100*time.Millisecond, l.settle, load).Print(os.Stdout, name)
	after, err2 := bench.ReadCPUTicks(l.pid)
	if cpuErr == nil && err2 == nil && answered > 0 {
		cpu := time.Duration(after-before) * bench.ClockTick()
		fmt.Printf("%-8s cpu of pid %d: %s, %.3fms per request (utime+stime; the settle included)\n", name, l.pid, cpu.Round(time.Millisecond),
			float64(cpu)/1e6/float64(answered))
	}
	return err
}

// benchProtocols parses --protocol and checks that the addresses its
// protocols need are given.
func benchProtocols(list, addr, httpAddr string) ([]string, error) {
	if httpAddr != "" && addr == "" {
		return nil, fmt.Errorf("--http-addr goes with --addr; without --addr, bench uses its dev cluster's")
	}
	var protos []string
	for _, p := range strings.Split(list, ",") {
		switch p {
		case "grpc":
		case "rest", "rest-binary":
			if addr != "" && httpAddr == "" {
				return nil, fmt.Errorf("--protocol %s with --addr needs --http-addr, the router's HTTP address", p)
			}
		default:
			return nil, fmt.Errorf("unknown protocol %q (have grpc, rest, rest-binary)", p)
		}
		if !slices.Contains(protos, p) {
			protos = append(protos, p)
		}
	}
	return protos, nil
}

// benchClients makes a client for each protocol; closeAll closes them.
func benchClients(protos []string, addr, httpAddr string, conns int, creds credentials.TransportCredentials) (clients map[string]bench.Inferer, closeAll func(), err error) {
	clients = map[string]bench.Inferer{}
	var closers []func()
	closeAll = func() {
		for _, c := range closers {
			c()
		}
	}
	for _, p := range protos {
		switch p {
		case "grpc":
			var each []bench.Inferer
			for range max(conns, 1) {
				conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds),
					grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(256<<20)))
				if err != nil {
					closeAll()
					return nil, nil, err
				}
				closers = append(closers, func() { conn.Close() })
				each = append(each, kserveClient(conn))
			}
			clients[p] = bench.NewRoundRobin(each...)
		case "rest", "rest-binary":
			c, err := bench.NewRESTClient(bench.RESTOptions{Addr: httpAddr, Binary: p == "rest-binary"})
			if err != nil {
				closeAll()
				return nil, nil, err
			}
			closers = append(closers, c.Close)
			clients[p] = c
		}
	}
	return clients, closeAll, nil
}

// generatedModel is the manifest of the full version under model's
// latest version in repo, which must have been made by 'cumulus model
// gen': bench draws its traffic from the generator recorded in it.
func generatedModel(repo, model string) (*codec.Manifest, error) {
	r := loader.Repo{Dir: repo}
	v, err := r.Latest(model)
	if err != nil {
		return nil, fmt.Errorf("--repo: %w", err)
	}
	chain, err := r.Chain(model, v)
	if err != nil {
		return nil, err
	}
	m := chain[len(chain)-1] // a delta's generator is its full version's
	if m.Generator == nil {
		return nil, fmt.Errorf("model %s was not made by 'cumulus model gen': no id generator to draw traffic from", model)
	}
	return m, nil
}

// localBench is a generated model served by a dev cluster and a front in
// this process: what a bench command targets without --addr.
type localBench struct {
	repo, model string
	srv         *server.Server
	cluster     *devcluster.Cluster
	close       func()
}

// startLocalBench generates a model of the shape flags give with params features in a
// temporary repository and serves it with a dev cluster of o (its Repo
// set here); close stops both and removes the repository.
func startLocalBench(ctx context.Context, flags shapeFlags, params int64, o devcluster.Options) (*localBench, error) {
	spec, err := flags.spec("bench", params, 7)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "cumulus-bench-")
	if err != nil {
		return nil, err
	}
	lb := &localBench{repo: dir, model: "bench"}
	fmt.Printf("generating %s model %q: %d features\n", spec.Shape, lb.model, params)
	if _, err := (loader.Repo{Dir: dir}).Generate(spec); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	o.Repo = dir
	c, srv, err := benchCluster(ctx, o)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	lb.srv, lb.cluster = srv, c
	lb.close = func() { srv.Close(); c.Close(); os.RemoveAll(dir) }
	return lb, nil
}

// benchCluster starts a dev cluster and a front on loopback ports and
// waits until it serves; the caller closes both.
func benchCluster(ctx context.Context, o devcluster.Options) (*devcluster.Cluster, *server.Server, error) {
	c, err := devcluster.Start(ctx, o)
	if err != nil {
		return nil, nil, err
	}
	srv, err := server.Start(server.Options{Predictor: c.Router, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0"})
	if err == nil {
		err = c.WaitReady(ctx)
		if err != nil {
			srv.Close()
		}
	}
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, srv, nil
}
