package bench

import (
	"context"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// OpenLoopOptions configure an open-loop run: requests are offered at a
// fixed rate whether or not earlier ones were answered, as traffic from
// many independent users arrives.
type OpenLoopOptions struct {
	Client    Inferer // gRPC or REST
	Model     string
	Generator *Generator
	Rate      float64       // requests offered per second; required
	Duration  time.Duration // how long requests are offered; default 10s
	Timeout   time.Duration // each request's deadline, from its scheduled send time; default 2s
	Distinct  int           // distinct pre-built requests cycled through; default 64

	// MaxOutstanding bounds the requests in flight; a request due when
	// MaxOutstanding are is not sent and counts as client-dropped.
	// Default 1.1 × Rate × Timeout + 16: room for every request to run
	// until its deadline.
	MaxOutstanding int

	// RetryUnavailable sends a request answered Unavailable again, within
	// its deadline, up to MaxRetries times; default off.
	RetryUnavailable bool
}

// Validate reports options a run cannot use.
func (o OpenLoopOptions) Validate() error {
	switch {
	case o.Client == nil || o.Generator == nil:
		return fmt.Errorf("bench: open loop needs a client and a generator")
	case !(o.Rate > 0) || math.IsInf(o.Rate, 0):
		return fmt.Errorf("bench: open-loop rate %v: give requests per second > 0", o.Rate)
	case o.Duration < 0 || o.Timeout < 0 || o.Distinct < 0 || o.MaxOutstanding < 0:
		return fmt.Errorf("bench: negative duration, timeout, distinct or max outstanding")
	}
	return nil
}

func (o *OpenLoopOptions) ensureDefaults() {
	if o.Duration == 0 {
		o.Duration = 10 * time.Second
	}
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Second
	}
	if o.Distinct == 0 {
		o.Distinct = 64
	}
	if o.MaxOutstanding == 0 {
		o.MaxOutstanding = int(math.Ceil(1.1*o.Rate*o.Timeout.Seconds())) + 16
	}
}

// OpenResult is what an open-loop run measured. Every offered request is
// exactly one of OK, Refused, an error of Errors, or ClientDropped.
// Latencies run from a request's scheduled send time, so a client or
// server that falls behind shows in them (no coordinated omission).
type OpenResult struct {
	Rate             float64
	Duration         time.Duration // the time requests were offered over: less than asked if ctx ended it
	Timeout          time.Duration
	RetryUnavailable bool

	Offered       int            // requests scheduled
	OK            int            // answered OK
	Good          int            // answered OK before their deadline
	Refused       int            // answered ResourceExhausted
	Pushback      int            // refusals carrying a grpc-retry-pushback-ms trailer (Retry-After over REST)
	Errors        map[string]int // other answers, by gRPC code name
	FirstErrors   map[string]error
	ClientDropped int // due while MaxOutstanding were in flight: never sent
	Retries       int // resends after Unavailable

	P50, P99, P999                     time.Duration // OK requests
	RefusalP50, RefusalP99, RefusalMax time.Duration

	// How the client kept up: how late requests were sent against their
	// schedule, and the most it had in flight against its bound.
	SendLagP99, SendLagMax time.Duration
	PeakOutstanding        int
	MaxOutstanding         int

	RequestBytes  int // mean request size on the wire: the protobuf message, or the REST body
	IDsPerRequest int
}

// Goodput is OK answers within their deadline per second of the run.
func (r OpenResult) Goodput() float64 { return float64(r.Good) / r.Duration.Seconds() }

// ErrorCount is the answers that were neither OK nor refusals.
func (r OpenResult) ErrorCount() int {
	n := 0
	for _, c := range r.Errors {
		n += c
	}
	return n
}

// Print writes one summary line and detail lines, each led by workload.
func (r OpenResult) Print(w io.Writer, workload string) {
	us := func(d time.Duration, have int) string {
		if have == 0 {
			return "-"
		}
		return d.Round(time.Microsecond).String()
	}
	var errs []string
	for _, code := range slices.Sorted(maps.Keys(r.Errors)) {
		errs = append(errs, fmt.Sprintf("%s:%d", code, r.Errors[code]))
	}
	fmt.Fprintf(w, "%-8s offered=%d rate=%.0f/s ok=%d goodput=%.0f/s refused=%d errors={%s} client_dropped=%d p50=%s p99=%s p999=%s (accepted) refusal_p50=%s refusal_p99=%s refusal_max=%s\n",
		workload, r.Offered, r.Rate, r.OK, r.Goodput(), r.Refused, strings.Join(errs, ","), r.ClientDropped,
		us(r.P50, r.OK), us(r.P99, r.OK), us(r.P999, r.OK),
		us(r.RefusalP50, r.Refused), us(r.RefusalP99, r.Refused), us(r.RefusalMax, r.Refused))
	fmt.Fprintf(w, "%-8s client: timeout=%s send_lag_p99=%s send_lag_max=%s peak_outstanding=%d max_outstanding=%d req_bytes=%d ids/req=%d\n",
		workload, r.Timeout, us(r.SendLagP99, r.Offered-r.ClientDropped), us(r.SendLagMax, r.Offered-r.ClientDropped),
		r.PeakOutstanding, r.MaxOutstanding, r.RequestBytes, r.IDsPerRequest)
	if r.Refused > 0 {
		fmt.Fprintf(w, "%-8s refusals with pushback (grpc-retry-pushback-ms, or Retry-After over REST): %d of %d\n", workload, r.Pushback, r.Refused)
	}
	if r.RetryUnavailable {
		fmt.Fprintf(w, "%-8s retries=%d (Unavailable, up to %d per request)\n", workload, r.Retries, MaxRetries)
	}
	for _, code := range slices.Sorted(maps.Keys(r.FirstErrors)) {
		fmt.Fprintf(w, "%-8s first %s: %v\n", workload, code, r.FirstErrors[code])
	}
}

// outcome is what became of one scheduled request. Each request's
// goroutine writes only its own, so none needs a lock.
type outcome struct {
	sent     bool
	code     codes.Code
	lat      time.Duration // from the scheduled send time to the answer
	lag      time.Duration // from the scheduled send time to the send
	late     bool          // answered OK after its deadline
	pushback bool
	resent   int
	err      error
}

// OpenLoop offers requests at o.Rate with constant spacing for
// o.Duration, each under its own deadline, and waits for every answer.
// A request falls due at start + i/Rate; one the client sends late (the
// scheduler woke late) is sent at once, and its latency still counts from
// when it was due. The run owns one goroutine per request in flight, at
// most o.MaxOutstanding, and waits for all of them; ending ctx stops the
// schedule and cancels what is in flight.
func OpenLoop(ctx context.Context, o OpenLoopOptions) (OpenResult, error) {
	if err := o.Validate(); err != nil {
		return OpenResult{}, err
	}
	o.ensureDefaults()
	reqs := prebuild(o.Generator, o.Model, o.Distinct, o.Client)
	n := int(math.Ceil(o.Rate*o.Duration.Seconds() - 1e-9))
	outs := make([]outcome, n)
	slots := make(chan struct{}, o.MaxOutstanding)
	peak := 0
	var wg sync.WaitGroup
	timer := time.NewTimer(0)
	defer timer.Stop()
	start := time.Now()
	offered := 0
schedule:
	for i := range n {
		due := start.Add(time.Duration(float64(i) * float64(time.Second) / o.Rate))
		if wait := time.Until(due); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				break schedule
			case <-timer.C:
			}
		} else if ctx.Err() != nil {
			break
		}
		offered++
		select {
		case slots <- struct{}{}:
		default:
			continue // client-dropped: outs[i].sent stays false
		}
		peak = max(peak, len(slots))
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = o.one(ctx, reqs.get(i), due)
			<-slots
		}()
	}
	offeredFor := o.Duration
	if offered < n {
		offeredFor = time.Since(start) // ctx ended the schedule
	}
	wg.Wait()
	r := tally(outs[:offered])
	r.Rate, r.Duration, r.Timeout, r.RetryUnavailable = o.Rate, offeredFor, o.Timeout, o.RetryUnavailable
	r.PeakOutstanding, r.MaxOutstanding = peak, o.MaxOutstanding
	r.RequestBytes, r.IDsPerRequest = reqs.meanBytes, reqs.ids
	return r, nil
}

// one sends a request due at due, under a deadline of due + Timeout.
func (o OpenLoopOptions) one(ctx context.Context, req *kservepb.ModelInferRequest, due time.Time) outcome {
	deadline := due.Add(o.Timeout)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var trailer metadata.MD
	out := outcome{sent: true, lag: time.Since(due)}
	out.resent, out.err = send(ctx, o.Client, req, o.RetryUnavailable, grpc.Trailer(&trailer))
	end := time.Now()
	out.lat = end.Sub(due)
	out.code = status.Code(out.err)
	out.late = out.err == nil && end.After(deadline)
	out.pushback = len(trailer.Get("grpc-retry-pushback-ms")) > 0
	return out
}

// tally counts outcomes and takes their quantiles.
func tally(outs []outcome) OpenResult {
	r := OpenResult{Offered: len(outs), Errors: map[string]int{}, FirstErrors: map[string]error{}}
	var ok, refused, lag []time.Duration
	for _, out := range outs {
		if !out.sent {
			r.ClientDropped++
			continue
		}
		lag = append(lag, out.lag)
		r.Retries += out.resent
		switch out.code {
		case codes.OK:
			r.OK++
			if !out.late {
				r.Good++
			}
			ok = append(ok, out.lat)
		case codes.ResourceExhausted:
			r.Refused++
			if out.pushback {
				r.Pushback++
			}
			refused = append(refused, out.lat)
		default:
			name := out.code.String()
			r.Errors[name]++
			if r.FirstErrors[name] == nil {
				r.FirstErrors[name] = out.err
			}
		}
	}
	for _, l := range [][]time.Duration{ok, refused, lag} {
		slices.Sort(l)
	}
	r.P50, r.P99, r.P999 = quantile(ok, 0.50), quantile(ok, 0.99), quantile(ok, 0.999)
	r.RefusalP50, r.RefusalP99, r.RefusalMax = quantile(refused, 0.50), quantile(refused, 0.99), quantile(refused, 1)
	r.SendLagP99, r.SendLagMax = quantile(lag, 0.99), quantile(lag, 1)
	return r
}

// quantile is the q-quantile of sorted latencies; 0 when there are none.
func quantile(lat []time.Duration, q float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	return lat[min(len(lat)-1, int(q*float64(len(lat))))]
}
