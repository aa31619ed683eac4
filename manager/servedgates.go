package manager

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/golden"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/router"
)

// The golden and hold-out gates score a staged version where it is
// served: a model larger than one machine can be scored nowhere else.
// Their requests go through the manager's own router (router.Options.
// Staged), the only one that routes a staged version; user-facing
// routers never do.

// gateRouter is the manager's router, started when a gate first needs
// it; the gate runner's goroutine only.
type gateRouter struct {
	ctx context.Context // the gate runner's: the router lives as long as it
	r   *router.Router
}

func (g *gateRouter) get(m *Manager) (*router.Router, error) {
	if g.r != nil {
		return g.r, nil
	}
	r, err := router.Start(g.ctx, router.Options{Etcd: m.opts.Etcd, Cluster: m.opts.Cluster, Staged: true, ShardTLS: m.opts.ShardTLS,
		ID: "gates-" + m.opts.Writer, DefaultTimeout: m.opts.GateTimeout})
	if err != nil {
		return nil, err
	}
	g.r = r
	return r, nil
}

func (g *gateRouter) close() {
	if g.r != nil {
		g.r.Close()
	}
}

// Outcomes of a gate that did not pass.
const (
	outcomeFailed = "failed" // the version's fault: it is rejected
	outcomeError  = "error"  // the gate could not run: tried again
)

// runServedGate runs the golden or the hold-out gate on version g and
// returns its outcome and reason: failed for what the version does
// (wrong scores, a worse log-loss, golden requests it does not take),
// error for what it does not (the hold-out set unreadable, the cluster
// unable to answer in time).
func (m *Manager) runServedGate(ctx context.Context, gate string, g RunGates) (outcome, reason string) {
	if gate == GateHoldout && g.Live == 0 {
		return "skipped", "no live version to compare with"
	}
	set, err := m.gateSet(gate, g)
	if err != nil {
		if gate == GateHoldout {
			return outcomeError, err.Error()
		}
		return outcomeFailed, err.Error()
	}
	r, err := m.gr.get(m)
	if err != nil {
		return outcomeError, fmt.Sprintf("the manager's router did not start: %v", err)
	}
	scores, err := score(ctx, r, set, g.Model, g.Version)
	if err != nil {
		return gateErrorOutcome(err), err.Error()
	}
	if gate == GateGolden {
		return m.compareGolden(set, scores)
	}
	live, err := score(ctx, r, set, g.Model, g.Live)
	if err != nil {
		return outcomeError, fmt.Sprintf("scoring the live version %d: %v", g.Live, err)
	}
	cand, err := set.LogLoss(scores)
	if err != nil {
		return outcomeError, err.Error()
	}
	base, err := set.LogLoss(live)
	if err != nil {
		return outcomeError, err.Error()
	}
	msg := fmt.Sprintf("mean log-loss %.6f on %d rows; live version %d's %.6f (margin %g)", cand, len(scores), g.Live, base, m.opts.HoldoutMargin)
	if !(cand <= base+m.opts.HoldoutMargin) {
		return outcomeFailed, msg
	}
	return "passed", msg
}

// gateErrorOutcome is the outcome of a gate whose requests failed with
// err: failed when the version refused them (they do not fit it), error
// otherwise.
func gateErrorOutcome(err error) string {
	if errors.Is(err, router.ErrInvalidArgument) {
		return outcomeFailed
	}
	return outcomeError
}

// gateSet reads the requests gate sends: the version's golden requests,
// or the model's hold-out set.
func (m *Manager) gateSet(gate string, g RunGates) (*golden.Set, error) {
	var b []byte
	var what string
	if gate == GateGolden {
		mf, err := m.opts.Repo.Manifest(g.Model, g.Version)
		if err != nil {
			return nil, err
		}
		if b, err = m.opts.Repo.Golden(mf); err != nil {
			return nil, err
		}
		if b == nil {
			return nil, errors.New("the version has no golden requests")
		}
		what = "golden requests"
	} else {
		path := m.opts.Holdout[g.Model]
		var err error
		if b, err = readHoldout(path); err != nil {
			return nil, fmt.Errorf("hold-out set %s: %w", path, err)
		}
		what = "hold-out set " + path
	}
	set, err := golden.Parse(b, g.Model, router.Limits{})
	if err == nil && gate == GateGolden {
		err = set.RequireWant()
	}
	if err == nil && gate == GateHoldout {
		err = set.RequireLabels()
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return set, nil
}

// readHoldout reads a hold-out set: a regular file (a pipe would block
// the gate runner), of at most codec.MaxGoldenBytes.
func readHoldout(path string) ([]byte, error) {
	return loader.ReadRegular(path, codec.MaxGoldenBytes)
}

// score sends every request of set to version v of model, in order, and
// returns the scores, row after row. The version must be routable first
// (a router that has just started has not read the map yet). A request
// that finds a shard unavailable or overloaded (restarting, say), or the
// version not routable a moment, is sent again after a pause, within
// ctx: a gate judges the version, not the cluster's passing trouble.
func score(ctx context.Context, r *router.Router, set *golden.Set, model string, v uint64) ([]float32, error) {
	out := make([]float32, 0, set.Rows())
	for _, c := range set.Cases {
		req := *c.Req
		req.Version = v
		for {
			if err := r.WaitRoutable(ctx, model, v); err != nil {
				return nil, fmt.Errorf("the manager's router could not route version %d: %v", v, err)
			}
			resp, err := r.Predict(ctx, &req)
			if err == nil {
				if len(resp.Scores) != req.Rows() {
					return nil, fmt.Errorf("line %d: %d scores for %d rows", c.Line, len(resp.Scores), req.Rows())
				}
				out = append(out, resp.Scores...)
				break
			}
			if !errors.Is(err, router.ErrUnavailable) && !errors.Is(err, router.ErrResourceExhausted) && !errors.Is(err, router.ErrNotFound) {
				return nil, fmt.Errorf("line %d: %w", c.Line, err)
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("line %d: %w (until the gate's time ran out)", c.Line, err)
			case <-time.After(gateRetryPause):
			}
		}
	}
	return out, nil
}

// gateRetryPause is how long a gate's request waits before it is sent
// again after a transient failure.
const gateRetryPause = 100 * time.Millisecond

// compareGolden checks every served score against its want.
func (m *Manager) compareGolden(set *golden.Set, scores []float32) (outcome, reason string) {
	tol := m.opts.GoldenTolerance
	var worst float64
	bad, i := 0, 0
	first := ""
	for _, c := range set.Cases {
		for row, want := range c.Want {
			got := float64(scores[i])
			i++
			d := math.Abs(got - want)
			if !(d <= tol) { // a NaN score fails
				if bad == 0 {
					first = fmt.Sprintf("line %d row %d: served %.7g, want %.7g", c.Line, row, got, want)
				}
				bad++
			}
			if !(d <= worst) {
				worst = d
			}
		}
	}
	if bad > 0 {
		return "failed", fmt.Sprintf("%d of %d scores off by more than %g; first %s", bad, len(scores), tol, first)
	}
	return "passed", fmt.Sprintf("%d requests, %d scores within %g (largest difference %.2g)", len(set.Cases), len(scores), tol, worst)
}
