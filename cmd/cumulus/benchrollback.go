package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/manager"
	"github.com/cumulus-serving/cumulus/model"
)

func benchRollbackCommand() *cobra.Command {
	var (
		params              int64
		shards, concurrency int
		rounds              int
		budget              byteSize
		settle              time.Duration
	)
	cmd := &cobra.Command{
		Use:   "rollback",
		Short: "Measure rollouts and rollbacks under load: time to commit, time until every answer comes from the new version, failed requests, p99 around each",
		Long: `rollback generates three versions of an LR model of --params features, starts a
dev cluster (version 3 goes live), drives rank200 load through the router's
gRPC API throughout, and through the admin API: pins version 1 (a rollout:
loaded, staged, committed), rolls back to 3 and to 1 --rounds times (both
on standby: only the map changes), unpins (back to 3) and pins 2 (another
rollout). For each it prints when the call returned, when every answer came
from the new version, failed requests and latency around it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			dir, err := os.MkdirTemp("", "cumulus-bench-rollback-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			repo := loader.Repo{Dir: dir}
			fmt.Printf("generating 3 versions of lr model \"bench\": %d features each\n", params)
			var gen *codec.GenInfo
			for seed := range uint64(3) {
				m, err := repo.Generate(loader.GenSpec{Name: "bench", Shape: model.Shape{Type: model.LR}, Params: params, Seed: 7 + seed})
				if err != nil {
					return err
				}
				gen = m.Generator
			}
			c, srv, err := benchCluster(ctx, devcluster.Options{Repo: dir, Shards: shards, MemoryBudget: int64(budget), ScanInterval: time.Hour})
			if err != nil {
				return err
			}
			defer c.Close()
			defer srv.Close()
			token := rand.Text()
			adm, err := c.Manager.ServeAdmin(manager.AdminOptions{Addr: "127.0.0.1:0", Token: token})
			if err != nil {
				return err
			}
			defer adm.Close()
			api := &adminClient{base: "http://" + adm.Addr(), token: token, http: &http.Client{Timeout: time.Minute}}
			live := func() (manager.ModelDetail, error) {
				var d manager.ModelDetail
				b, err := api.call(http.MethodGet, "/admin/v1/models/bench", nil)
				if err == nil {
					err = json.Unmarshal(b, &d)
				}
				return d, err
			}
			conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return err
			}
			defer conn.Close()
			g, err := bench.NewGenerator(bench.Workloads["rank200"], *gen, params, 42)
			if err != nil {
				return err
			}
			fmt.Printf("dev cluster: %d shards, memory budget %s per shard; rank200 load, concurrency %d\n", shards, &budget, concurrency)
			loadCtx, stopLoad := context.WithCancel(ctx)
			traced := make(chan []bench.Call, 1)
			go func() {
				traced <- bench.Trace(loadCtx, bench.LoadOptions{Client: kserveClient(conn), Model: "bench", Generator: g, Concurrency: concurrency})
			}()
			type step struct {
				label       string
				start, done time.Time // the call, and when the new version was committed
				want        uint64
			}
			var steps []step
			pause := func() {
				select {
				case <-time.After(settle):
				case <-ctx.Done():
				}
			}
			// do makes one admin call and waits until want is committed.
			do := func(label, method, path string, body any, want uint64) error {
				s := step{label: label, start: time.Now(), want: want}
				if _, err := api.call(method, path, body); err != nil {
					return fmt.Errorf("%s: %w", label, err)
				}
				for {
					d, err := live()
					if err != nil {
						return err
					}
					if d.Live == want {
						break
					}
					if time.Since(s.start) > 5*time.Minute {
						return fmt.Errorf("%s: version %d not live after 5 minutes", label, want)
					}
					time.Sleep(5 * time.Millisecond)
				}
				s.done = time.Now()
				steps = append(steps, s)
				pause()
				return nil
			}
			begin := time.Now()
			pause()
			steadyEnd := time.Now()
			path := "/admin/v1/models/bench"
			// Each call names the live version it acts on ("from").
			err = do("rollout to 1 (pin, loads)", http.MethodPut, path+"/pin", map[string]uint64{"version": 1, "from": 3}, 1)
			for i := 0; err == nil && i < rounds; i++ {
				err = do("rollback to 3 (standby)", http.MethodPost, path+"/rollback", map[string]uint64{"to": 3, "from": 1}, 3)
				if err == nil {
					err = do("rollback to 1 (standby)", http.MethodPost, path+"/rollback", map[string]uint64{"to": 1, "from": 3}, 1)
				}
			}
			if err == nil {
				err = do("unpin: back to 3 (standby)", http.MethodDelete, path+"/pin?from=1", nil, 3)
			}
			if err == nil {
				err = do("rollout to 2 (pin, loads)", http.MethodPut, path+"/pin", map[string]uint64{"version": 2, "from": 3}, 2)
			}
			pause()
			stopLoad()
			calls := <-traced
			if err != nil {
				return err
			}
			bench.Summarize(calls, begin, steadyEnd).Print(os.Stdout, "steady (version 3)")
			end := time.Now()
			for i, s := range steps {
				next := end
				if i+1 < len(steps) {
					next = steps[i+1].start
				}
				conv := bench.Converged(calls, s.done, next, s.want)
				to := s.done.Add(conv).Add(time.Second)
				if to.After(next) {
					to = next
				}
				w := bench.Summarize(calls, s.start, to)
				fmt.Printf("%-28s committed after %-9s all answers from %d %s after that\n", s.label,
					s.done.Sub(s.start).Round(time.Millisecond), s.want, conv.Round(time.Millisecond))
				w.Print(os.Stdout, "  from the call to 1s after")
			}
			last := steps[len(steps)-1]
			bench.Summarize(calls, last.done.Add(time.Second), end).Print(os.Stdout, "after (version 2)")
			return nil
		},
	}
	cmd.Flags().Int64Var(&params, "params", 1_000_000, "features per version")
	cmd.Flags().IntVar(&shards, "shards", 4, "shard servers")
	cmd.Flags().IntVar(&concurrency, "concurrency", 4, "requests in flight")
	cmd.Flags().IntVar(&rounds, "rounds", 3, "rollbacks to 3 and back to 1")
	cmd.Flags().Var(&budget, "memory-budget", "per shard resident table bytes (default: no bound)")
	cmd.Flags().DurationVar(&settle, "settle", 2*time.Second, "load between steps")
	return cmd
}
