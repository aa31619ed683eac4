package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// LoadOptions configure a closed-loop load run.
type LoadOptions struct {
	Client      Inferer // gRPC or REST
	Model       string
	Generator   *Generator
	Concurrency int           // callers, each with one request in flight; default 4
	Duration    time.Duration // default 10s
	MaxRequests int           // stop after this many; 0 means no bound but Duration
	Distinct    int           // distinct pre-built requests cycled through; default 64
	Timeout     time.Duration // each request's deadline; 0 means none but the run's

	// RetryUnavailable sends a request answered Unavailable again, up to
	// MaxRetries times; default off.
	RetryUnavailable bool
}

// Result is what a load run measured.
type Result struct {
	Requests       int
	Errors         int
	Refused        int            // of Errors, ResourceExhausted: refused as overload
	ErrorCodes     map[string]int // Errors by gRPC code
	FirstError     error
	Elapsed        time.Duration
	P50, P99, P999 time.Duration
	RequestBytes   int // mean request size on the wire: the protobuf message, or the REST body
	IDsPerRequest  int

	RetryUnavailable bool // whether requests answered Unavailable were resent
	Retries          int  // resends; a request resent and then answered counts once in Requests
}

// QPS is completed requests per second.
func (r Result) QPS() float64 { return float64(r.Requests) / r.Elapsed.Seconds() }

// Print writes a one-line summary.
func (r Result) Print(w io.Writer, workload string) {
	fmt.Fprintf(w, "%-8s requests=%d errors=%d refused=%d qps=%.0f p50=%s p99=%s p999=%s req_bytes=%d ids/req=%d\n",
		workload, r.Requests, r.Errors, r.Refused, r.QPS(), r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond),
		r.P999.Round(time.Microsecond), r.RequestBytes, r.IDsPerRequest)
	if r.RetryUnavailable {
		fmt.Fprintf(w, "%-8s retries=%d (Unavailable, up to %d per request)\n", workload, r.Retries, MaxRetries)
	}
	if r.FirstError != nil {
		fmt.Fprintf(w, "%-8s first error: %v\n", workload, r.FirstError)
	}
}

// fill gives zero fields their documented defaults.
func (o *LoadOptions) fill() {
	if o.Concurrency == 0 {
		o.Concurrency = 4
	}
	if o.Duration == 0 {
		o.Duration = 10 * time.Second
	}
	if o.Distinct == 0 {
		o.Distinct = 64
	}
}

// Run drives load until Duration passes or MaxRequests complete.
func Run(ctx context.Context, o LoadOptions) Result {
	o.fill()
	reqs := prebuild(o.Generator, o.Model, o.Distinct, o.Client)
	ctx, cancel := context.WithTimeout(ctx, o.Duration)
	defer cancel()
	deadline, _ := ctx.Deadline()
	// gRPC's deadline timer may fire just before ctx's, so the run's end
	// is judged by the clock, not by ctx.Err().
	over := func() bool { return ctx.Err() != nil || !time.Now().Before(deadline) }
	var (
		mu       sync.Mutex
		lat      []time.Duration
		errs     int
		codesOf  = map[string]int{}
		refused  int
		firstErr error
		issued   int
		retries  int
	)
	take := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if o.MaxRequests > 0 && issued >= o.MaxRequests {
			return false
		}
		issued++
		return true
	}
	start := time.Now()
	var wg sync.WaitGroup
	for c := range o.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			resends := 0
			for i := c; !over() && take(); i++ {
				t0 := time.Now()
				resent, err := o.call(ctx, reqs.get(i))
				d := time.Since(t0)
				resends += resent
				if err != nil {
					if over() {
						break // the run's deadline, not a failure
					}
					mu.Lock()
					errs++
					codesOf[status.Code(err).String()]++
					if status.Code(err) == codes.ResourceExhausted {
						refused++
					}
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					continue
				}
				mine = append(mine, d)
			}
			mu.Lock()
			lat = append(lat, mine...)
			retries += resends
			mu.Unlock()
		}()
	}
	wg.Wait()
	r := Result{Requests: len(lat), Errors: errs, ErrorCodes: codesOf, Refused: refused, FirstError: firstErr, Elapsed: time.Since(start),
		RequestBytes: reqs.meanBytes, IDsPerRequest: reqs.ids, RetryUnavailable: o.RetryUnavailable, Retries: retries}
	if len(lat) > 0 {
		slices.Sort(lat)
		r.P50, r.P99, r.P999 = quantile(lat, 0.50), quantile(lat, 0.99), quantile(lat, 0.999)
	}
	return r
}

// call sends one request of a closed-loop run, under its own deadline
// when the run sets one.
func (o LoadOptions) call(ctx context.Context, req *kservepb.ModelInferRequest) (resent int, err error) {
	if o.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Timeout)
		defer cancel()
	}
	return send(ctx, o.Client, req, o.RetryUnavailable)
}
