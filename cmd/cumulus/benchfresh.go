package main

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/manager"
	"github.com/cumulus-serving/cumulus/model"
)

func benchFreshnessCommand() *cobra.Command {
	var (
		addrs, repo, modelName string
		params                 int64
		shards                 int
		scan                   time.Duration
		o                      bench.FreshOptions
		load                   bench.LoadOptions
		validator              string
		holdout                int
	)
	cmd := &cobra.Command{
		Use:   "freshness",
		Short: "Measure how soon a published delta is served: from publication until every router answers from it",
		Long: `freshness publishes --deltas deltas of --keys keys each, one after another,
into a model's repository, and times each from the moment publishing
returned (the version renamed into place and synced) until every router
answers a request for a probe feature from that version, with the score
the delta makes (checked exactly). Meanwhile --concurrency callers send
rank200 requests to the first router; their errors are reported.

With --addr (router gRPC addresses, comma-separated: a cluster of separate
processes), --repo and --model name the repository its manager watches and
a model made by 'cumulus model gen'. Without --addr, it generates an LR
model of --params features and runs a dev cluster in this process
(--shards, --scan-interval as 'cumulus dev').

Target (issue 13): every delta of 1,000,000 keys served within 1s.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if addrs != "" && (repo == "" || modelName == "") {
				return fmt.Errorf("with --addr, give --repo and --model")
			}
			var lb *localBench
			if addrs == "" {
				var err error
				dopts := devcluster.Options{Shards: shards, ScanInterval: scan}
				holdoutFile := ""
				if holdout > 0 {
					if holdoutFile, err = writeHoldout(holdout, uint64(params)); err != nil {
						return err
					}
					defer os.Remove(holdoutFile)
				}
				dopts.Manager = func(o *manager.Options) {
					o.Validator = validator
					if holdoutFile != "" {
						o.Holdout = map[string]string{"bench": holdoutFile}
					}
				}
				lb, err = startLocalBench(ctx, shapeFlags{s: model.Shape{Type: model.LR}}, params, dopts)
				if err != nil {
					return err
				}
				defer lb.close()
				repo, modelName, addrs = lb.repo, lb.model, lb.srv.GRPCAddr()
				fmt.Printf("dev cluster in this process: %d shards, scan every %s, router at %s\n", shards, scan, addrs)
			}
			m, err := generatedModel(repo, modelName)
			if err != nil {
				return err
			}
			var closeRouters func()
			if o.Routers, closeRouters, err = routerClients(addrs); err != nil {
				return err
			}
			defer closeRouters()
			o.Repo, o.Model, o.KeySpace = loader.Repo{Dir: repo}, modelName, uint64(m.Params)
			var loaded chan bench.Result
			if load.Concurrency > 0 {
				g, err := bench.ForModel(bench.Workloads["rank200"], m, 42)
				if err != nil {
					return err
				}
				lctx, stop := context.WithCancel(ctx)
				defer stop()
				load.Client, load.Model, load.Generator, load.Duration = o.Routers[0], modelName, g, 24*time.Hour
				loaded = make(chan bench.Result, 1)
				go func() { loaded <- bench.Run(lctx, load) }()
				defer func() {
					stop()
					r := <-loaded
					r.Print(os.Stdout, "load")
				}()
			}
			fmt.Printf("publishing %d deltas of %d keys to %s in %s; %d router(s)\n", o.Deltas, o.Keys, modelName, repo, len(o.Routers))
			fs, err := bench.Freshness(ctx, o, os.Stdout)
			s := bench.SummarizeFresh(fs)
			fmt.Printf("served by every router: %d of %d within 1s; median %s, p90 %s, slowest %s\n",
				s.WithinSecond, s.N, s.Median.Round(time.Millisecond), s.P90.Round(time.Millisecond), s.Slowest.Round(time.Millisecond))
			if lb != nil {
				printGates(lb.cluster.Manager.State().Models[modelName], fs)
			}
			return err
		},
	}
	cmd.Flags().StringVar(&addrs, "addr", "", "routers' gRPC addresses, comma-separated (default: a dev cluster in this process)")
	cmd.Flags().StringVar(&repo, "repo", "", "with --addr: the repository the cluster serves")
	cmd.Flags().StringVar(&modelName, "model", "", "with --addr: a model made by 'cumulus model gen'")
	cmd.Flags().Int64Var(&params, "params", 10_000_000, "without --addr: features of the generated model")
	cmd.Flags().IntVar(&shards, "shards", 4, "without --addr: shard servers")
	cmd.Flags().DurationVar(&scan, "scan-interval", 2*time.Second, "without --addr: the manager's full scan interval (it also watches the repository)")
	cmd.Flags().IntVar(&o.Deltas, "deltas", 20, "deltas to publish")
	cmd.Flags().IntVar(&o.Keys, "keys", 1_000_000, "keys each delta changes")
	cmd.Flags().DurationVar(&o.Every, "every", 0, "publish a delta every this long (0: each as soon as the last is served)")
	cmd.Flags().IntVar(&o.Golden, "golden", 0, "publish this many golden requests with the first delta, and each later delta's parent's scored again (the golden gate then checks every delta before it serves)")
	cmd.Flags().StringVar(&validator, "validator", "", "without --addr: the manager's --validator (the validator gate runs on every delta)")
	cmd.Flags().IntVar(&holdout, "holdout", 0, "without --addr: a hold-out set of this many generated requests, random labels (the hold-out gate runs on every delta)")
	cmd.Flags().IntVar(&load.Concurrency, "concurrency", 2, "rank200 callers on the first router meanwhile (0: none)")
	return cmd
}

// writeHoldout writes a hold-out set of n generated requests over ids
// [0, keySpace) to a temporary file and returns its name.
func writeHoldout(n int, keySpace uint64) (string, error) {
	b, err := bench.GateRequests(rand.New(rand.NewPCG(3, 3)), n, keySpace, true)
	if err != nil {
		return "", err
	}
	f, err := os.CreateTemp("", "cumulus-holdout-*.jsonl")
	if err != nil {
		return "", err
	}
	defer f.Close()
	_, err = f.Write(b)
	return f.Name(), err
}

// printGates prints, for the gates that ran on the deltas fs, their
// outcomes and how long each ran, as the manager recorded them.
func printGates(m *manager.ModelState, fs []bench.Fresh) {
	if m == nil {
		return
	}
	outcomes := map[string]map[string]int{}
	took := map[string][]time.Duration{}
	for _, f := range fs {
		for _, v := range m.Versions {
			if v.Version != f.Version {
				continue
			}
			for _, g := range v.Gates {
				if outcomes[g.Gate] == nil {
					outcomes[g.Gate] = map[string]int{}
				}
				outcomes[g.Gate][g.Outcome]++
				took[g.Gate] = append(took[g.Gate], g.Took)
			}
		}
	}
	for _, gate := range slices.Sorted(maps.Keys(outcomes)) {
		d := took[gate]
		slices.Sort(d)
		fmt.Printf("gate %s on the deltas: %v", gate, outcomes[gate])
		if d[len(d)-1] == 0 {
			fmt.Println("; it runs within the files' verification")
			continue
		}
		fmt.Printf("; ran %s (median), %s (slowest)\n", d[len(d)/2].Round(time.Millisecond/10), d[len(d)-1].Round(time.Millisecond/10))
	}
}

// routerClients are KServe clients of each router gRPC address in addrs
// (comma-separated, plaintext), and what closes their connections.
func routerClients(addrs string) ([]bench.Inferer, func(), error) {
	var out []bench.Inferer
	var conns []*grpc.ClientConn
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	for _, a := range strings.Split(addrs, ",") {
		conn, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		conns = append(conns, conn)
		out = append(out, kserveClient(conn))
	}
	return out, closeAll, nil
}
