package main

import (
	"context"
	"fmt"
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
				lb, err = startLocalBench(ctx, shapeFlags{s: model.Shape{Type: model.LR}}, params, devcluster.Options{Shards: shards, ScanInterval: scan})
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
			for _, a := range strings.Split(addrs, ",") {
				conn, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()))
				if err != nil {
					return err
				}
				defer conn.Close()
				o.Routers = append(o.Routers, kserveClient(conn))
			}
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
			if lb != nil && o.Golden > 0 {
				// The gate ran on every delta served: its outcomes, as
				// the manager recorded them.
				outcomes := map[string]int{}
				var took []time.Duration
				for _, f := range fs {
					outcome := "not recorded"
					for _, v := range lb.cluster.Manager.State().Models[modelName].Versions {
						for _, g := range v.Gates {
							if v.Version == f.Version && g.Gate == manager.GateGolden {
								outcome = g.Outcome
								took = append(took, g.Took)
							}
						}
					}
					outcomes[outcome]++
				}
				slices.Sort(took)
				fmt.Printf("golden gate on the deltas: %v", outcomes)
				if len(took) > 0 {
					fmt.Printf("; each ran %s (median), %s (slowest)", took[len(took)/2].Round(time.Millisecond/10), took[len(took)-1].Round(time.Millisecond/10))
				}
				fmt.Println()
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
	cmd.Flags().IntVar(&o.Golden, "golden", 0, "publish this many golden requests with the first delta, and each later delta's parent's scored again (the golden gate then checks every delta before it serves)")
	cmd.Flags().IntVar(&load.Concurrency, "concurrency", 2, "rank200 callers on the first router meanwhile (0: none)")
	return cmd
}
