package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/devcluster"
)

func benchHostileCommand() *cobra.Command {
	var (
		addr, httpAddr, modelName, repo string
		shape                           shapeFlags
		params                          int64
		shards, pid, rounds             int
		sizes                           bench.HostileSizes
		o                               bench.HostileOptions
		load                            bench.LoadOptions
		slow                            bench.SlowOptions
	)
	cmd := &cobra.Command{
		Use:   "hostile",
		Short: "Measure what hostile inputs cost a router: CPU and memory per request, and good traffic's p99 beside them",
		Long: `hostile builds three hostile requests once, before measuring:

  deep-json  a JSON infer body whose data is nested --depth arrays deep
  big-json   a JSON infer body of --json-bytes: a long array of valid ids,
             the last element 1.5
  big-grpc   a gRPC ModelInferRequest of --grpc-bytes, ids as raw contents

It sends each --repeat times, one after another, and prints the answers,
client-side latency, the server's CPU time per request (utime+stime of
/proc/PID/stat over the sends, divided by them; a clock tick is 10ms) and
its VmRSS before and at peak (read every 10ms while sending), against the
targets: under 50ms of CPU and under twice the input's size in memory.

Then it runs rank200 closed-loop load (--concurrency, --duration) alone,
and again while one goroutine sends the hostile requests in turn, one at
a time, back to back; it prints both p99s and their ratio (target: under
2) and what was sent.

With --slow grpc or --slow http it measures slow senders instead:
--streams requests held in reception at once from --slow-from (another
loopback address, so that the router can tell them from the good
client), each announcing --announce bytes (a gRPC message's length
prefix, an HTTP body's Content-Length) and sending one byte every
--every, opened again whenever one is answered. With --burst N, a gRPC
stream first sends N bytes of its message as fast as the router's
flow-control windows allow (a half-sent message, stalled). It runs the good client
alone, then beside them, --rounds times, and prints its QPS, p99 and
refusals, both runs' router RSS, and the targets, read from the medians
of the rounds: QPS at least 90% of alone, p99 at most twice, nothing
refused, peak RSS at most 64 MiB over alone's.

With --addr (gRPC), --http-addr and --pid (the router's process) it
targets a running router; --repo and --model name a model made by
'cumulus model gen'. Without --addr, it generates a model, starts a dev
cluster in this process and targets that: then CPU and memory include the
client's.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if o.Repeat < 1 || load.Concurrency < 1 || load.Duration <= 0 || sizes.Depth < 1 || sizes.JSONBytes < 1 || sizes.GRPCBytes < 1 {
				return fmt.Errorf("--repeat, --concurrency, --duration, --depth, --json-bytes and --grpc-bytes must be positive")
			}
			if slow.Protocol != "" && slow.Protocol != "grpc" && slow.Protocol != "http" {
				return fmt.Errorf("--slow %q: give grpc or http", slow.Protocol)
			}
			if rounds < 1 {
				return fmt.Errorf("--rounds %d: give 1 or more", rounds)
			}
			if addr != "" && (httpAddr == "" || pid == 0 || repo == "" || modelName == "") {
				return fmt.Errorf("with --addr, give --http-addr, --pid (the router's process), --repo and --model")
			}
			if addr == "" {
				if httpAddr != "" || pid != 0 {
					return fmt.Errorf("--http-addr and --pid go with --addr")
				}
				lb, err := startLocalBench(ctx, shape, params, devcluster.Options{Shards: shards, ScanInterval: time.Hour})
				if err != nil {
					return err
				}
				defer lb.close()
				repo, modelName = lb.repo, lb.model
				addr, httpAddr, pid = lb.srv.GRPCAddr(), lb.srv.HTTPAddr(), os.Getpid()
				fmt.Printf("dev cluster in this process: %d shards, router at %s (gRPC), %s (HTTP)\n", shards, addr, httpAddr)
			}
			m, err := generatedModel(repo, modelName)
			if err != nil {
				return err
			}
			if slow.Protocol != "" {
				slow.Addr, slow.Model = addr, modelName
				if slow.Protocol == "http" {
					slow.Addr = httpAddr
				}
				return slowBeside(ctx, addr, load, slow, m, pid, rounds)
			}
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return err
			}
			defer conn.Close()
			o.PID = pid
			o.Target = bench.HostileTarget{HTTPAddr: httpAddr, Conn: conn, Model: modelName,
				HTTP: &http.Client{Transport: &http.Transport{}}}
			t0 := time.Now()
			inputs := bench.HostileInputs(modelName, sizes)
			fmt.Printf("built %d hostile inputs in %s\n", len(inputs), time.Since(t0).Round(time.Millisecond))
			if pid == os.Getpid() {
				fmt.Printf("pid %d is this process: CPU and RSS are the dev cluster's, the router's and this client's together\n", pid)
			} else {
				fmt.Printf("pid %d: CPU and RSS are that whole process's\n", pid)
			}
			fmt.Printf("\nhostile inputs, each sent %d times, one after another (router %s gRPC, %s HTTP)\n", o.Repeat, addr, httpAddr)
			for _, h := range inputs {
				bench.MeasureHostile(ctx, o, h).Print(os.Stdout)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}

			load.Model, load.Client = modelName, kserveClient(conn)
			return goodBeside(ctx, load, o.Target, inputs, m)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "", "router gRPC address (default: start a dev cluster in this process)")
	cmd.Flags().StringVar(&httpAddr, "http-addr", "", "with --addr: the router's HTTP address")
	cmd.Flags().IntVar(&pid, "pid", 0, "with --addr: the router's process, whose CPU time and VmRSS are read from /proc")
	cmd.Flags().StringVar(&modelName, "model", "", "with --addr: model name")
	cmd.Flags().StringVar(&repo, "repo", "", "with --addr: repository holding --model")
	shape.register(cmd, "without --addr: ")
	cmd.Flags().Int64Var(&params, "params", 1_000_000, "without --addr: features in the generated model")
	cmd.Flags().IntVar(&shards, "shards", 4, "without --addr: shard servers")
	cmd.Flags().IntVar(&o.Repeat, "repeat", 5, "sends of each hostile input, one after another")
	cmd.Flags().IntVar(&sizes.Depth, "depth", 9_990, "deep-json: arrays nested in its data")
	cmd.Flags().IntVar(&sizes.JSONBytes, "json-bytes", 66_000_000, "big-json: body size in bytes (the issue's hostile body; the default --max-request-bytes now refuses it from its Content-Length: shrink it, or raise that limit, to measure the decoder)")
	cmd.Flags().IntVar(&sizes.GRPCBytes, "grpc-bytes", 63<<20, "big-grpc: message size in bytes (63 MiB by default)")
	cmd.Flags().IntVar(&load.Concurrency, "concurrency", 4, "good traffic: rank200 requests in flight")
	cmd.Flags().DurationVar(&load.Duration, "duration", 5*time.Second, "good traffic: time alone, and again beside the hostile inputs")
	cmd.Flags().StringVar(&slow.Protocol, "slow", "", "grpc or http: measure slow senders instead of the hostile inputs")
	cmd.Flags().IntVar(&slow.Streams, "streams", 8, "with --slow: requests held in reception at once")
	cmd.Flags().IntVar(&slow.Announce, "announce", 1000, "with --slow: bytes each request announces (gRPC length prefix, HTTP Content-Length)")
	cmd.Flags().DurationVar(&slow.Every, "every", time.Second, "with --slow: pause between two bytes of a request")
	cmd.Flags().StringVar(&slow.Source, "slow-from", "127.0.0.2", "with --slow: local address the slow senders send from")
	cmd.Flags().IntVar(&rounds, "rounds", 1, "with --slow: rounds of the good client alone and then beside the senders, one after another; the targets are read from the medians of the rounds' ratios")
	cmd.Flags().IntVar(&slow.StreamsPerConn, "streams-per-conn", 50, "with --slow grpc: streams sharing one HTTP/2 connection")
	cmd.Flags().IntVar(&slow.Burst, "burst", 0, "with --slow grpc: bytes of its message each stream sends at once, as fast as flow control allows, before trickling (a half-sent message, stalled); less than --announce")
	return cmd
}

// slowBeside runs the good client (rank200 over gRPC at grpcAddr) alone,
// then beside slow senders, each run watched for pid's RSS, and prints
// both against the targets.
func slowBeside(ctx context.Context, grpcAddr string, load bench.LoadOptions, slow bench.SlowOptions, m *codec.Manifest, pid, rounds int) error {
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	load.Model, load.Client = m.Name, kserveClient(conn)
	gen := func() (*bench.Generator, error) {
		return bench.ForModel(bench.Workloads["rank200"], m, 42)
	}
	warm := load
	warm.MaxRequests = 200
	if warm.Generator, err = gen(); err != nil {
		return err
	}
	if r := bench.Run(ctx, warm); r.Errors > 0 {
		return fmt.Errorf("warm-up: %d of %d requests failed: %v", r.Errors, r.Errors+r.Requests, r.FirstError)
	}
	fmt.Printf("\ngood client: rank200 over gRPC, closed loop, concurrency %d, %s alone, then %s beside %d slow %s requests from %s (each announcing %d bytes, one byte every %s)\n",
		load.Concurrency, load.Duration, load.Duration, slow.Streams, slow.Protocol, slow.Source, slow.Announce, slow.Every)
	// run also reads pid's CPU time over the load, per good request:
	// beside the senders it includes what they cost the router.
	run := func(label string) (bench.Result, bench.RSS, time.Duration, error) {
		var res bench.Result
		g, err := gen()
		if err != nil {
			return res, bench.RSS{}, 0, err
		}
		l := load
		l.Generator = g
		before, cerr := bench.ReadCPUTicks(pid)
		rss := bench.WatchRSS(ctx, pid, 10*time.Millisecond, 0, func() { res = bench.Run(ctx, l) })
		after, cerr2 := bench.ReadCPUTicks(pid)
		res.Print(os.Stdout, label)
		rss.Print(os.Stdout, label)
		var cpu time.Duration
		if cerr == nil && cerr2 == nil && res.Requests > 0 {
			cpu = time.Duration(after-before) * bench.ClockTick() / time.Duration(res.Requests)
			fmt.Printf("%-8s cpu pid=%d: %s per good request\n", label, pid, cpu.Round(time.Microsecond))
		}
		return res, rss, cpu, nil
	}
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "missed"
	}
	// Rounds alternate alone and beside, so that the machine's drift
	// falls on both; the targets are read from the medians of the
	// rounds' ratios.
	var qps, p99, cpu []float64
	var refused int
	var rssGrowth int64
	for round := 1; round <= rounds; round++ {
		if rounds > 1 {
			fmt.Printf("\nround %d of %d\n", round, rounds)
		}
		alone, aloneRSS, aloneCPU, err := run("alone")
		if err != nil {
			return err
		}
		sctx, stop := context.WithCancel(ctx)
		st, wait, err := bench.RunSlow(sctx, slow)
		if err != nil {
			stop()
			return err
		}
		// Measure once every sender is in reception (or after 10s).
		for t0 := time.Now(); st.Open() < slow.Streams && time.Since(t0) < 10*time.Second && ctx.Err() == nil; {
			time.Sleep(10 * time.Millisecond)
		}
		st.Print(os.Stdout)
		beside, besideRSS, besideCPU, err := run("beside")
		st.Print(os.Stdout)
		stop()
		wait()
		if err != nil {
			return err
		}
		if alone.QPS() > 0 {
			qps = append(qps, beside.QPS()/alone.QPS())
			fmt.Printf("qps beside / alone: %.0f / %.0f = %.2f\n", beside.QPS(), alone.QPS(), qps[len(qps)-1])
		}
		if alone.P99 > 0 && beside.P99 > 0 {
			p99 = append(p99, float64(beside.P99)/float64(alone.P99))
			fmt.Printf("p99 beside / alone: %s / %s = %.2f\n", beside.P99.Round(time.Microsecond), alone.P99.Round(time.Microsecond), p99[len(p99)-1])
		}
		if aloneCPU > 0 && besideCPU > 0 {
			cpu = append(cpu, float64(besideCPU)/float64(aloneCPU))
			fmt.Printf("cpu per good request beside / alone: %s / %s = %.2f\n", besideCPU.Round(time.Microsecond), aloneCPU.Round(time.Microsecond), cpu[len(cpu)-1])
		}
		refused += beside.Refused
		fmt.Printf("good requests refused beside: %d; other errors: %d\n", beside.Refused, beside.Errors-beside.Refused)
		if aloneRSS.Peak > 0 && besideRSS.Peak > 0 {
			d := besideRSS.Peak - aloneRSS.Peak
			rssGrowth = max(rssGrowth, d)
			fmt.Printf("peak rss beside - alone: %.1f MiB\n", float64(d)/(1<<20))
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	fmt.Printf("\nover %d round(s):\n", rounds)
	if len(qps) > 0 {
		each := ratios(qps)
		m := median(qps)
		fmt.Printf("qps beside / alone, median: %.2f (rounds: %s)  [target >= 0.9: %s]\n", m, each, verdict(m >= 0.9))
	}
	if len(p99) > 0 {
		each := ratios(p99)
		m := median(p99)
		fmt.Printf("p99 beside / alone, median: %.2f (rounds: %s)  [target <= 2: %s]\n", m, each, verdict(m <= 2))
	}
	if len(cpu) > 0 {
		each := ratios(cpu)
		fmt.Printf("cpu per good request beside / alone, median: %.2f (rounds: %s)\n", median(cpu), each)
	}
	fmt.Printf("good requests refused beside: %d  [target 0: %s]\n", refused, verdict(refused == 0))
	fmt.Printf("peak rss beside - alone, largest: %.1f MiB  [target <= 64 MiB: %s]\n", float64(rssGrowth)/(1<<20), verdict(rssGrowth <= 64<<20))
	return ctx.Err()
}

// goodBeside runs rank200 load alone and then beside the hostile inputs,
// from generators of the same seed so both runs send the same requests,
// and prints both and the ratio of their p99s.
func goodBeside(ctx context.Context, load bench.LoadOptions, t bench.HostileTarget, inputs []bench.Hostile, m *codec.Manifest) error {
	gen := func() (*bench.Generator, error) {
		return bench.ForModel(bench.Workloads["rank200"], m, 42)
	}
	fmt.Printf("\ngood traffic beside them: rank200 closed loop, concurrency %d, %s alone then %s beside (after 200 requests of warm-up)\n",
		load.Concurrency, load.Duration, load.Duration)
	warm := load
	warm.MaxRequests = 200
	var err error
	if warm.Generator, err = gen(); err != nil {
		return err
	}
	if r := bench.Run(ctx, warm); r.Errors > 0 {
		return fmt.Errorf("warm-up: %d of %d requests failed: %v", r.Errors, r.Errors+r.Requests, r.FirstError)
	}
	if load.Generator, err = gen(); err != nil {
		return err
	}
	alone := bench.Run(ctx, load)
	alone.Print(os.Stdout, "alone")
	if load.Generator, err = gen(); err != nil {
		return err
	}
	beside, tally := bench.Beside(ctx, load, t, inputs)
	beside.Print(os.Stdout, "beside")
	fmt.Printf("hostile requests sent beside: %d, one at a time, back to back\n", tally.Sent())
	tally.Print(os.Stdout, inputs)
	if alone.P99 > 0 && beside.P99 > 0 {
		ratio := float64(beside.P99) / float64(alone.P99)
		verdict := "met"
		if ratio >= bench.HostileLatencyP99Ratio {
			verdict = "missed"
		}
		fmt.Printf("p99 beside / alone: %s / %s = %.2f  [target < %g: %s]\n", beside.P99.Round(time.Microsecond),
			alone.P99.Round(time.Microsecond), ratio, bench.HostileLatencyP99Ratio, verdict)
	}
	return ctx.Err()
}

// median is the middle of v (the upper one of an even count); it sorts v.
func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}

// ratios lists v as "0.91 0.95 ...", two decimals each.
func ratios(v []float64) string {
	parts := make([]string, len(v))
	for i, r := range v {
		parts[i] = fmt.Sprintf("%.2f", r)
	}
	return strings.Join(parts, " ")
}
