package router_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/internal/devcluster/devclustertest"
	"github.com/cumulus-serving/cumulus/internal/partition"
	"github.com/cumulus-serving/cumulus/internal/reference"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/manager"
	"github.com/cumulus-serving/cumulus/model"
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
	script := "#!/bin/sh\necho \"checking $1\" >&2\nif [ -e \"$1/slow\" ]; then sleep 30; fi\n" +
		"if [ -e \"$1/refuse\" ]; then echo \"refused: $(cat \"$1/refuse\")\" >&2; exit 3; fi\n"
	if err := os.WriteFile(validator, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	v1 := randomModel(model.LR, 0, 1000, 13)
	if _, err := repo.Publish("lr", v1, 2, "test"); err != nil {
		t.Fatal(err)
	}
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 2, ScanInterval: time.Hour, Validator: validator, ValidatorTimeout: 2 * time.Second})
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
}
