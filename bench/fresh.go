package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/golden"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// FreshOptions configure a freshness run: deltas published one after
// another into a repository a cluster serves from, each timed from its
// publication until every router answers from it.
type FreshOptions struct {
	Repo    loader.Repo
	Model   string
	Routers []Inferer // each router to watch, by one client
	Deltas  int       // how many; default 20
	Keys    int       // keys each delta changes; default 1,000,000
	// KeySpace is the ids the changed keys are drawn from (the model's);
	// default 2×Keys.
	KeySpace uint64
	Timeout  time.Duration // per delta, until every router serves it; default 2 minutes
	Seed     uint64
	// Golden, if positive, publishes golden requests with each delta
	// (the first delta this many, each later one its parent's, scored
	// again on its chain, as cumulus model delta does): the manager's
	// golden gate then checks every delta before it is served.
	Golden int
	// Every, if positive, publishes a delta every Every (the next at its
	// tick, or at once if serving the last took longer); 0: each as soon
	// as the last is served.
	Every time.Duration
}

// Fresh is one delta's result.
type Fresh struct {
	Version   uint64
	Publish   time.Duration   // writing it (before the clock starts)
	Served    []time.Duration // per router: from publication to its first answer from the delta
	Slowest   time.Duration
	Parameter float32 // the probe's new weight, checked exactly in every answer
}

// probeKey is the feature every delta changes, whose score tells which
// delta a router serves: the largest id, outside generated key spaces.
const probeKey = math.MaxUint64 - 1

// Freshness publishes deltas and times each from the moment publishing
// returned (the version directory renamed into place and synced) until
// every router answers a request for the probe feature from it, with the
// score the delta makes: σ(bias + w), compared exactly. It stops at the
// first wrong score or timeout.
func Freshness(ctx context.Context, o FreshOptions, progress io.Writer) ([]Fresh, error) {
	if o.Deltas == 0 {
		o.Deltas = 20
	}
	if o.Keys == 0 {
		o.Keys = 1_000_000
	}
	if o.KeySpace == 0 {
		o.KeySpace = 2 * uint64(o.Keys)
	}
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Minute
	}
	rng := rand.New(rand.NewPCG(o.Seed, 17))
	var out []Fresh
	next := time.Now()
	for i := range o.Deltas {
		if o.Every > 0 {
			if wait := time.Until(next); wait > 0 {
				select {
				case <-ctx.Done():
					return out, ctx.Err()
				case <-time.After(wait):
				}
			}
			next = next.Add(o.Every)
		}
		parent, _, err := o.Repo.DeltaParent(o.Model)
		if err != nil {
			return out, err
		}
		pm, err := o.Repo.Manifest(o.Model, parent)
		if err != nil {
			return out, err
		}
		up := &loader.Sparse{Shape: pm.Shape}
		seen := map[uint64]bool{probeKey: true}
		w := float32(i+1) / 64 // distinct per delta, exact in float32
		up.Keys = append(up.Keys, probeKey)
		up.Values = append(up.Values, w)
		up.Values = append(up.Values, make([]float32, pm.Width()-1)...)
		for len(up.Keys) < o.Keys {
			k := rng.Uint64N(o.KeySpace)
			if seen[k] {
				continue
			}
			seen[k] = true
			up.Keys = append(up.Keys, k)
			for range up.Width() {
				up.Values = append(up.Values, float32(rng.NormFloat64()*0.01))
			}
		}
		start := time.Now()
		d := loader.Delta{Upserts: up, Parent: parent, Source: "cumulus bench freshness"}
		if o.Golden > 0 {
			if d.Golden, err = freshGolden(o, rng, pm); err != nil {
				return out, err
			}
		}
		m, err := o.Repo.PublishDelta(o.Model, d)
		if err != nil {
			return out, err
		}
		published := time.Now()
		f := Fresh{Version: m.Version, Publish: published.Sub(start), Parameter: w}
		want := float32(1 / (1 + math.Exp(-(m.Bias + float64(w)))))
		for r, client := range o.Routers {
			d, err := awaitVersion(ctx, client, o.Model, m.Version, want, published, o.Timeout)
			if err != nil {
				return out, fmt.Errorf("delta %d (version %d), router %d: %w", i+1, m.Version, r+1, err)
			}
			f.Served = append(f.Served, d)
			f.Slowest = max(f.Slowest, d)
		}
		out = append(out, f)
		if progress != nil {
			fmt.Fprintf(progress, "version %d: %d keys written in %s; served by every router %s after publication (%s)\n",
				m.Version, len(up.Keys), f.Publish.Round(time.Millisecond), f.Slowest.Round(time.Millisecond), durations(f.Served))
		}
	}
	return out, nil
}

// awaitVersion asks client for the probe's score until it answers from
// version v (or a newer one), and checks that answer's score; it returns
// the time from since to that answer.
func awaitVersion(ctx context.Context, client Inferer, model string, v uint64, want float32, since time.Time, timeout time.Duration) (time.Duration, error) {
	req := &kservepb.ModelInferRequest{ModelName: model}
	for _, t := range []struct {
		name, dt string
		raw      []byte
	}{{"ids", "UINT64", RawUint64([]uint64{probeKey})}, {"row_splits", "INT64", RawUint64([]uint64{0, 1})}} {
		req.Inputs = append(req.Inputs, &kservepb.ModelInferRequest_InferInputTensor{Name: t.name, Datatype: t.dt, Shape: []int64{int64(len(t.raw) / 8)}})
		req.RawInputContents = append(req.RawInputContents, t.raw)
	}
	if p, ok := client.(preparer); ok {
		if _, err := p.Prepare(req); err != nil {
			return 0, err
		}
	}
	ctx, cancel := context.WithDeadline(ctx, since.Add(timeout))
	defer cancel()
	for {
		resp, err := client.ModelInfer(ctx, req)
		at := time.Since(since)
		if ctx.Err() != nil {
			return 0, fmt.Errorf("not served within %s (last error: %v)", timeout, err)
		}
		// A newer version may come first: the manager's compaction of v's
		// chain, which scores as v does.
		if got, perr := strconv.ParseUint(resp.GetModelVersion(), 10, 64); err == nil && perr == nil && got >= v {
			scores, err := Scores(resp)
			if err != nil {
				return 0, err
			}
			if len(scores) != 1 || scores[0] != want {
				return 0, fmt.Errorf("version %d answers %v for the probe, want exactly %v", v, scores, want)
			}
			return at, nil
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// FreshSummary is the distribution of the slowest router's time over a
// run.
type FreshSummary struct {
	N, WithinSecond      int
	Median, P90, Slowest time.Duration
}

// SummarizeFresh summarizes a run.
func SummarizeFresh(fs []Fresh) FreshSummary {
	var ds []time.Duration
	s := FreshSummary{N: len(fs)}
	for _, f := range fs {
		ds = append(ds, f.Slowest)
		if f.Slowest <= time.Second {
			s.WithinSecond++
		}
	}
	if len(ds) == 0 {
		return s
	}
	slices.Sort(ds)
	s.Median, s.P90, s.Slowest = ds[len(ds)/2], ds[(len(ds)*9)/10], ds[len(ds)-1]
	return s
}

func durations(ds []time.Duration) string {
	s := ""
	for i, d := range ds {
		if i > 0 {
			s += " "
		}
		s += d.Round(time.Millisecond).String()
	}
	return s
}

// freshGolden is the golden requests a delta is published with: its
// parent's, or, when it has none, o.Golden requests drawn from the key
// space (GateRequests), the probe among each one's features.
func freshGolden(o FreshOptions, rng *rand.Rand, parent *codec.Manifest) (*golden.Set, error) {
	b, err := o.Repo.Golden(parent)
	if err != nil {
		return nil, err
	}
	if b == nil {
		b, err = GateRequests(rng, o.Golden, o.KeySpace, false)
		if err != nil {
			return nil, err
		}
	}
	return golden.Parse(b, o.Model, router.Limits{})
}

// GateRequests is a file of n requests for the gates (package golden),
// each of 10 rows of 20 features drawn from [0, keySpace) and the probe
// feature shared; with labels, each row labeled 0 or 1 at random.
func GateRequests(rng *rand.Rand, n int, keySpace uint64, labels bool) ([]byte, error) {
	reqs := make([]*router.Request, n)
	ls := make([][]float64, n)
	for i := range reqs {
		req := &router.Request{RowSplits: []int64{0}, SharedIDs: []uint64{probeKey}}
		for range 10 {
			for range 20 {
				req.IDs = append(req.IDs, rng.Uint64N(keySpace))
			}
			req.RowSplits = append(req.RowSplits, int64(len(req.IDs)))
			ls[i] = append(ls[i], float64(rng.IntN(2)))
		}
		reqs[i] = req
	}
	label := golden.None
	if labels {
		label = func(i int) []float64 { return ls[i] }
	}
	return golden.Lines(reqs, golden.None, label)
}
