package router_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/internal/devcluster/devclustertest"
	"github.com/cumulus-serving/cumulus/internal/reference"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/manager"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/shard"
)

// adminAPI calls a manager's admin API over HTTP.
type adminAPI struct {
	t     *testing.T
	base  string
	token string
}

func (a adminAPI) call(method, path, body string) (int, map[string]any) {
	a.t.Helper()
	req, _ := http.NewRequest(method, a.base+path, strings.NewReader(body))
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		a.t.Fatalf("%s %s: %d %q is not JSON", method, path, resp.StatusCode, b)
	}
	return resp.StatusCode, out
}

// model is GET /admin/v1/models/NAME, decoded.
func (a adminAPI) model(name string) manager.ModelDetail {
	a.t.Helper()
	code, out := a.call(http.MethodGet, "/admin/v1/models/"+name, "")
	if code != http.StatusOK {
		a.t.Fatalf("show %s: %d %v", name, code, out)
	}
	b, _ := json.Marshal(out)
	var d manager.ModelDetail
	json.Unmarshal(b, &d)
	return d
}

func phaseOf(d manager.ModelDetail, v uint64) (manager.Phase, string) {
	for _, x := range d.Versions {
		if x.Version == v {
			return x.Phase, x.Reason
		}
	}
	return "", ""
}

func counter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == label && l.GetValue() == value }) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestOperateModels runs the control plane as a model owner and an
// operator would, with requests flowing throughout and every answer
// scored against the reference of the version it reports: versions 1, 2
// (full), 3 (a delta on 2) go live in turn; a damaged version 4 is
// rejected with its reason shown, repaired and served after a rescan;
// rollback to 2, to 1, unpin; bad admin calls are refused with their
// codes; a shard loaded from another repository joins and gets no
// traffic; the manager is restarted and carries on. No request fails.
func TestOperateModels(t *testing.T) {
	repoDir, rogueDir := t.TempDir(), t.TempDir()
	repo := loader.Repo{Dir: repoDir}
	const parts = 6
	v1, v2, v4 := randomModel(model.LR, 0, 3000, 31), randomModel(model.LR, 0, 3000, 32), randomModel(model.LR, 0, 3000, 34)
	changed := &loader.Sparse{Shape: model.Shape{Type: model.LR}, Keys: slices.Clone(v2.Keys[:200]), Values: make([]float32, 200)}
	for i := range changed.Values {
		changed.Values[i] = float32(i%7) - 3
	}
	d3 := loader.Delta{Upserts: changed, Deletes: slices.Clone(v2.Keys[1000:1100])}
	v3 := applyDelta(v2, d3)
	refs := map[uint64]*reference.Model{1: reference.New(v1), 2: reference.New(v2), 3: reference.New(v3), 4: reference.New(v4)}
	if _, err := repo.Publish("lr", v1, parts, "v1"); err != nil {
		t.Fatal(err)
	}
	// The rogue repository holds other parameters under the same name
	// and version numbers.
	for i := range 4 {
		if _, err := (loader.Repo{Dir: rogueDir}).Publish("lr", randomModel(model.LR, 0, 3000, uint64(90+i)), parts, "rogue"); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 3, ScanInterval: time.Hour, Registry: reg,
		Shard: func(i int, o *shard.Options) {
			if i == 3 {
				o.Repo = loader.Repo{Dir: rogueDir}
			}
		}})
	adm, err := c.Manager.ServeAdmin(manager.AdminOptions{Addr: "127.0.0.1:0", Token: "sesame"})
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	api := adminAPI{t: t, base: "http://" + adm.Addr(), token: "sesame"}

	rng := rand.New(rand.NewPCG(7, 7))
	req := randomRequest(rng, "lr", v1, 60, 20, 5)
	var last atomic.Uint64
	tr := startTraffic(t, c.Router, req, func(resp *router.Response) error {
		ref := refs[resp.Version]
		if ref == nil {
			return fmt.Errorf("answered by version %d, which was never published", resp.Version)
		}
		last.Store(resp.Version)
		return scoresMatch(ref, req, resp)
	})
	serves := func(v uint64) {
		t.Helper()
		tr.until(t, func() error {
			if got := last.Load(); got != v {
				return fmt.Errorf("answered by version %d, want %d", got, v)
			}
			return nil
		})
		tr.await(t, 5)
		if got := last.Load(); got != v {
			t.Fatalf("answered by version %d after %d was live", got, v)
		}
	}
	serves(1)
	if _, err := repo.Publish("lr", v2, parts, "v2"); err != nil {
		t.Fatal(err)
	}
	c.Manager.Rescan()
	serves(2)
	if m, err := repo.PublishDelta("lr", d3); err != nil || m.Version != 3 || m.Parent != 2 {
		t.Fatalf("delta: %+v %v", m, err)
	}
	c.Manager.Rescan()
	serves(3)

	// Version 4 arrives damaged: rejected, the reason shown, 3 serving.
	// It is damaged before it appears: written and corrupted in a scratch
	// repository numbered alike, then renamed in whole, as publishing
	// does (the manager watches the repository, and would otherwise
	// validate it before the damage).
	scratch := loader.Repo{Dir: t.TempDir()}
	for range 3 {
		if _, err := scratch.Publish("lr", randomModel(model.LR, 0, 10, 7), parts, "numbering"); err != nil {
			t.Fatal(err)
		}
	}
	m4, err := scratch.Publish("lr", v4, parts, "v4")
	if err != nil || m4.Version != 4 {
		t.Fatalf("scratch version 4: %+v %v", m4, err)
	}
	good, _ := os.ReadFile(filepath.Join(scratch.VersionDir("lr", 4), m4.Files[1].Path))
	bad := bytes.Clone(good)
	bad[len(bad)/2] ^= 0x40
	os.WriteFile(filepath.Join(scratch.VersionDir("lr", 4), m4.Files[1].Path), bad, 0o644)
	if err := os.Rename(scratch.VersionDir("lr", 4), repo.VersionDir("lr", 4)); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(repo.VersionDir("lr", 4), m4.Files[1].Path)
	c.Manager.Rescan()
	testenv.Eventually(t, 20*time.Second, func() error {
		if phase, why := phaseOf(api.model("lr"), 4); phase != manager.PhaseRejected || !strings.Contains(why, "part-00001.bin") {
			return fmt.Errorf("version 4: %s %q", phase, why)
		}
		return nil
	})
	tr.await(t, 5)
	if last.Load() != 3 {
		t.Fatalf("answered by %d with 4 rejected", last.Load())
	}
	// Repaired, and found again on an operator's rescan.
	os.WriteFile(f, good, 0o644)
	if code, out := api.call(http.MethodPost, "/admin/v1/rescan", ""); code != http.StatusOK {
		t.Fatalf("rescan: %d %v", code, out)
	}
	serves(4)

	// Roll back to 2, then 1, then follow the newest again.
	code, out := api.call(http.MethodPost, "/admin/v1/models/lr/rollback", `{"to": 2, "from": 4}`)
	if code != http.StatusOK || out["live"] != float64(2) || out["pin"] != float64(2) {
		t.Fatalf("rollback to 2: %d %v", code, out)
	}
	serves(2)
	if code, out := api.call(http.MethodPost, "/admin/v1/models/lr/rollback", `{"to": 1, "from": 2}`); code != http.StatusOK || out["live"] != float64(1) {
		t.Fatalf("rollback to 1: %d %v", code, out)
	}
	serves(1)
	for _, bad := range []struct {
		method, path, body string
		code               int
		says               string
		token              string
	}{
		{http.MethodPost, "/admin/v1/models/lr/rollback", `{"to": 99, "from": 1}`, http.StatusConflict, "standby versions: 2, 4, 3", "sesame"},
		{http.MethodPost, "/admin/v1/models/lr/rollback", `{"to": 2, "from": 4}`, http.StatusConflict, "live at 1, not 4", "sesame"},
		{http.MethodPost, "/admin/v1/models/lr/rollback", `{"to": 2}`, http.StatusBadRequest, `"from" is required`, "sesame"},
		{http.MethodDelete, "/admin/v1/models/lr/pin?from=x", "", http.StatusBadRequest, "not a version", "sesame"},
		{http.MethodPut, "/admin/v1/models/lr/pin", `{"version": "two"}`, http.StatusBadRequest, "malformed JSON", "sesame"},
		{http.MethodPut, "/admin/v1/models/lr/pin", `{"version": 2}{`, http.StatusBadRequest, "data after the object", "sesame"},
		{http.MethodPut, "/admin/v1/models/lr/pin", `{"version": 77, "from": 1}`, http.StatusConflict, "no version 77", "sesame"},
		{http.MethodPut, "/admin/v1/models/nope/pin", `{"version": 1, "from": 1}`, http.StatusNotFound, `model "nope"`, "sesame"},
		{http.MethodGet, "/admin/v1/models/nope", "", http.StatusNotFound, `"nope"`, "sesame"},
		{http.MethodPost, "/admin/v1/models/lr/rollback", `{"to": 2}`, http.StatusUnauthorized, "token", "wrong"},
		{http.MethodDelete, "/admin/v1/models/lr/pin", "", http.StatusUnauthorized, "token", ""},
	} {
		a := api
		a.token = bad.token
		code, out := a.call(bad.method, bad.path, bad.body)
		if code != bad.code || !strings.Contains(fmt.Sprint(out["error"]), bad.says) {
			t.Errorf("%s %s %s: %d %v; want %d saying %q", bad.method, bad.path, bad.body, code, out, bad.code, bad.says)
		}
	}
	tr.await(t, 5)
	if last.Load() != 1 {
		t.Fatalf("refused calls changed what is served: version %d", last.Load())
	}
	if code, out := api.call(http.MethodDelete, "/admin/v1/models/lr/pin?from=1", ""); code != http.StatusOK || out["pin"] != nil {
		t.Fatalf("unpin: %d %v", code, out)
	}
	serves(4)

	// The audit log has every state-changing call, refused ones too, but
	// none without the token.
	_, audit := api.call(http.MethodGet, "/admin/v1/audit", "")
	var ops []string
	for _, e := range audit["entries"].([]any) {
		e := e.(map[string]any)
		ops = append(ops, fmt.Sprintf("%s %v", e["op"], strings.HasPrefix(e["result"].(string), "ok")))
	}
	if want := "[rescan true rollback true rollback true rollback false rollback false pin false pin false unpin true]"; fmt.Sprint(ops) != want {
		t.Errorf("audit log %v, want %s", ops, want)
	}

	// The router is registered, saying it can score every kept version.
	testenv.Eventually(t, 10*time.Second, func() error {
		code, out := api.call(http.MethodGet, "/admin/v1/routers", "")
		rs, _ := out["routers"].([]any)
		if code != http.StatusOK || len(rs) != 1 {
			return fmt.Errorf("routers: %d %v", code, out)
		}
		r := rs[0].(map[string]any)
		if scores := fmt.Sprint(r["scores"].(map[string]any)["lr"]); r["id"] == "" || scores != "[1 2 3 4]" {
			return fmt.Errorf("router %v scores lr %s, want [1 2 3 4]", r["id"], scores)
		}
		return nil
	})

	// A shard loaded from another repository joins: it is told to load
	// partitions, refuses what differs from the map, is reported and is
	// assigned nothing; it never receives a lookup.
	if _, err := c.AddShard(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		for _, s := range api.model("lr").Shards {
			if s.ID == "shard-3" && len(s.Mismatched) > 0 && s.Assigned == 0 {
				return nil
			}
		}
		return errors.New("shard-3 not reported as mismatched and unassigned yet")
	})
	tr.await(t, 20)
	if n := counter(t, reg, "cumulus_shard_lookup_keys_total", "shard", "shard-3"); n != 0 {
		t.Fatalf("the rogue shard was asked for %v keys", n)
	}

	// The manager is restarted under traffic and carries on from its
	// persisted state.
	adm.Close()
	c.Manager.Close()
	mo := c.ManagerOptions()
	mo.ScanInterval, mo.Registry = time.Hour, nil
	m2, err := manager.Start(context.Background(), mo)
	if err != nil {
		t.Fatal(err)
	}
	c.Manager = m2 // the cluster's cleanup closes it
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := m2.WaitLeading(wctx); err != nil {
		t.Fatal(err)
	}
	st := m2.State().Models["lr"]
	if st.Live != 4 || st.Pin != 0 || fmt.Sprint(st.Standby()) != "[1 2 3]" {
		t.Fatalf("restarted manager: live %d pin %d standby %v", st.Live, st.Pin, st.Standby())
	}
	tr.await(t, 20)
	if n, err := tr.Stop(); err != nil {
		t.Fatalf("after %d answered: %v", n, err)
	}
}

// TestRestartMidRolloutNeverServesStaged: with one replica, a shard
// restarted during a rollout comes back empty. Here it reloads the staged
// version before the live one (its live loads fail for a while), with the
// manager down, so nothing is committed: the staged version is complete
// on the shards and the live one is not. No request may be answered by
// the staged version; they fail until the live version is whole again,
// and version 2 serves only after the manager is back and commits it.
func TestRestartMidRolloutNeverServesStaged(t *testing.T) {
	repoDir := t.TempDir()
	repo := loader.Repo{Dir: repoDir}
	v1, v2 := randomModel(model.LR, 0, 2000, 41), randomModel(model.LR, 0, 2000, 42)
	if _, err := repo.Publish("lr", v1, 4, "v1"); err != nil {
		t.Fatal(err)
	}
	var starts int
	var holdV1 atomic.Bool
	holdV1.Store(true)
	c := devclustertest.Start(t, devcluster.Options{Repo: repoDir, Shards: 2, ScanInterval: time.Hour,
		Shard: func(i int, o *shard.Options) {
			if i != 1 {
				return
			}
			o.LeaseTTL = 2 // the restarted process waits for the crashed one's lease to run out
			starts++
			first := starts == 1
			o.BeforeLoad = func(ctx context.Context, _ string, version uint64, _ uint32) error {
				switch {
				case first && version == 2:
					return errors.New("held by the test: the first process never gets version 2")
				case !first && version == 1 && holdV1.Load():
					return errors.New("held by the test: the restarted process reloads version 1 late")
				}
				return nil
			}
		}})
	if _, err := repo.Publish("lr", v2, 4, "v2"); err != nil {
		t.Fatal(err)
	}
	c.Manager.Rescan()
	testenv.Eventually(t, 20*time.Second, func() error {
		m := c.Manager.State().Models["lr"]
		if m.Staged != 2 || !slices.ContainsFunc(c.Shards[0].Loaded(), func(l topo.Loaded) bool { return l.Version == 2 && len(l.Have) > 0 }) {
			return errors.New("version 2 not staged and loaded on shard-0 yet")
		}
		return nil
	})
	// The control plane freezes mid-rollout; shard-1 crashes and comes
	// back with version 2 only.
	c.Manager.Close()
	if _, err := c.RestartShard(1); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		if !slices.ContainsFunc(c.Shards[1].Loaded(), func(l topo.Loaded) bool { return l.Version == 2 && len(l.Have) == 2 }) {
			return errors.New("restarted shard-1 has not loaded its two partitions of version 2")
		}
		return nil
	})
	// Wait until the router's table reflects shard-1's report.
	resp, err := c.Etcd.Get(context.Background(), topo.DefaultCluster.ShardKey("shard-1"))
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("shard-1's registration: %v", err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		if c.Router.Revision() < resp.Kvs[0].ModRevision {
			return fmt.Errorf("router at revision %d, shard-1's report at %d", c.Router.Revision(), resp.Kvs[0].ModRevision)
		}
		return nil
	})
	rng := rand.New(rand.NewPCG(8, 8))
	req := randomRequest(rng, "lr", v1, 40, 20, 5)
	for i := range 100 {
		resp, err := c.Router.Predict(context.Background(), req)
		if err == nil {
			t.Fatalf("request %d answered by version %d while version 1 is incomplete and 2 uncommitted", i, resp.Version)
		}
		if !errors.Is(err, router.ErrUnavailable) {
			t.Fatalf("request %d: %v, want unavailable", i, err)
		}
	}
	// Version 1 whole again: answered by 1.
	holdV1.Store(false)
	ref1, ref2 := reference.New(v1), reference.New(v2)
	testenv.Eventually(t, 20*time.Second, func() error {
		resp, err := c.Router.Predict(context.Background(), req)
		if err != nil {
			return err
		}
		if resp.Version != 1 {
			t.Fatalf("answered by version %d before any commit", resp.Version)
		}
		return scoresMatch(ref1, req, resp)
	})
	// The manager back, from what it persisted: it commits 2.
	mo := c.ManagerOptions()
	mo.ScanInterval, mo.Registry = time.Hour, nil
	m, err := manager.Start(context.Background(), mo)
	if err != nil {
		t.Fatal(err)
	}
	c.Manager = m
	testenv.Eventually(t, 20*time.Second, func() error {
		resp, err := c.Router.Predict(context.Background(), req)
		if err != nil {
			return err
		}
		if resp.Version != 2 {
			return fmt.Errorf("answered by version %d", resp.Version)
		}
		return scoresMatch(ref2, req, resp)
	})
}
