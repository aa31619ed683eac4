package main

import (
	"cmp"
	"context"
	"crypto/rand"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
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
	"github.com/cumulus-serving/cumulus/shard"
)

func benchRollbackCommand() *cobra.Command {
	var (
		params              int64
		partitions          uint32
		shards, concurrency int
		rounds, deltaKeys   int
		budget, loadRate    byteSize
		diskReads           diskReadsFlag
		settle, warm        time.Duration
		rate                float64
	)
	cmd := &cobra.Command{
		Use:   "rollback",
		Short: "Measure rollouts and rollbacks under load: time to commit, time until every answer comes from the new version, failed requests, p99 around each",
		Long: `rollback generates an LR model of --params features, starts a dev cluster
(version 1 goes live) and drives rank200 load through the router's gRPC API
throughout. It publishes version 2 (a rollout: loaded, staged, committed),
then through the admin API rolls back to 1 and to 2 --rounds times (both on
standby: only the map changes), unpins, publishes version 3 (another
rollout) and then version 4, a delta on 3 of --delta-keys features. Every
version has version 1's features with other values, as a model retrained
on the same data has, so a version served from disk (--memory-budget below
a shard's share) finds its hot keys in the value caches warmed while it
was staged. The full versions are generated before the cluster starts,
beside its repository, and each is published by moving its directory in:
the load measures the rollout, not the generator.

For each step it prints how long after the call (or the publication)
returned the new version was committed and when every answer came from
it, then two windows of the load: from the call until the commit (for a
rollout, loading and staging), and from the commit until 1s after every
answer came from the new version (going live); each with its failed
requests, p50 and p99, and the p99's ratio to the steady one (version 1,
--settle of load after --warm of it, before the first step). Last, the
windows of each kind are pooled (a 1s window holds too few requests for
its p99 to tell a swap from the load's own spread): the rollouts'
stagings, and the going live of rollouts, rollbacks, the delta and all
of them, beside the closing steady window (version 4, from 1s after its
commit). A rollout is timed from its publication
returning: the manager's repository watch may have begun loading it
before. With --rate the load is open loop, as traffic from many users
arrives: a server with room to spare is measured, not one kept
saturated. (A version published before the live one and never live is
retired, not a rollback target: the rollouts are of new versions.)`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !(rate >= 0) || math.IsInf(rate, 0) {
				return fmt.Errorf("--rate %v: give requests a second, or 0 for a closed loop", rate)
			}
			if err := loader.CheckGenDeltas(1, deltaKeys, params); err != nil {
				return fmt.Errorf("--delta-keys: %w", err)
			}
			ctx := cmd.Context()
			dir, err := os.MkdirTemp("", "cumulus-bench-rollback-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			repo := loader.Repo{Dir: dir}
			// The three full versions are generated before the cluster
			// starts, in a repository beside the served one, and each is
			// published by renaming its directory into the served one:
			// generated at its rollout, on the cores that serve, the
			// seconds it took ran just before the measured window, whose
			// first requests then queued behind it or were refused.
			side, err := os.MkdirTemp("", "cumulus-bench-rollback-gen-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(side)
			fmt.Printf("generating lr model \"bench\": versions 1 to 3, %d features each\n", params)
			var first *codec.Manifest
			for seed := range uint64(3) {
				m, err := loader.Repo{Dir: side}.Generate(loader.GenSpec{Name: "bench", Shape: model.Shape{Type: model.LR}, Params: params, Partitions: partitions,
					Seed: 7, ValueSeed: 7 + seed})
				if err != nil {
					return err
				}
				first = cmp.Or(first, m)
			}
			if err := os.Mkdir(filepath.Join(dir, "bench"), 0o755); err != nil {
				return err
			}
			publish := func(v uint64) error {
				name := filepath.Join("bench", strconv.FormatUint(v, 10))
				return os.Rename(filepath.Join(side, name), filepath.Join(dir, name))
			}
			if err := publish(1); err != nil {
				return err
			}
			gen := first.Generator
			c, srv, err := benchCluster(ctx, devcluster.Options{Repo: dir, Shards: shards, MemoryBudget: int64(budget), ScanInterval: time.Hour,
				Shard: func(_ int, o *shard.Options) { o.LoadRate, o.DiskReads = int64(loadRate), string(diskReads) }})
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
			// live is the version the manager has committed, read from its
			// state in this process: await asks every 5ms, and the admin
			// API's model detail (shards and rollout progress) cost about a
			// tenth of a core at that pace with 1,024 partitions, taken
			// from the cores that serve while a version stages.
			live := func() uint64 {
				if m := c.Manager.State().Models["bench"]; m != nil {
					return m.Live
				}
				return 0
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
			load := fmt.Sprintf("concurrency %d", concurrency)
			if rate > 0 {
				load = fmt.Sprintf("open loop at %g a second", rate)
			}
			fmt.Printf("dev cluster: %d shards, memory budget %s per shard; rank200 load, %s\n", shards, &budget, load)
			loadCtx, stopLoad := context.WithCancel(ctx)
			traced := make(chan []bench.Call, 1)
			go func() {
				o := bench.LoadOptions{Client: kserveClient(conn), Model: "bench", Generator: g, Concurrency: concurrency}
				if rate > 0 {
					traced <- bench.TraceOpen(loadCtx, o, rate)
				} else {
					traced <- bench.Trace(loadCtx, o)
				}
			}()
			type step struct {
				label, kind string    // kind: rollout, rollback, delta or unpin
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
			// await records a step begun at start and waits until want is
			// committed.
			await := func(label, kind string, start time.Time, want uint64) error {
				s := step{label: label, kind: kind, start: start, want: want}
				for {
					if live() == want {
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
			// do makes one admin call and waits until want is committed.
			do := func(label, kind, method, path string, body any, want uint64) error {
				start := time.Now()
				if _, err := api.call(method, path, body); err != nil {
					return fmt.Errorf("%s: %w", label, err)
				}
				return await(label, kind, start, want)
			}
			// rollout publishes a new version (the manager is told at once,
			// as its repository watch would) and waits until it is live.
			rollout := func(label string, v uint64) error {
				if err := publish(v); err != nil {
					return err
				}
				start := time.Now()
				c.Manager.Rescan()
				return await(label, "rollout", start, v)
			}
			delta := func(label string, want uint64) error {
				if _, err := repo.GenerateDeltas("bench", 1, deltaKeys, want); err != nil {
					return err
				}
				start := time.Now()
				c.Manager.Rescan()
				return await(label, "delta", start, want)
			}
			select {
			case <-time.After(warm): // connections made, caches learned
			case <-ctx.Done():
			}
			begin := time.Now()
			pause()
			steadyEnd := time.Now()
			path := "/admin/v1/models/bench"
			// Each call names the live version it acts on ("from").
			err = rollout("rollout to 2 (publish, loads)", 2)
			for i := 0; err == nil && i < rounds; i++ {
				err = do("rollback to 1 (standby)", "rollback", http.MethodPost, path+"/rollback", map[string]uint64{"to": 1, "from": 2}, 1)
				if err == nil {
					err = do("rollback to 2 (standby)", "rollback", http.MethodPost, path+"/rollback", map[string]uint64{"to": 2, "from": 1}, 2)
				}
			}
			if err == nil {
				err = do("unpin (2 stays)", "unpin", http.MethodDelete, path+"/pin?from=2", nil, 2)
			}
			if err == nil {
				err = rollout("rollout to 3 (publish, loads)", 3)
			}
			if err == nil {
				err = delta(fmt.Sprintf("delta 4 (%d features)", deltaKeys), 4)
			}
			pause()
			stopLoad()
			calls := <-traced
			if err != nil {
				return err
			}
			steady := bench.Summarize(calls, begin, steadyEnd)
			steady.Print(os.Stdout, "steady (version 1)")
			toSteady := func(w bench.Window) float64 { return float64(w.P99) / float64(max(steady.P99, 1)) }
			show := func(label string, w bench.Window) {
				fmt.Printf("  %-26s %s p99/steady=%.2f%s\n", label, w.Stats(), toSteady(w), w.FailedCodes())
			}
			window := func(label string, from, to time.Time) { show(label, bench.Summarize(calls, from, to)) }
			end := time.Now()
			// The windows of each kind of step, pooled: a 1s window's p99
			// is its third slowest request at 300 a second, too few to
			// tell a swap's cost from the load's own spread.
			var stagings []bench.Span // the rollouts', call to commit
			golive := map[string][]bench.Span{}
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
				fmt.Printf("%-28s committed after %-9s all answers from %d %s after that\n", s.label,
					s.done.Sub(s.start).Round(time.Millisecond), s.want, conv.Round(time.Millisecond))
				window("call to commit", s.start, s.done)
				window("commit to 1s after", s.done, to)
				if s.kind == "rollout" {
					stagings = append(stagings, bench.Span{From: s.start, To: s.done})
				}
				golive[s.kind] = append(golive[s.kind], bench.Span{From: s.done, To: to})
			}
			last := steps[len(steps)-1]
			closing := bench.Summarize(calls, last.done.Add(time.Second), end)
			closing.Print(os.Stdout, "after (version 4)")
			fmt.Printf("pooled (closing steady window p99/steady=%.2f):\n", toSteady(closing))
			show(fmt.Sprintf("rollouts: %d stagings", len(stagings)), bench.Pool(calls, stagings))
			var all []bench.Span
			for _, kind := range []string{"rollout", "rollback", "delta"} {
				show(fmt.Sprintf("%ss: %d going live", kind, len(golive[kind])), bench.Pool(calls, golive[kind]))
				all = append(all, golive[kind]...)
			}
			show(fmt.Sprintf("all %d going live", len(all)), bench.Pool(calls, all))
			return nil
		},
	}
	cmd.Flags().Int64Var(&params, "params", 1_000_000, "features per version")
	cmd.Flags().Uint32Var(&partitions, "partitions", 8, "partitions per version")
	cmd.Flags().IntVar(&deltaKeys, "delta-keys", 10_000, "features the delta (version 4) changes")
	cmd.Flags().IntVar(&shards, "shards", 4, "shard servers")
	cmd.Flags().IntVar(&concurrency, "concurrency", 4, "requests in flight (closed loop)")
	cmd.Flags().Float64Var(&rate, "rate", 0, "open loop: requests sent a second, each timed from when it was due, with a deadline of 2s (0: closed loop at --concurrency)")
	cmd.Flags().IntVar(&rounds, "rounds", 3, "rollbacks to 1 and back to 2")
	cmd.Flags().Var(&budget, "memory-budget", "per shard resident table bytes (default: no bound)")
	cmd.Flags().Var(&loadRate, "load-rate", "per shard: "+loadRateUsage)
	cmd.Flags().Var(&diskReads, "disk-reads", diskReadsUsage)
	cmd.Flags().DurationVar(&settle, "settle", 2*time.Second, "load between steps, and the steady window's length")
	cmd.Flags().DurationVar(&warm, "warm", 2*time.Second, "load before the steady window")
	return cmd
}
