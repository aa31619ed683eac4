package manager

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sync"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/golden"
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
	ctx  context.Context // the gate runner's: the router lives as long as it
	once sync.Once
	r    *router.Router
	err  error
}

func (g *gateRouter) get(m *Manager) (*router.Router, error) {
	g.once.Do(func() {
		g.r, g.err = router.Start(g.ctx, router.Options{Etcd: m.opts.Etcd, Cluster: m.opts.Cluster, Staged: true,
			ID: "gates-" + m.opts.Writer, DefaultTimeout: m.opts.GateTimeout})
	})
	return g.r, g.err
}

func (g *gateRouter) close() {
	if g.r != nil {
		g.r.Close()
	}
}

// runServedGate runs the golden or the hold-out gate on version g and
// returns its outcome and reason.
func (m *Manager) runServedGate(ctx context.Context, gate string, g RunGates) (outcome, reason string) {
	set, err := m.gateSet(gate, g)
	if err != nil {
		return "failed", err.Error()
	}
	if gate == GateHoldout && g.Live == 0 {
		return "skipped", "no live version to compare with"
	}
	r, err := m.gr.get(m)
	if err != nil {
		return "failed", fmt.Sprintf("the manager's router did not start: %v", err)
	}
	if err := r.WaitRoutable(ctx, g.Model, g.Version); err != nil {
		return "failed", fmt.Sprintf("the manager's router could not route the staged version: %v", err)
	}
	scores, err := score(ctx, r, set, g.Version)
	if err != nil {
		return "failed", err.Error()
	}
	if gate == GateGolden {
		return m.compareGolden(set, scores)
	}
	if err := r.WaitRoutable(ctx, g.Model, g.Live); err != nil {
		return "failed", fmt.Sprintf("the manager's router could not route the live version %d: %v", g.Live, err)
	}
	live, err := score(ctx, r, set, g.Live)
	if err != nil {
		return "failed", fmt.Sprintf("scoring the live version %d: %v", g.Live, err)
	}
	cand, _ := set.LogLoss(scores)
	base, _ := set.LogLoss(live)
	msg := fmt.Sprintf("mean log-loss %.6f on %d rows; live version %d's %.6f (margin %g)", cand, len(scores), g.Live, base, m.opts.HoldoutMargin)
	if !(cand <= base+m.opts.HoldoutMargin) {
		return "failed", msg
	}
	return "passed", msg
}

// gateSet reads the requests gate sends: the version's golden requests,
// or the model's hold-out set.
func (m *Manager) gateSet(gate string, g RunGates) (*golden.Set, error) {
	var b []byte
	var what string
	if gate == GateGolden {
		chain, err := m.opts.Repo.Chain(g.Model, g.Version)
		if err != nil {
			return nil, err
		}
		if b, err = m.opts.Repo.Golden(chain[0]); err != nil {
			return nil, err
		}
		if b == nil {
			return nil, errors.New("the version has no golden requests")
		}
		what = "golden requests"
	} else {
		path := m.opts.Holdout[g.Model]
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("hold-out set: %w", err)
		}
		defer f.Close()
		// One byte past the limit: Parse refuses a file that long.
		if b, err = io.ReadAll(io.LimitReader(f, codec.MaxGoldenBytes+1)); err != nil {
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

// score sends every request of set to version v, in order, and returns
// the scores, row after row. A request that finds a shard unavailable or
// overloaded (restarting, say) is sent again after a pause, within ctx:
// a gate judges the version, not the cluster's passing trouble.
func score(ctx context.Context, r *router.Router, set *golden.Set, v uint64) ([]float32, error) {
	out := make([]float32, 0, set.Rows())
	for _, c := range set.Cases {
		req := *c.Req
		req.Version = v
		for {
			resp, err := r.Predict(ctx, &req)
			if err == nil {
				out = append(out, resp.Scores...)
				break
			}
			if !errors.Is(err, router.ErrUnavailable) && !errors.Is(err, router.ErrResourceExhausted) {
				return nil, fmt.Errorf("line %d: %v", c.Line, err)
			}
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("line %d: %v (until the gate's time ran out)", c.Line, err)
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
