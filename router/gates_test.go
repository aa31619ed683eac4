package router_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/internal/devcluster/devclustertest"
	"github.com/cumulus-serving/cumulus/internal/golden"
	"github.com/cumulus-serving/cumulus/internal/partition"
	"github.com/cumulus-serving/cumulus/internal/reference"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/manager"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/shard"
)

// TestFiniteGate: a version holding a NaN parameter (written around the
// importers) is rejected by the manager with the reason, and the live
// version serves untouched.
func TestFiniteGate(t *testing.T) {
	repoDir := t.TempDir()
	repo := loader.Repo{Dir: repoDir}
	v1 := randomModel(model.FM, 4, 1000, 12)
	if _, err := repo.Publish("fm", v1, 2, "test"); err != nil {
		t.Fatal(err)
	}
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 2, ScanInterval: time.Hour})
	w, err := repo.NewVersion(loader.Spec{Name: "fm", Shape: v1.Shape, Partitions: 2})
	if err != nil {
		t.Fatal(err)
	}
	for p := range uint32(2) {
		var keys []uint64
		var vals []float32
		for i, k := range v1.Keys {
			if partition.Of(k, 2) == p {
				keys = append(keys, k)
				vals = append(vals, v1.Values[i*5:(i+1)*5]...)
			}
		}
		if p == 1 {
			vals[7] = float32(math.Inf(1))
		}
		if err := w.WritePartition(p, keys, vals); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.Commit(); err != nil {
		t.Fatal(err)
	}
	c.Manager.Rescan()
	testenv.Eventually(t, 30*time.Second, func() error {
		ms := c.Manager.State().Models["fm"]
		for _, v := range ms.Versions {
			if v.Version == 2 && v.Phase == manager.PhaseRejected && strings.Contains(v.Reason, "not finite") && strings.Contains(v.Reason, "part-00001.bin") &&
				len(v.Gates) == 1 && v.Gates[0].Gate == manager.GateFinite && v.Gates[0].Outcome == "failed" {
				return nil
			}
		}
		return fmt.Errorf("v2 not rejected as not finite: %+v", ms.Versions)
	})
	req := randomRequest(rand.New(rand.NewPCG(3, 3)), "fm", v1, 20, 5, 3)
	resp, err := c.Router.Predict(context.Background(), req)
	if err != nil || resp.Version != 1 {
		t.Fatalf("after the rejection: %v, %+v", err, resp)
	}
	if err := scoresMatch(reference.New(v1), req, resp); err != nil {
		t.Fatal(err)
	}
	ms := c.Manager.State().Models["fm"]
	if ms.Live != 1 {
		t.Fatalf("live moved to %d", ms.Live)
	}
	if g := ms.Versions[0].Gates; ms.Versions[0].Version != 1 || len(g) != 1 || g[0].Outcome != "passed" || g[0].At.IsZero() {
		t.Fatalf("v1's gates: %+v", ms.Versions[0])
	}
}

// TestValidatorGate: a staged version is committed only once the
// operator's validator accepts its directory; one it refuses is rejected
// with the validator's last stderr line, the deltas on it too, and the
// live version serves untouched.
func TestValidatorGate(t *testing.T) {
	repoDir := t.TempDir()
	repo := loader.Repo{Dir: repoDir}
	validator := filepath.Join(t.TempDir(), "validate")
	script := "#!/bin/sh\necho \"checking $1\" >&2\nif [ -e \"$1/slow\" ]; then sleep 31.4159; fi\n" +
		"if [ -e \"$1/refuse\" ]; then echo \"refused: $(cat \"$1/refuse\")\" >&2; exit 3; fi\n"
	if err := os.WriteFile(validator, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	v1 := randomModel(model.LR, 0, 1000, 13)
	if _, err := repo.Publish("lr", v1, 2, "test"); err != nil {
		t.Fatal(err)
	}
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 2, ScanInterval: time.Hour,
		Manager: func(o *manager.Options) { o.Validator, o.ValidatorTimeout = validator, 2*time.Second }})
	gates := func(v uint64) []manager.GateResult {
		for _, x := range c.Manager.State().Models["lr"].Versions {
			if x.Version == v {
				return x.Gates
			}
		}
		return nil
	}
	if g := gates(1); len(g) != 2 || g[1].Gate != manager.GateValidator || g[1].Outcome != "passed" {
		t.Fatalf("v1's gates %+v", g)
	}
	// v2 is refused; then v3, a delta on it, is rejected for its parent.
	// (The validator sees the staged version's own directory: a delta
	// staged before its parent would be validated alone.)
	m2, err := repo.Publish("lr", randomModel(model.LR, 0, 1000, 14), 2, "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo.VersionDir("lr", m2.Version), "refuse"), []byte("AUC 0.51 on the holdout"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Manager.Rescan()
	testenv.Eventually(t, 30*time.Second, func() error {
		ms := c.Manager.State().Models["lr"]
		for _, v := range ms.Versions {
			if v.Version == 2 && v.Phase == manager.PhaseRejected && strings.Contains(v.Reason, "gate validator failed: refused: AUC 0.51 on the holdout") {
				return nil
			}
		}
		return fmt.Errorf("v2 not rejected by the validator: %+v", ms.Versions)
	})
	if _, err := repo.PublishDelta("lr", loader.Delta{Parent: m2.Version, Deletes: []uint64{1}}); err != nil {
		t.Fatal(err)
	}
	c.Manager.Rescan()
	testenv.Eventually(t, 30*time.Second, func() error {
		ms := c.Manager.State().Models["lr"]
		for _, v := range ms.Versions {
			if v.Version == 3 && v.Phase == manager.PhaseRejected && strings.Contains(v.Reason, "parent version 2 is rejected") && ms.Staged == 0 {
				return nil
			}
		}
		return fmt.Errorf("delta 3 on the refused version not rejected, or something staged: %+v staged %d", ms.Versions, ms.Staged)
	})
	req := randomRequest(rand.New(rand.NewPCG(4, 4)), "lr", v1, 10, 5, 2)
	resp, err := c.Router.Predict(context.Background(), req)
	if err != nil || resp.Version != 1 {
		t.Fatalf("after the refusal: %v, %+v", err, resp)
	}
	// v4, accepted, goes live.
	if _, err := repo.Publish("lr", randomModel(model.LR, 0, 1000, 15), 2, "test"); err != nil {
		t.Fatal(err)
	}
	c.Manager.Rescan()
	testenv.Eventually(t, 30*time.Second, func() error {
		if s, _ := c.Router.Model("lr"); s.Live != 4 {
			return errors.New("v4 not live")
		}
		return nil
	})
	if g := gates(4); len(g) != 2 || g[1].Outcome != "passed" || g[1].At.IsZero() {
		t.Fatalf("v4's gates %+v", g)
	}
	// v5's validator does not finish in time: rejected, v4 serving.
	m5, err := repo.Publish("lr", randomModel(model.LR, 0, 1000, 16), 2, "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repo.VersionDir("lr", m5.Version), "slow"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	c.Manager.Rescan()
	testenv.Eventually(t, 30*time.Second, func() error {
		for _, v := range c.Manager.State().Models["lr"].Versions {
			if v.Version == 5 && v.Phase == manager.PhaseRejected && strings.Contains(v.Reason, "did not finish within 2s") {
				return nil
			}
		}
		return errors.New("v5 not rejected for its slow validator")
	})
	if s, _ := c.Router.Model("lr"); s.Live != 4 {
		t.Fatalf("live %d after v5's rejection", s.Live)
	}
	// The validator's children were killed with it.
	testenv.Eventually(t, 10*time.Second, func() error {
		cmds, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range cmds {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), "31.4159") {
				return fmt.Errorf("the slow validator's sleep still runs: %s", p)
			}
		}
		return nil
	})
}

// goldenFile is requests as golden lines, each with want(i) (nil: none)
// and labels(i) (nil: none).
func goldenFile(t *testing.T, reqs []*router.Request, want, labels func(i int) []float64) []byte {
	t.Helper()
	b, err := golden.Lines(reqs, want, labels)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var none = golden.None

// versionOf is version v of the manager's state of model.
func versionOf(c *devcluster.Cluster, model string, v uint64) *manager.Version {
	m := c.Manager.State().Models[model]
	if m == nil {
		return nil
	}
	for _, x := range m.Versions {
		if x.Version == v {
			return &x
		}
	}
	return nil
}

// gateOutcomes is v's gates as "gate outcome" strings.
func gateOutcomes(v *manager.Version) string {
	var out []string
	for _, g := range v.Gates {
		out = append(out, g.Gate+" "+g.Outcome)
	}
	return strings.Join(out, ", ")
}

// TestGoldenAndHoldoutGates, with real shards and the manager's own
// router sending the requests: a version's golden requests and the
// model's hold-out set are scored on the staged version before it is
// committed. A delta's golden requests, scored again on its chain, pass;
// wants a version does not give reject it, as does a version scoring the
// hold-out set worse than the live one, the live version serving
// untouched; an operator's accept lets a rejected version through.
func TestGoldenAndHoldoutGates(t *testing.T) {
	repoDir := t.TempDir()
	repo := loader.Repo{Dir: repoDir}
	v1 := randomModel(model.FM, 4, 1000, 21)
	rng := rand.New(rand.NewPCG(21, 21))
	var reqs, holdReqs []*router.Request
	for range 4 {
		reqs = append(reqs, randomRequest(rng, "fm", v1, 10, 5, 3))
	}
	// The hold-out set's labels are what v1 predicts (p > 0.5): v1 scores
	// it well, and a version predicting the opposite badly.
	ref1 := reference.New(v1)
	for range 20 {
		holdReqs = append(holdReqs, randomRequest(rng, "fm", v1, 10, 5, 3))
	}
	holdout := filepath.Join(t.TempDir(), "holdout.jsonl")
	err := os.WriteFile(holdout, goldenFile(t, holdReqs, none, func(i int) []float64 {
		var l []float64
		for _, row := range holdReqs[i].ReferenceRows() {
			l = append(l, float64(min(1, int(ref1.ScoreRow(row)*2))))
		}
		return l
	}), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	publish := func(m *loader.Sparse, file []byte) {
		t.Helper()
		set, err := golden.Parse(file, "fm", router.Limits{})
		if err != nil {
			t.Fatal(err)
		}
		set.KeepWant = true
		if _, err := repo.PublishSpec(loader.Spec{Name: "fm", Partitions: 2, Golden: set}, m); err != nil {
			t.Fatal(err)
		}
	}
	publish(v1, goldenFile(t, reqs, none, none))
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 2, ScanInterval: time.Hour,
		Manager: func(o *manager.Options) { o.Holdout = map[string]string{"fm": holdout} }})
	waitLive := func(v uint64) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, func() error {
			if s, _ := c.Router.Model("fm"); s.Live != v {
				return fmt.Errorf("live %d, waiting for %d: %+v", s.Live, v, versionOf(c, "fm", v))
			}
			return nil
		})
	}
	waitRejected := func(v uint64, reason string) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, func() error {
			if x := versionOf(c, "fm", v); x == nil || x.Phase != manager.PhaseRejected || !strings.Contains(x.Reason, reason) {
				return fmt.Errorf("v%d not rejected with %q: %+v", v, reason, x)
			}
			return nil
		})
	}
	servesUntouched := func(live uint64, m *loader.Sparse) {
		t.Helper()
		req := randomRequest(rand.New(rand.NewPCG(live, 7)), "fm", m, 20, 5, 3)
		resp, err := c.Router.Predict(context.Background(), req)
		if err != nil || resp.Version != live {
			t.Fatalf("serving after a rejection: %v, %+v", err, resp)
		}
		if err := scoresMatch(reference.New(m), req, resp); err != nil {
			t.Fatal(err)
		}
	}
	if g := gateOutcomes(versionOf(c, "fm", 1)); g != "finite passed, golden passed, holdout skipped" {
		t.Fatalf("v1's gates: %s", g)
	}

	// v2, a delta on v1 changing 100 features: its golden requests are
	// v1's scored again on the new chain. The hold-out set compares it
	// with v1.
	up := &loader.Sparse{Shape: v1.Shape}
	for i := 0; i < len(v1.Keys); i += 10 {
		up.Keys = append(up.Keys, v1.Keys[i])
		up.Values = append(up.Values, v1.Values[i*5:(i+1)*5]...)
		up.Values[len(up.Values)-5] += 0.05
	}
	m1, err := repo.Manifest("fm", 1)
	if err != nil {
		t.Fatal(err)
	}
	b, err := repo.Golden(m1)
	if err != nil {
		t.Fatal(err)
	}
	parentSet, err := golden.Parse(b, "fm", router.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := repo.PublishDelta("fm", loader.Delta{Upserts: up, Golden: parentSet}); err != nil {
		t.Fatal(err)
	}
	c.Manager.Rescan()
	waitLive(2)
	v2 := versionOf(c, "fm", 2)
	if g := gateOutcomes(v2); g != "finite passed, golden passed, holdout passed" || !strings.Contains(v2.Gates[2].Reason, "live version 1's") {
		t.Fatalf("v2's gates: %+v", v2.Gates)
	}

	// v3, v1's content, with wants 0.01 off: rejected; v2 serves.
	v1up := &loader.Sparse{Shape: v1.Shape, Bias: v1.Bias, Keys: v1.Keys, Values: slices.Clone(v1.Values)}
	for i := 0; i < len(v1.Keys); i += 10 {
		v1up.Values[i*5] += 0.05
	}
	ref2 := reference.New(v1up)
	off := func(i int) []float64 {
		var w []float64
		for _, row := range reqs[i].ReferenceRows() {
			w = append(w, ref2.ScoreRow(row)+0.01)
		}
		return w
	}
	publish(v1up, goldenFile(t, reqs, off, none))
	c.Manager.Rescan()
	waitRejected(3, "gate golden failed: ")
	if x := versionOf(c, "fm", 3); !strings.Contains(x.Reason, "scores off by more than 0.0001; first line 1 row 0") {
		t.Fatalf("v3's reason: %s", x.Reason)
	}
	servesUntouched(2, v1up)

	// Accepted, it is validated again and goes live, its golden gate's
	// failure recorded as accepted.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Manager.Do(ctx, manager.Command{Op: manager.OpAccept, Model: "fm", Version: 3, Reason: "wants computed before a fix", At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	waitLive(3)
	if x := versionOf(c, "fm", 3); gateOutcomes(x) != "finite passed, golden accepted, holdout passed" || !strings.Contains(x.Gates[1].Reason, "(accepted: wants computed before a fix)") {
		t.Fatalf("v3's gates after the accept: %+v", x.Gates)
	}

	// v4 is v3 with its linear part (weights and bias) negated: its
	// log-loss on the hold-out set is worse; rejected, v3 serves.
	v4 := &loader.Sparse{Shape: v1.Shape, Bias: -v1up.Bias, Keys: v1.Keys}
	for i, x := range v1up.Values {
		if i%5 == 0 {
			x = -x
		}
		v4.Values = append(v4.Values, x)
	}
	if _, err := repo.Publish("fm", v4, 2, "test"); err != nil {
		t.Fatal(err)
	}
	c.Manager.Rescan()
	waitRejected(4, "gate holdout failed: mean log-loss")
	t.Logf("v2's gates %+v; v4: %s", v2.Gates, versionOf(c, "fm", 4).Reason)
	servesUntouched(3, v1up)
}

// TestGoldenGateRidesOutShardErrors: a shard failing half its lookups
// (unavailable) does not fail the golden gate: its requests are sent
// again until they are answered, and the version goes live.
func TestGoldenGateRidesOutShardErrors(t *testing.T) {
	repoDir := t.TempDir()
	repo := loader.Repo{Dir: repoDir}
	v1 := randomModel(model.LR, 0, 1000, 31)
	rng := rand.New(rand.NewPCG(31, 31))
	var reqs []*router.Request
	for range 10 {
		reqs = append(reqs, randomRequest(rng, "lr", v1, 10, 5, 3))
	}
	set, err := golden.Parse(goldenFile(t, reqs, none, none), "lr", router.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := repo.PublishSpec(loader.Spec{Name: "lr", Partitions: 2, Golden: set}, v1); err != nil {
		t.Fatal(err)
	}
	faults, err := shard.ParseFaults("error=unavailable,fraction=0.5")
	if err != nil {
		t.Fatal(err)
	}
	c, err := devcluster.Start(context.Background(), devcluster.Options{Repo: repoDir, DataDir: t.TempDir(), Shards: 2, ScanInterval: time.Hour,
		Shard: func(i int, o *shard.Options) { o.Faults = faults }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	testenv.Eventually(t, 30*time.Second, func() error {
		if x := versionOf(c, "lr", 1); x == nil || x.Phase != manager.PhaseLive || gateOutcomes(x) != "finite passed, golden passed" {
			return fmt.Errorf("v1: %+v", x)
		}
		return nil
	})
}

// TestGateErrorIsTriedAgain: a hold-out set that cannot be read does not
// reject the version (it is not its fault): it waits, saying why, and
// passes once the file is there.
func TestGateErrorIsTriedAgain(t *testing.T) {
	repoDir := t.TempDir()
	repo := loader.Repo{Dir: repoDir}
	v1 := randomModel(model.LR, 0, 1000, 41)
	if _, err := repo.Publish("lr", v1, 2, "test"); err != nil {
		t.Fatal(err)
	}
	holdout := filepath.Join(t.TempDir(), "holdout.jsonl")
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 2, ScanInterval: time.Hour,
		Manager: func(o *manager.Options) {
			o.Holdout, o.GateRetry = map[string]string{"lr": holdout}, 200*time.Millisecond
		}})
	if g := gateOutcomes(versionOf(c, "lr", 1)); g != "finite passed, holdout skipped" {
		t.Fatalf("v1's gates: %s", g)
	}
	if _, err := repo.Publish("lr", v1, 2, "test"); err != nil {
		t.Fatal(err)
	}
	c.Manager.Rescan()
	testenv.Eventually(t, 30*time.Second, func() error {
		x := versionOf(c, "lr", 2)
		if x == nil || x.Phase != manager.PhaseStaging || !strings.Contains(x.Reason, "a gate could not run (it is tried again): gate holdout: hold-out set") ||
			gateOutcomes(x) != "finite passed, holdout error" {
			return fmt.Errorf("v2: %+v", x)
		}
		return nil
	})
	rng := rand.New(rand.NewPCG(41, 41))
	reqs := []*router.Request{randomRequest(rng, "lr", v1, 10, 5, 3)}
	if err := os.WriteFile(holdout, goldenFile(t, reqs, none, func(int) []float64 { return make([]float64, 10) }), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		if x := versionOf(c, "lr", 2); x == nil || x.Phase != manager.PhaseLive || gateOutcomes(x) != "finite passed, holdout passed" {
			return fmt.Errorf("v2: %+v", x)
		}
		return nil
	})
}
