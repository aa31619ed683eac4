package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc/status"
)

// Call is one request of a traced run.
type Call struct {
	Start, End time.Time
	Version    uint64 // the version that answered; 0 on error
	Err        string // the gRPC code, on error
}

// Trace drives closed-loop load like Run, but keeps every call, so that
// what happened around an event (a rollout, a rollback) can be read off
// afterwards. It runs until ctx ends.
func Trace(ctx context.Context, o LoadOptions) []Call {
	o.fill()
	reqs := prebuild(o.Generator, o.Model, o.Distinct, o.Client)
	var mu sync.Mutex
	var calls []Call
	var wg sync.WaitGroup
	for c := range o.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []Call
			for i := c; ctx.Err() == nil; i++ {
				call := Call{Start: time.Now()}
				resp, err := o.Client.ModelInfer(context.WithoutCancel(ctx), reqs.get(i))
				call.End = time.Now()
				if err != nil {
					call.Err = status.Code(err).String()
				} else {
					call.Version, _ = strconv.ParseUint(resp.ModelVersion, 10, 64)
				}
				mine = append(mine, call)
			}
			mu.Lock()
			calls = append(calls, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.SortFunc(calls, func(a, b Call) int { return a.End.Compare(b.End) })
	return calls
}

// TraceOpen is Trace in open loop: requests are sent rate a second,
// evenly spaced, whether or not earlier ones were answered, as traffic
// from many users arrives; each is timed from when it was due (a server
// that falls behind shows in the latency) and has a deadline of 2s. It
// runs until ctx ends and every request sent is answered.
func TraceOpen(ctx context.Context, o LoadOptions, rate float64) []Call {
	o.fill()
	reqs := prebuild(o.Generator, o.Model, o.Distinct, o.Client)
	var mu sync.Mutex
	var calls []Call
	var wg sync.WaitGroup
	start, interval := time.Now(), time.Duration(float64(time.Second)/rate)
	t := time.NewTimer(0)
	defer t.Stop()
	for i := 0; ; i++ {
		due := start.Add(time.Duration(i) * interval)
		t.Reset(time.Until(due))
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			cctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), due.Add(2*time.Second))
			defer cancel()
			resp, err := o.Client.ModelInfer(cctx, reqs.get(i))
			call := Call{Start: due, End: time.Now()}
			if err != nil {
				call.Err = status.Code(err).String()
			} else {
				call.Version, _ = strconv.ParseUint(resp.ModelVersion, 10, 64)
			}
			mu.Lock()
			calls = append(calls, call)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.SortFunc(calls, func(a, b Call) int { return a.End.Compare(b.End) })
	return calls
}

// Window summarizes the calls that ended in some spans of time.
type Window struct {
	Requests, Failed int
	P50, P99         time.Duration
	Versions         map[uint64]int
	Codes            map[string]int // Failed by gRPC code
}

// Span is the times from From until before To.
type Span struct{ From, To time.Time }

func (s Span) holds(t time.Time) bool { return !t.Before(s.From) && t.Before(s.To) }

// Summarize reads the window [from, to) off a trace.
func Summarize(calls []Call, from, to time.Time) Window {
	return Pool(calls, []Span{{from, to}})
}

// Pool reads the calls that ended in any of spans off a trace, as one
// window: several short windows of the same kind of event, pooled, have
// enough requests for their p99 to mean something.
func Pool(calls []Call, spans []Span) Window {
	w := Window{Versions: map[uint64]int{}, Codes: map[string]int{}}
	var lat []time.Duration
	for _, c := range calls {
		if !slices.ContainsFunc(spans, func(s Span) bool { return s.holds(c.End) }) {
			continue
		}
		w.Requests++
		if c.Err != "" {
			w.Failed++
			w.Codes[c.Err]++
			continue
		}
		w.Versions[c.Version]++
		lat = append(lat, c.End.Sub(c.Start))
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		w.P50, w.P99 = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
	}
	return w
}

// Converged is how long after at the last call that ended before until
// was answered by another version than want: the time until every answer
// came from want (0 if none did after at). Calls started before at may
// still end with the old version; they count, since a client sees them.
func Converged(calls []Call, at, until time.Time, want uint64) time.Duration {
	var last time.Time
	for _, c := range calls {
		if c.Err == "" && c.Version != want && c.End.After(at) && c.End.Before(until) {
			last = c.End
		}
	}
	if last.IsZero() {
		return 0
	}
	return last.Sub(at)
}

// Print writes a window as one line.
func (w Window) Print(out io.Writer, label string) {
	fmt.Fprintf(out, "%-28s %s versions=%v%s\n", label, w.Stats(), w.Versions, w.FailedCodes())
}

// Stats is the window's requests, failures, p50 and p99, in columns.
func (w Window) Stats() string {
	return fmt.Sprintf("requests=%-6d failed=%-3d p50=%-9s p99=%-9s", w.Requests, w.Failed,
		w.P50.Round(time.Microsecond), w.P99.Round(time.Microsecond))
}

// FailedCodes is " failed by code: …" when calls failed, else "".
func (w Window) FailedCodes() string {
	if w.Failed == 0 {
		return ""
	}
	return fmt.Sprintf(" failed by code: %v", w.Codes)
}
