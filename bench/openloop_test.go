package bench_test

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/internal/devcluster/devclustertest"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/server"
	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// An open-loop run at a low rate against a real cluster: every offered
// request is accounted for once, and the answers are OK.
func TestOpenLoopAgainstDevCluster(t *testing.T) {
	dir := t.TempDir()
	m, err := loader.Repo{Dir: dir}.Generate(loader.GenSpec{Name: "b", Shape: model.Shape{Type: model.LR}, Params: 10000, Partitions: 4, Seed: 2})
	if err != nil {
		t.Fatal(err)
	}
	c := devclustertest.Start(t, devcluster.Options{Repo: dir, Shards: 2, ScanInterval: time.Hour})
	s, err := server.Start(server.Options{Predictor: c.Router, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Registry: nopRegistry{}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	g, _ := bench.NewGenerator(bench.Workloads["rank200"], *m.Generator, m.Params, 3)
	res, err := bench.OpenLoop(context.Background(), bench.OpenLoopOptions{Client: dial(t, s.GRPCAddr()), Model: "b", Generator: g,
		Rate: 20, Duration: time.Second, Timeout: 20 * time.Second, Distinct: 4})
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, res, 20)
	if res.OK == 0 || res.Good > res.OK || res.IDsPerRequest != 20400 {
		t.Fatalf("result %+v", res)
	}
	if !(0 < res.P50 && res.P50 <= res.P99 && res.P99 <= res.P999) {
		t.Fatalf("quantiles p50 %s p99 %s p999 %s", res.P50, res.P99, res.P999)
	}
}

// Refusals count as refused, not as OK nor as errors, with their pushback.
func TestOpenLoopCountsRefusals(t *testing.T) {
	client := fakeServer(t, func(ctx context.Context) error {
		grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", "50"))
		return status.Error(codes.ResourceExhausted, "overloaded")
	})
	res, err := bench.OpenLoop(context.Background(), bench.OpenLoopOptions{Client: client, Model: "m", Generator: smallGenerator(t),
		Rate: 50, Duration: 200 * time.Millisecond, Timeout: 20 * time.Second, Distinct: 2})
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, res, 10)
	if res.Refused != 10 || res.Pushback != 10 || res.OK != 0 || res.Good != 0 || res.ErrorCount() != 0 {
		t.Fatalf("result %+v", res)
	}
	if !(0 < res.RefusalP50 && res.RefusalP50 <= res.RefusalP99 && res.RefusalP99 <= res.RefusalMax) || res.P50 != 0 {
		t.Fatalf("result %+v", res)
	}
}

// A request answered Unavailable is resent with --retry-unavailable and
// counts once, as OK; without, it is an Unavailable error.
func TestRetryUnavailable(t *testing.T) {
	for _, retry := range []bool{false, true} {
		var calls atomic.Int64
		client := fakeServer(t, func(context.Context) error {
			if calls.Add(1) == 1 {
				return status.Error(codes.Unavailable, "restarting")
			}
			return nil
		})
		res, err := bench.OpenLoop(context.Background(), bench.OpenLoopOptions{Client: client, Model: "m", Generator: smallGenerator(t),
			Rate: 50, Duration: 200 * time.Millisecond, Timeout: 20 * time.Second, Distinct: 2, RetryUnavailable: retry})
		if err != nil {
			t.Fatal(err)
		}
		checkCounts(t, res, 10)
		want := map[bool][3]int{false: {9, 1, 0}, true: {10, 0, 1}}[retry]
		if res.OK != want[0] || res.Errors["Unavailable"] != want[1] || res.Retries != want[2] || res.RetryUnavailable != retry {
			t.Errorf("retry %v: ok %d, errors %v, retries %d; want ok, Unavailable, retries %v", retry, res.OK, res.Errors, res.Retries, want)
		}

		calls.Store(0)
		closed := bench.Run(context.Background(), bench.LoadOptions{Client: client, Model: "m", Generator: smallGenerator(t),
			Concurrency: 1, Duration: time.Minute, MaxRequests: 5, Distinct: 2, RetryUnavailable: retry})
		want = map[bool][3]int{false: {4, 1, 0}, true: {5, 0, 1}}[retry]
		if closed.Requests != want[0] || closed.Errors != want[1] || closed.Retries != want[2] {
			t.Errorf("closed loop, retry %v: requests %d, errors %d, retries %d; want %v", retry, closed.Requests, closed.Errors, closed.Retries, want)
		}
	}
}

// A client gives up on a request after MaxRetries resends.
func TestRetryUnavailableGivesUp(t *testing.T) {
	var calls atomic.Int64
	client := fakeServer(t, func(context.Context) error {
		calls.Add(1)
		return status.Error(codes.Unavailable, "down")
	})
	res, err := bench.OpenLoop(context.Background(), bench.OpenLoopOptions{Client: client, Model: "m", Generator: smallGenerator(t),
		Rate: 10, Duration: 100 * time.Millisecond, Timeout: 20 * time.Second, Distinct: 1, RetryUnavailable: true})
	if err != nil {
		t.Fatal(err)
	}
	checkCounts(t, res, 1)
	if res.Errors["Unavailable"] != 1 || res.Retries != bench.MaxRetries || calls.Load() != 1+bench.MaxRetries {
		t.Fatalf("errors %v, retries %d, calls %d", res.Errors, res.Retries, calls.Load())
	}
}

func TestOpenLoopValidate(t *testing.T) {
	client := kservepb.NewGRPCInferenceServiceClient(nil)
	for _, o := range []bench.OpenLoopOptions{
		{Client: client, Generator: smallGenerator(t)},
		{Client: client, Generator: smallGenerator(t), Rate: -1},
		{Client: client, Rate: 10},
		{Client: client, Generator: smallGenerator(t), Rate: 10, Timeout: -time.Second},
	} {
		if _, err := bench.OpenLoop(context.Background(), o); err == nil {
			t.Errorf("%+v: no error", o)
		}
	}
}

// checkCounts checks that every offered request is counted exactly once.
func checkCounts(t *testing.T, r bench.OpenResult, offered int) {
	t.Helper()
	if r.Offered != offered || r.OK+r.Refused+r.ErrorCount()+r.ClientDropped != r.Offered {
		t.Fatalf("offered %d (want %d), ok %d, refused %d, errors %v, client-dropped %d", r.Offered, offered, r.OK, r.Refused, r.Errors, r.ClientDropped)
	}
}

func smallGenerator(t *testing.T) *bench.Generator {
	g, err := bench.NewGenerator(bench.Workloads["small"], codec.GenInfo{Seed: 1, IDs: "hashed"}, 1000, 1)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func dial(t *testing.T, addr string) kservepb.GRPCInferenceServiceClient {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return kservepb.NewGRPCInferenceServiceClient(conn)
}

// fakeServer serves KServe ModelInfer on loopback, answering each call
// with answer's error, or an empty response when it returns nil.
func fakeServer(t *testing.T, answer func(context.Context) error) kservepb.GRPCInferenceServiceClient {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	kservepb.RegisterGRPCInferenceServiceServer(s, fakeInference{answer: answer})
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return dial(t, lis.Addr().String())
}

type fakeInference struct {
	kservepb.UnimplementedGRPCInferenceServiceServer
	answer func(context.Context) error
}

func (f fakeInference) ModelInfer(ctx context.Context, _ *kservepb.ModelInferRequest) (*kservepb.ModelInferResponse, error) {
	if err := f.answer(ctx); err != nil {
		return nil, err
	}
	return &kservepb.ModelInferResponse{}, nil
}

func TestOpenResultPrint(t *testing.T) {
	r := bench.OpenResult{Rate: 2000, Duration: 15 * time.Second, Timeout: 2 * time.Second, Offered: 30000, OK: 27000, Good: 27000,
		Refused: 2500, Pushback: 2500, Errors: map[string]int{"Unavailable": 100, "DeadlineExceeded": 400},
		P50: 3 * time.Millisecond, P99: 40 * time.Millisecond, P999: 1900 * time.Millisecond,
		RefusalP50: 80 * time.Microsecond, RefusalP99: 600 * time.Microsecond, RefusalMax: 2 * time.Millisecond,
		SendLagP99: 20 * time.Microsecond, SendLagMax: time.Millisecond, PeakOutstanding: 3900, MaxOutstanding: 4416, RequestBytes: 163505, IDsPerRequest: 20400}
	var b strings.Builder
	r.Print(&b, "rank200")
	want := `rank200  offered=30000 rate=2000/s ok=27000 goodput=1800/s refused=2500 errors={DeadlineExceeded:400,Unavailable:100} client_dropped=0 p50=3ms p99=40ms p999=1.9s (accepted) refusal_p50=80µs refusal_p99=600µs refusal_max=2ms
rank200  client: timeout=2s send_lag_p99=20µs send_lag_max=1ms peak_outstanding=3900 max_outstanding=4416 req_bytes=163505 ids/req=20400
rank200  refusals with pushback (grpc-retry-pushback-ms, or Retry-After over REST): 2500 of 2500
`
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}
