package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/server"
)

func benchCommand() *cobra.Command {
	var (
		workloads, addr, model, repo, typ string
		params                            int64
		shards, concurrency, maxRequests  int
		duration                          time.Duration
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Drive predict load and print QPS, p50/p99/p999 and request bytes",
		Long: `bench runs the rank200 and small workloads against a router's gRPC address.

With --addr, it targets a running router; --repo tells it the model's
generator settings (the model must come from 'cumulus model gen').
Without --addr, it generates a model of --params features, starts a dev
cluster of --shards shards on loopback and targets that.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if addr == "" {
				dir, err := os.MkdirTemp("", "cumulus-bench-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				repo, model = dir, "bench"
				fmt.Printf("generating %s model %q: %d features\n", typ, model, params)
				if _, err := (loader.Repo{Dir: dir}).Generate(loader.GenSpec{Name: model, Type: typ, Params: params, Seed: 7}); err != nil {
					return err
				}
				c, srv, err := benchCluster(ctx, devcluster.Options{Repo: dir, Shards: shards})
				if err != nil {
					return err
				}
				defer c.Close()
				defer srv.Close()
				addr = srv.GRPCAddr()
				fmt.Printf("dev cluster: %d shards, router at %s\n", shards, addr)
			}
			r := loader.Repo{Dir: repo}
			v, err := r.Latest(model)
			if err != nil {
				return fmt.Errorf("--repo: %w", err)
			}
			m, err := r.Manifest(model, v)
			if err != nil {
				return err
			}
			if m.Generator == nil {
				return fmt.Errorf("model %s was not made by 'cumulus model gen': no id generator to draw traffic from", model)
			}
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(256<<20)))
			if err != nil {
				return err
			}
			defer conn.Close()
			names := strings.Split(workloads, ",")
			if workloads == "all" {
				names = []string{"rank200", "small"}
			}
			fmt.Printf("model %s v%d: %s, %d features, %d partitions; concurrency %d, %s per workload\n",
				m.Name, m.Version, m.Type, m.Params, m.Partitions, concurrency, duration)
			for _, name := range names {
				w, ok := bench.Workloads[name]
				if !ok {
					return fmt.Errorf("unknown workload %q (have rank200, small)", name)
				}
				g, err := bench.NewGenerator(w, *m.Generator, m.Params, 42)
				if err != nil {
					return err
				}
				res := bench.Run(ctx, bench.LoadOptions{Client: kserveClient(conn), Model: model, Generator: g,
					Concurrency: concurrency, Duration: duration, MaxRequests: maxRequests})
				res.Print(os.Stdout, name)
			}
			return nil
		},
	}
	cmd.AddCommand(benchTableCommand(), benchOverBudgetCommand(), benchOverBudgetChild(), benchRollbackCommand())
	cmd.Flags().StringVar(&workloads, "workload", "all", "rank200, small, or all (comma-separated)")
	cmd.Flags().StringVar(&addr, "addr", "", "router gRPC address (default: start a dev cluster)")
	cmd.Flags().StringVar(&model, "model", "", "model name, with --addr")
	cmd.Flags().StringVar(&repo, "repo", "", "repository holding --model, with --addr")
	cmd.Flags().StringVar(&typ, "type", codec.TypeLR, "without --addr: lr or fm")
	cmd.Flags().Int64Var(&params, "params", 1_000_000, "without --addr: features in the generated model")
	cmd.Flags().IntVar(&shards, "shards", 4, "without --addr: shard servers")
	cmd.Flags().IntVar(&concurrency, "concurrency", 4, "requests in flight")
	cmd.Flags().DurationVar(&duration, "duration", 10*time.Second, "time per workload")
	cmd.Flags().IntVar(&maxRequests, "requests", 0, "stop a workload after this many requests (0: only --duration)")
	return cmd
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
