package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/internal/etcdlocal"
	"github.com/cumulus-serving/cumulus/internal/hedge"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/manager"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/server"
	"github.com/cumulus-serving/cumulus/shard"
)

func benchTailCommand() *cobra.Command {
	var o tailOptions
	cmd := &cobra.Command{
		Use:   "tail",
		Short: "Measure the tail: no fault, a straggler unhedged and hedged, a shard process killed",
		Long: `tail starts a cluster whose shards are separate 'cumulus shard' processes
(--shards of them, replicas 2), with an embedded etcd, a manager and two
routers in this process — one hedging, one not — each behind a gRPC
front, and drives the rank200 workload through the fronts. It runs, in
turn and --rounds times:

  no fault, hedged       no fault, unhedged
  straggler, unhedged    straggler, hedged     (shard-0 injects --fault)

and then once, hedged, with shard-0's process killed (SIGKILL) a third
of the way into the run. Each row gives QPS, p50, p99, p99.9, the extra
shard calls the router made (hedges and retries, as a share of the first
calls, from its metrics), the hedges its budget held back and errors by
gRPC code; then the median of each
scenario over the rounds and the ratios the targets are stated in.

The fault is set and cleared through each shard's PUT /admin/v1/fault.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runTail(cmd.Context(), o) },
	}
	cmd.Flags().IntVar(&o.shards, "shards", 4, "shard processes")
	o.shape.register(cmd, "")
	cmd.Flags().Int64Var(&o.params, "params", 1_000_000, "features in the generated model")
	cmd.Flags().StringVar(&o.fault, "fault", "delay=50ms,fraction=0.01", "what the straggler, shard-0, injects (see 'cumulus shard --fault')")
	cmd.Flags().IntVar(&o.rounds, "rounds", 1, "times the four scenarios without a kill are run, alternating")
	cmd.Flags().IntVar(&o.requests, "requests", 20_000, "requests per scenario")
	cmd.Flags().IntVar(&o.concurrency, "concurrency", 4, "closed loop: requests in flight")
	cmd.Flags().DurationVar(&o.killAfter, "kill-after", 0, "when to kill shard-0 in the last run (default: a third of the way through, judged by the first hedged run's time)")
	cmd.Flags().DurationVar(&o.hedgeDelay, "hedge-delay", 0, "the hedging router's fixed hedge delay (default: the p95 of the replicas that could take over)")
	cmd.Flags().Float64Var(&o.hedgeBudget, "hedge-budget", 0.05, "the hedging router's budget")
	cmd.Flags().StringVar(&o.choice, "replica-choice", "least-loaded", "both routers' replica choice: least-loaded or rotation")
	return cmd
}

type tailOptions struct {
	shards, rounds, requests, concurrency int
	fault, choice                         string
	shape                                 shapeFlags
	params                                int64
	killAfter, hedgeDelay                 time.Duration
	hedgeBudget                           float64
}

// tailShard is one shard process.
type tailShard struct {
	id, http string
	cmd      *exec.Cmd
	exited   chan struct{}
}

// tailRouter is one router, its front and a client of it.
type tailRouter struct {
	r      *router.Router
	srv    *server.Server
	reg    *prometheus.Registry
	client bench.Inferer
	conn   *grpc.ClientConn
}

// tailRow is one scenario's run.
type tailRow struct {
	name       string
	res        bench.Result
	extra      float64 // extra shard calls per first call
	overBudget float64 // hedges not sent: the budget was spent
}

func runTail(ctx context.Context, o tailOptions) error {
	choice, ok := hedge.ParseChoice(o.choice)
	if !ok {
		return fmt.Errorf("--replica-choice %q: want least-loaded or rotation", o.choice)
	}
	if _, err := shard.ParseFaults(o.fault); err != nil || o.fault == "" {
		return fmt.Errorf("--fault %q: %v", o.fault, err)
	}
	if o.shards < 2 || o.rounds < 1 || o.requests < 1 {
		return errors.New("--shards must be at least 2 (replicas 2), --rounds and --requests at least 1")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "cumulus-tail-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	repo := filepath.Join(dir, "repo")
	spec, err := o.shape.spec("bench", o.params, 7)
	if err != nil {
		return err
	}
	fmt.Printf("generating %s model: %d features\n", spec.Shape, o.params)
	m, err := (loader.Repo{Dir: repo}).Generate(spec)
	if err != nil {
		return err
	}
	etcd, err := etcdlocal.Start(filepath.Join(dir, "etcd"), nil)
	if err != nil {
		return err
	}
	defer etcd.Close()
	cli, err := etcdClient(context.Background(), etcd.Endpoint, tlsconf.Files{})
	if err != nil {
		return err
	}
	defer cli.Close()
	mgr, err := manager.Start(ctx, manager.Options{Repo: loader.Repo{Dir: repo}, Etcd: cli, Replicas: 2, ScanInterval: time.Hour})
	if err != nil {
		return err
	}
	defer mgr.Close()

	token := rand.Text()
	var shards []*tailShard
	defer func() {
		for _, s := range shards {
			s.cmd.Process.Kill()
			<-s.exited
		}
	}()
	for i := range o.shards {
		s, err := startTailShard(ctx, exe, fmt.Sprintf("shard-%d", i), repo, etcd.Endpoint, filepath.Join(dir, fmt.Sprintf("shard-%d", i)), token)
		if err != nil {
			return err
		}
		shards = append(shards, s)
	}
	routers := map[bool]*tailRouter{}
	defer func() {
		for _, tr := range routers {
			tr.conn.Close()
			tr.srv.Close()
			tr.r.Close()
		}
	}()
	for _, hedged := range []bool{true, false} {
		reg := prometheus.NewRegistry()
		r, err := router.Start(ctx, router.Options{Etcd: cli, Registry: reg,
			Hedge: router.HedgeOptions{Off: !hedged, Delay: o.hedgeDelay, Budget: o.hedgeBudget, Choice: choice}})
		if err != nil {
			return err
		}
		srv, err := server.Start(server.Options{Predictor: r, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Registry: reg})
		if err != nil {
			r.Close()
			return err
		}
		conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			srv.Close()
			r.Close()
			return err
		}
		routers[hedged] = &tailRouter{r: r, srv: srv, reg: reg, conn: conn, client: bench.NewRoundRobin(kserveClient(conn))}
	}
	if err := awaitTail(ctx, shards, routers); err != nil {
		return err
	}
	fmt.Printf("%d shard processes, replicas 2, %d partitions; rank200, concurrency %d, %d requests per run; straggler: shard-0 with %q\n",
		o.shards, m.Partitions, o.concurrency, o.requests, o.fault)

	run := func(name string, hedged bool, during func()) (tailRow, error) {
		g, err := bench.ForModel(bench.Workloads["rank200"], m, 42)
		if err != nil {
			return tailRow{}, err
		}
		tr := routers[hedged]
		before := routerCalls(tr.reg)
		if during != nil {
			go during()
		}
		res := bench.Run(ctx, bench.LoadOptions{Client: tr.client, Model: "bench", Generator: g, Concurrency: o.concurrency,
			Duration: time.Hour, MaxRequests: o.requests})
		after := routerCalls(tr.reg)
		row := tailRow{name: name, res: res}
		if first := after.first - before.first; first > 0 {
			row.extra = (after.extra - before.extra) / first
		}
		row.overBudget = after.overBudget - before.overBudget
		return row, ctx.Err()
	}
	setFault := func(spec string) error { return putFault(shards[0].http, token, spec) }

	var rows []tailRow
	const row = "%-24s %9s %7s %9s %9s %9s %12s %12s  %s\n"
	header := func() {
		fmt.Printf(row, "scenario", "requests", "qps", "p50", "p99", "p99.9", "extra calls", "over budget", "errors")
	}
	print := func(r tailRow) {
		fmt.Printf(row, r.name, fmt.Sprint(r.res.Requests), fmt.Sprintf("%.0f", r.res.QPS()), ms(r.res.P50), ms(r.res.P99), ms(r.res.P999),
			fmt.Sprintf("%.2f%%", 100*r.extra), fmt.Sprint(r.overBudget), errorsByCode(r.res))
	}
	header()
	scenarios := []struct {
		name   string
		hedged bool
		fault  string
	}{
		{"no fault, hedged", true, ""},
		{"no fault, unhedged", false, ""},
		{"straggler, unhedged", false, o.fault},
		{"straggler, hedged", true, o.fault},
	}
	var hedgedTook time.Duration
	for range o.rounds {
		for _, sc := range scenarios {
			if err := setFault(sc.fault); err != nil {
				return err
			}
			row, err := run(sc.name, sc.hedged, nil)
			if err != nil {
				return err
			}
			if sc.name == "no fault, hedged" && hedgedTook == 0 {
				hedgedTook = row.res.Elapsed
			}
			rows = append(rows, row)
			print(row)
		}
	}
	if err := setFault(""); err != nil {
		return err
	}
	killAfter := o.killAfter
	if killAfter == 0 {
		killAfter = hedgedTook / 3
	}
	killed := make(chan struct{})
	killRow, err := run("shard-0 killed, hedged", true, func() {
		defer close(killed)
		select {
		case <-time.After(killAfter):
		case <-ctx.Done():
			return
		}
		shards[0].cmd.Process.Signal(syscall.SIGKILL)
	})
	<-killed
	if err != nil {
		return err
	}
	rows = append(rows, killRow)
	print(killRow)
	fmt.Printf("(shard-0 killed with SIGKILL %s into the run)\n", killAfter.Round(time.Millisecond))

	if o.rounds > 1 {
		fmt.Printf("\nmedian of %d rounds:\n", o.rounds)
		header()
		for _, sc := range scenarios {
			print(medianRow(rows, sc.name))
		}
	}
	med := map[string]tailRow{}
	for _, sc := range scenarios {
		med[sc.name] = medianRow(rows, sc.name)
	}
	nf, nfu, su, sh := med["no fault, hedged"], med["no fault, unhedged"], med["straggler, unhedged"], med["straggler, hedged"]
	fmt.Printf("\nstraggler p99.9 over no-fault p99.9: hedged %.2fx, unhedged %.2fx\n", ratio(sh.res.P999, nf.res.P999), ratio(su.res.P999, nf.res.P999))
	fmt.Printf("no fault, hedging on vs off: qps %.3fx, p99 %.3fx\n", nf.res.QPS()/nfu.res.QPS(), ratio(nf.res.P99, nfu.res.P99))
	fmt.Printf("shard-0 killed: %d of %d requests failed\n", killRow.res.Errors, killRow.res.Errors+killRow.res.Requests)
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2fms", float64(d)/1e6) }

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func errorsByCode(r bench.Result) string {
	if r.Errors == 0 {
		return "0"
	}
	var parts []string
	for _, c := range slices.Sorted(maps.Keys(r.ErrorCodes)) {
		parts = append(parts, fmt.Sprintf("%s:%d", c, r.ErrorCodes[c]))
	}
	return strings.Join(parts, " ")
}

// medianRow is, for scenario name, the median of its rows' figures, each
// taken on its own.
func medianRow(rows []tailRow, name string) tailRow {
	var runs []tailRow
	for _, r := range rows {
		if r.name == name {
			runs = append(runs, r)
		}
	}
	out := tailRow{name: name, res: bench.Result{ErrorCodes: map[string]int{}}}
	if len(runs) == 0 {
		return out
	}
	mid := func(f func(tailRow) float64) float64 {
		v := make([]float64, len(runs))
		for i, r := range runs {
			v[i] = f(r)
		}
		return median(v)
	}
	d := func(f func(bench.Result) time.Duration) time.Duration {
		return time.Duration(mid(func(r tailRow) float64 { return float64(f(r.res)) }))
	}
	out.res.Requests = int(mid(func(r tailRow) float64 { return float64(r.res.Requests) }))
	out.res.Elapsed = time.Duration(float64(out.res.Requests) / mid(func(r tailRow) float64 { return r.res.QPS() }) * 1e9)
	out.res.P50 = d(func(r bench.Result) time.Duration { return r.P50 })
	out.res.P99 = d(func(r bench.Result) time.Duration { return r.P99 })
	out.res.P999 = d(func(r bench.Result) time.Duration { return r.P999 })
	out.extra = mid(func(r tailRow) float64 { return r.extra })
	out.overBudget = mid(func(r tailRow) float64 { return r.overBudget })
	for _, r := range runs {
		out.res.Errors += r.res.Errors
		for c, n := range r.res.ErrorCodes {
			out.res.ErrorCodes[c] += n
		}
	}
	return out
}

// callCounts are a router's shard calls so far: first calls, extra ones
// (hedges and retries on another replica), and hedges the budget held
// back.
type callCounts struct{ first, extra, overBudget float64 }

func routerCalls(reg *prometheus.Registry) callCounts {
	mfs, _ := reg.Gather()
	var all, extra, over float64
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			label := func(name string) string {
				for _, l := range m.GetLabel() {
					if l.GetName() == name {
						return l.GetValue()
					}
				}
				return ""
			}
			switch mf.GetName() {
			case "cumulus_router_shard_call_seconds":
				all += float64(m.GetHistogram().GetSampleCount())
			case "cumulus_router_hedges_total":
				switch label("outcome") {
				case "sent":
					extra += m.GetCounter().GetValue()
				case "over_budget":
					over += m.GetCounter().GetValue()
				}
			case "cumulus_router_retries_total":
				if label("kind") == "replica" {
					extra += m.GetCounter().GetValue()
				}
			}
		}
	}
	return callCounts{first: all - extra, extra: extra, overBudget: over}
}

// startTailShard starts a shard process and reads its HTTP address from
// what it prints.
func startTailShard(ctx context.Context, exe, id, repo, etcd, dataDir, token string) (*tailShard, error) {
	cmd := exec.CommandContext(ctx, exe, "shard", "--id", id, "--repo", repo, "--etcd", etcd, "--data-dir", dataDir,
		"--addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), adminTokenEnv+"="+token)
	cmd.Stderr = io.Discard
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the bench
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &tailShard{id: id, cmd: cmd, exited: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "http: http://"); ok {
				addr <- a
			}
		}
		io.Copy(io.Discard, out)
	}()
	go func() { cmd.Wait(); close(s.exited) }()
	select {
	case s.http = <-addr:
		return s, nil
	case <-s.exited:
		return nil, fmt.Errorf("shard %s exited at start: %v", id, cmd.ProcessState)
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-s.exited
		return nil, fmt.Errorf("shard %s printed no HTTP address in 30s", id)
	}
}

// awaitTail waits until every shard is ready and both routers can serve.
func awaitTail(ctx context.Context, shards []*tailShard, routers map[bool]*tailRouter) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ready := true
		for _, s := range shards {
			resp, err := http.Get("http://" + s.http + "/readyz")
			if err == nil {
				resp.Body.Close()
			}
			ready = ready && err == nil && resp.StatusCode == http.StatusOK
		}
		for _, tr := range routers {
			ready = ready && tr.r.Ready()
		}
		if ready {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("the cluster was not ready within 2 minutes")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// putFault sets a shard's faults through its HTTP surface.
func putFault(addr, token, spec string) error {
	body, _ := json.Marshal(shard.FaultBody{Spec: spec})
	req, err := http.NewRequest(http.MethodPut, "http://"+addr+"/admin/v1/fault", bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("setting shard faults: %s: %s", resp.Status, b)
	}
	return nil
}
