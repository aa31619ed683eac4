package manager_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/etcdlocal"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/manager"
	"github.com/cumulus-serving/cumulus/model"
)

// fakeShards registers shards that hold at once whatever the serving map
// gives them, and report it as a real shard would (records only, no
// tables): enough for the manager to place, commit and roll back.
func fakeShards(t *testing.T, cli *clientv3.Client, ids ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, id := range ids {
		info := func(as map[string]topo.Assignment) string {
			si := topo.ShardInfo{Schema: topo.Schema, ID: id, Addr: "127.0.0.1:1", Applied: map[string]uint64{}}
			for name, a := range as {
				si.Applied[name] = a.Seq
				for _, v := range a.Kept() {
					l := topo.Loaded{Model: name, Version: v}
					for p, reps := range a.Replicas {
						for _, r := range reps {
							if r == id {
								l.Have, l.IDs = append(l.Have, uint32(p)), append(l.IDs, a.Info(v).IDs[p])
							}
						}
					}
					if len(l.Have) > 0 {
						si.Loaded = append(si.Loaded, l)
					}
				}
			}
			b, _ := json.Marshal(si)
			return string(b)
		}
		reg, err := topo.Register(ctx, cli, topo.DefaultCluster.ShardKey(id), info(nil), 10)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer reg.Close()
			topo.Watch(ctx, cli, topo.DefaultCluster.ModelsPrefix(), func(kv map[string][]byte, _ int64) {
				reg.Set(info(topo.Assignments(kv, topo.DefaultCluster)))
			})
		}()
	}
}

// repoWith is a fresh repository holding versions 1..n of model m
// (version v is lrModel(v)), in 4 partitions.
func repoWith(t *testing.T, n int) loader.Repo {
	t.Helper()
	repo := loader.Repo{Dir: t.TempDir()}
	for v := 1; v <= n; v++ {
		if _, err := repo.Publish("m", lrModel(float32(v)), 4, ""); err != nil {
			t.Fatal(err)
		}
	}
	return repo
}

func lrModel(scale float32) *loader.Sparse {
	m := &loader.Sparse{Shape: model.Shape{Type: model.LR}}
	for k := uint64(1); k <= 100; k++ {
		m.Keys = append(m.Keys, k)
		m.Values = append(m.Values, scale*float32(k))
	}
	return m
}

func published(t *testing.T, cli *clientv3.Client, model string) topo.Assignment {
	t.Helper()
	a, ok, err := topo.ReadAssignment(context.Background(), cli, topo.DefaultCluster, model)
	if err != nil || !ok {
		t.Fatalf("no serving map for %s: %v", model, err)
	}
	return a
}

// startWith starts a manager over repo and waits until model m is live
// at version live.
func startWith(t *testing.T, cli *clientv3.Client, repo loader.Repo, live uint64) *manager.Manager {
	t.Helper()
	m, err := manager.Start(context.Background(), manager.Options{Repo: repo, Etcd: cli, ScanInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	testenv.Eventually(t, 20*time.Second, func() error {
		if a := m.State().Models["m"]; a == nil || a.Live != live {
			return fmt.Errorf("model m not live at %d yet", live)
		}
		return nil
	})
	return m
}

// TestSecondManager: of two managers on one cluster, one leads; the
// other follows the state the leader writes, refuses commands, and takes
// over from that state when the leader stops. (A manager whose view went
// stale while it still believed it led could not write over a newer map
// either: TestStaleWriterRefused.)
func TestSecondManager(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := repoWith(t, 1)
	fakeShards(t, cli, "s0", "s1")
	a := startWith(t, cli, repo, 1)
	testenv.Eventually(t, 10*time.Second, func() error {
		if !a.Leading() {
			return errors.New("a does not lead")
		}
		return nil
	})
	b, err := manager.Start(context.Background(), manager.Options{Repo: repo, Etcd: cli, ScanInterval: time.Hour, Replicas: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := repo.Publish("m", lrModel(2), 4, ""); err != nil {
		t.Fatal(err)
	}
	a.Rescan()
	testenv.Eventually(t, 10*time.Second, func() error {
		if got := published(t, cli, "m"); got.Live != 2 {
			return fmt.Errorf("live %d", got.Live)
		}
		return nil
	})
	ctx := context.Background()
	if _, err := a.Do(ctx, manager.Command{Op: manager.OpRollback, Model: "m"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if m := b.State().Models["m"]; m.Pin != 1 || m.Live != 1 {
			return fmt.Errorf("b sees pin %d live %d", m.Pin, m.Live)
		}
		return nil
	})
	// b, with other flags (replicas 2), decides nothing while a leads.
	_, err = b.Do(ctx, manager.Command{Op: manager.OpUnpin, Model: "m"})
	if !errors.Is(err, manager.ErrNotLeader) || !strings.Contains(err.Error(), "the leader is") {
		t.Fatalf("a command to the standby manager: %v", err)
	}
	b.Rescan()
	if got := published(t, cli, "m"); got.Live != 1 || len(got.Replicas[0]) != 1 {
		t.Fatalf("the standby manager changed the map: live %d replicas %v", got.Live, got.Replicas)
	}
	// a stops: b leads, from the state a left (pinned to 1), with its own
	// flags.
	a.Close()
	testenv.Eventually(t, 20*time.Second, func() error {
		if !b.Leading() {
			return errors.New("b does not lead yet")
		}
		return nil
	})
	if _, err := b.Do(ctx, manager.Command{Op: manager.OpUnpin, Model: "m"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if got := published(t, cli, "m"); got.Live != 2 || len(got.Replicas[0]) != 2 {
			return fmt.Errorf("live %d replicas %v", got.Live, got.Replicas)
		}
		return nil
	})
}

// TestConcurrentAdminCalls: calls made at once are applied one at a
// time and none is lost: each is answered, applied or refused because
// another moved the live version it named, and each is in the audit log.
func TestConcurrentAdminCalls(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := repoWith(t, 2)
	fakeShards(t, cli, "s0")
	m := startWith(t, cli, repo, 2)
	adm, err := m.ServeAdmin(manager.AdminOptions{Addr: "127.0.0.1:0", Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	const calls = 24
	var wg sync.WaitGroup
	codes := make([]int, calls)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPut, "http://"+adm.Addr()+"/admin/v1/models/m/pin", strings.NewReader(fmt.Sprintf(`{"version": %d, "from": 2}`, 1+i%2)))
			if i%3 == 0 {
				req, _ = http.NewRequest(http.MethodDelete, "http://"+adm.Addr()+"/admin/v1/models/m/pin?from=2", nil)
			}
			req.Header.Set("Authorization", "Bearer t")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			codes[i] = resp.StatusCode
		}()
	}
	wg.Wait()
	ok := 0
	for i, c := range codes {
		switch c {
		case http.StatusOK:
			ok++
		case http.StatusConflict: // live moved by an earlier call
		default:
			t.Errorf("call %d: %d", i, c)
		}
	}
	if ok == 0 {
		t.Errorf("no call applied: %v", codes)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+adm.Addr()+"/admin/v1/audit?limit=1000", nil)
	req.Header.Set("Authorization", "Bearer t")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var audit struct{ Entries []manager.AuditEntry }
	if err := json.NewDecoder(resp.Body).Decode(&audit); err != nil {
		t.Fatal(err)
	}
	if len(audit.Entries) != calls {
		t.Fatalf("%d audit entries for %d calls", len(audit.Entries), calls)
	}
	// Every call named live 2: once one has moved the live version, none
	// after it applies.
	moved := ""
	for _, e := range audit.Entries { // oldest first
		applied := strings.HasPrefix(e.Result, "ok")
		if applied && moved != "" {
			t.Errorf("%s applied (%s) after %q moved the live version", e.Op, e.Result, moved)
		}
		if live := strings.TrimSuffix(strings.Fields(strings.TrimPrefix(e.Result, "ok: live ") + " ")[0], ","); applied && live != "2" {
			moved = e.Op + " " + e.Result
		}
	}
}

// TestUnreadableManifestReported: a version whose manifest is not valid
// JSON is rejected with the reason, never skipped silently; repaired, it
// is validated again on a rescan and served.
func TestUnreadableManifestReported(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := repoWith(t, 2)
	manifest := filepath.Join(repo.VersionDir("m", 2), codec.ManifestName)
	good, _ := os.ReadFile(manifest)
	os.WriteFile(manifest, []byte(`{"format": 1, "name": "m",`), 0o644)
	fakeShards(t, cli, "s0")
	m := startWith(t, cli, repo, 1)
	testenv.Eventually(t, 10*time.Second, func() error {
		for _, v := range m.State().Models["m"].Versions {
			if v.Version == 2 && v.Phase == manager.PhaseRejected && strings.Contains(v.Reason, "manifest") {
				return nil
			}
		}
		return errors.New("version 2 not reported rejected for its manifest")
	})
	os.WriteFile(manifest, good, 0o644)
	if _, err := m.Do(context.Background(), manager.Command{Op: manager.OpRescan}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if got := published(t, cli, "m"); got.Live != 2 {
			return fmt.Errorf("live %d", got.Live)
		}
		return nil
	})
}

// TestUnwrittenCommandNotShown: a command whose result cannot be written
// is reported as such and is not shown, nor written later, as in force.
func TestUnwrittenCommandNotShown(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := repoWith(t, 2)
	fakeShards(t, cli, "s0")
	own, err := clientv3.New(clientv3.Config{Endpoints: cli.Endpoints(), DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	m, err := manager.Start(context.Background(), manager.Options{Repo: repo, Etcd: own, ScanInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	testenv.Eventually(t, 20*time.Second, func() error {
		// In etcd, not only in the manager's view: a change may be held
		// back for a moment while validations run.
		resp, err := cli.Get(context.Background(), topo.DefaultCluster.ModelKey("m"))
		if err != nil || len(resp.Kvs) == 0 || !strings.Contains(string(resp.Kvs[0].Value), `"live":2,`) {
			return errors.New("not live in etcd yet")
		}
		if a := m.State().Models["m"]; a == nil || a.Live != 2 {
			return errors.New("not live yet")
		}
		return nil
	})
	own.Close() // the manager's etcd is gone
	_, err = m.Do(context.Background(), manager.Command{Op: manager.OpPin, Model: "m", Version: 1})
	if !errors.Is(err, manager.ErrUnconfirmed) && !errors.Is(err, manager.ErrNotLeader) {
		t.Fatalf("pin with etcd gone: %v, want not confirmed (or not leading)", err)
	}
	if st := m.State().Models["m"]; st.Pin != 0 || st.Live != 2 {
		t.Fatalf("an unwritten pin is shown: pin %d live %d", st.Pin, st.Live)
	}
	if got := published(t, cli, "m"); got.Live != 2 {
		t.Fatalf("map says live %d", got.Live)
	}
}

// TestRollbacksSayWhatTheyExpect: two operators' rollbacks made at once
// from the same live version: exactly one is applied, the other refused
// with 409 naming the live version now, and the first's answer describes
// its own result. A change without "from" is refused as malformed.
func TestRollbacksSayWhatTheyExpect(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := repoWith(t, 1)
	fakeShards(t, cli, "s0")
	m := startWith(t, cli, repo, 1)
	if _, err := repo.Publish("m", lrModel(2), 4, ""); err != nil {
		t.Fatal(err)
	}
	m.Rescan()
	testenv.Eventually(t, 20*time.Second, func() error {
		if a := m.State().Models["m"]; a.Live != 2 || len(a.Standby()) == 0 {
			return fmt.Errorf("live %d, standby %v", a.Live, a.Standby())
		}
		return nil
	})
	adm, err := m.ServeAdmin(manager.AdminOptions{Addr: "127.0.0.1:0", Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	call := func(method, path, body string) (int, map[string]any) {
		req, _ := http.NewRequest(method, "http://"+adm.Addr()+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer t")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0, nil
		}
		defer resp.Body.Close()
		var out map[string]any
		json.NewDecoder(resp.Body).Decode(&out)
		return resp.StatusCode, out
	}
	for _, c := range []struct{ method, path, body string }{
		{http.MethodPost, "/admin/v1/models/m/rollback", ""},
		{http.MethodPost, "/admin/v1/models/m/rollback", `{"to": 1}`},
		{http.MethodPut, "/admin/v1/models/m/pin", `{"version": 1}`},
		{http.MethodDelete, "/admin/v1/models/m/pin", ""},
	} {
		if code, out := call(c.method, c.path, c.body); code != http.StatusBadRequest || !strings.Contains(fmt.Sprint(out["error"]), "from") {
			t.Errorf("%s %s %s without from: %d %v, want 400 naming from", c.method, c.path, c.body, code, out)
		}
	}
	type answer struct {
		code int
		out  map[string]any
	}
	answers := make(chan answer, 2)
	for range 2 {
		go func() {
			code, out := call(http.MethodPost, "/admin/v1/models/m/rollback", `{"from": 2}`)
			answers <- answer{code, out}
		}()
	}
	a, b := <-answers, <-answers
	if a.code != http.StatusOK {
		a, b = b, a
	}
	if a.code != http.StatusOK || a.out["live"] != float64(1) {
		t.Errorf("the applied rollback: %d %v, want 200 describing live 1", a.code, a.out)
	}
	if b.code != http.StatusConflict || b.out["live"] != float64(1) || !strings.Contains(fmt.Sprint(b.out["error"]), "live at 1, not 2") {
		t.Errorf("the other rollback: %d %v, want 409 naming live 1", b.code, b.out)
	}
	if code, out := call(http.MethodDelete, "/admin/v1/models/m/pin?from=1", ""); code != http.StatusOK || out["live"] == nil {
		t.Errorf("unpin from the live version: %d %v", code, out)
	}
}

// TestWatchFindsVersions: with hourly scans, the manager finds by
// watching the repository a new model's directory, a version published
// into a model, and a version directory removed.
func TestWatchFindsVersions(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := repoWith(t, 1)
	fakeShards(t, cli, "s0")
	m := startWith(t, cli, repo, 1)
	if _, err := repo.Publish("n", lrModel(3), 2, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.Publish("m", lrModel(2), 4, ""); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		s := m.State()
		if n := s.Models["n"]; n == nil || n.Live != 1 || s.Models["m"].Live != 2 {
			return errors.New("the new model or version is not live yet")
		}
		return nil
	})
	if err := os.RemoveAll(repo.VersionDir("m", 1)); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() error {
		if vs := m.State().Models["m"].Versions; len(vs) != 1 || vs[0].Version != 2 {
			return fmt.Errorf("versions %+v after removing 1", vs)
		}
		return nil
	})
}

// TestManyDeltas: 200 deltas published one after another to a
// 64-partition model, with auto-prune and auto-compaction on, each going
// live: what etcd holds for the model — its state and its serving map
// record — stays under 256 KiB, compaction writes versions that go live
// (full versions here: the deltas' files outweigh this small model's),
// prune removes directories but never one a kept version needs, and
// rollback still works.
func TestManyDeltas(t *testing.T) {
	const bound = 256 << 10
	cli := testenv.Etcd(t)
	repo := loader.Repo{Dir: t.TempDir()}
	if _, err := repo.Publish("m", lrModel(1), 64, ""); err != nil {
		t.Fatal(err)
	}
	fakeShards(t, cli, "s0", "s1")
	const compactAfter = 50
	m, err := manager.Start(context.Background(), manager.Options{Repo: repo, Etcd: cli, ScanInterval: time.Hour, AutoPrune: 3, CompactAfter: compactAfter})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	n := 200
	if testenv.RaceEnabled {
		n = 60
	}
	largest := [2]int{}
	for i := 1; i <= n; i++ {
		up := &loader.Sparse{Shape: model.Shape{Type: model.LR}, Keys: []uint64{uint64(1000 + i)}, Values: []float32{float32(i)}}
		d, err := repo.PublishDelta("m", loader.Delta{Upserts: up})
		if err != nil {
			t.Fatal(err)
		}
		// As a trainer publishing every few minutes would, the next delta
		// comes after a compaction begun by this one's commit is done: once
		// this delta or a newer version is live on a chain shorter than
		// CompactAfter (a compaction starts only after the commit is seen,
		// so no compaction in flight is not enough).
		testenv.Eventually(t, 20*time.Second, func() error {
			ms := m.State().Models["m"]
			if ms == nil {
				return errors.New("model m not scanned yet")
			}
			i := slices.IndexFunc(ms.Versions, func(v manager.Version) bool { return v.Version == ms.Live })
			if ms.Live < d.Version || m.Compacting("m") || i < 0 || ms.Versions[i].Info == nil || len(ms.Versions[i].Info.Chain)-1 >= compactAfter {
				return fmt.Errorf("live %d, want %d or a compaction after it", ms.Live, d.Version)
			}
			return nil
		})
		// The model's state, and every record of its serving map.
		for i, key := range []string{topo.DefaultCluster.ManagerPrefix() + "models/m", topo.DefaultCluster.ModelKey("m")} {
			resp, err := cli.Get(context.Background(), key, clientv3.WithPrefix())
			if err != nil || len(resp.Kvs) == 0 {
				t.Fatalf("%s: %v", key, err)
			}
			for _, kv := range resp.Kvs {
				largest[i] = max(largest[i], len(kv.Value))
				if len(kv.Value) > bound {
					t.Fatalf("after delta %d, %s is %d bytes", d.Version, kv.Key, len(kv.Value))
				}
			}
		}
		// Every version the map names, and every version of their
		// chains, is still in the repository (checked against a map that
		// did not change meanwhile: a newer one may retire what an older
		// one named, and prune may then remove it).
		for {
			a := published(t, cli, "m")
			have, err := repo.Versions("m")
			if err != nil {
				t.Fatal(err)
			}
			var missing error
			for _, vi := range a.Versions {
				for _, c := range vi.Chain {
					if !slices.Contains(have, c) && missing == nil {
						missing = fmt.Errorf("version %d of the chain of %d, which the map names, was pruned", c, vi.Version)
					}
				}
			}
			if published(t, cli, "m").Seq != a.Seq {
				continue
			}
			if missing != nil {
				t.Fatal(missing)
			}
			break
		}
	}
	// Wait until nothing is on its way: a compaction the last delta began
	// may still be validated and staged (Compacting ends when its version
	// is written, before a scan has found it), and would go live under the
	// rollback below (which, expecting the live version it saw, is
	// refused).
	var s *manager.ModelState
	var vs []uint64
	testenv.Eventually(t, 30*time.Second, func() error {
		if m.Compacting("m") {
			return errors.New("compacting")
		}
		var err error
		if vs, err = repo.Versions("m"); err != nil {
			return err
		}
		s = m.State().Models["m"]
		newest := vs[len(vs)-1]
		if !slices.ContainsFunc(s.Versions, func(v manager.Version) bool { return v.Version == newest }) {
			return fmt.Errorf("version %d not scanned yet", newest)
		}
		for _, v := range s.Versions {
			switch v.Phase {
			case manager.PhaseDiscovered, manager.PhaseValidating, manager.PhaseReady, manager.PhaseStaging:
				return fmt.Errorf("version %d is %s", v.Version, v.Phase)
			}
		}
		return nil
	})
	lv := s.Versions[len(s.Versions)-1]
	t.Logf("%d deltas: state at most %d bytes, map record at most %d; %d versions in the repository, newest %d (%s), live %d",
		n, largest[0], largest[1], len(vs), vs[len(vs)-1], lv.Kind, s.Live)
	if !testenv.RaceEnabled {
		full := 0
		for _, v := range s.Versions {
			if v.Kind == "full" && v.Version > 1 {
				full++
			}
		}
		if full == 0 {
			t.Fatal("no compacted full version is kept")
		}
		if len(vs) > 3*51+3+5 {
			t.Fatalf("%d versions in the repository: auto-prune keeps at most the kept chains and 3 others", len(vs))
		}
	}
	standby := s.Standby()
	if len(standby) == 0 {
		t.Fatal("nothing to roll back to")
	}
	from := s.Live
	if _, err := m.Do(context.Background(), manager.Command{Op: manager.OpRollback, Model: "m", Expect: &from}); err != nil {
		t.Fatal(err)
	}
	if got := published(t, cli, "m"); got.Live != standby[0] {
		t.Fatalf("live %d after rolling back, want %d", got.Live, standby[0])
	}
}

// TestDamagedLiveVersion: files of the live version truncated in the
// repository are named, every one, in the version's reason, and counted
// once however often the repository is scanned again.
func TestDamagedLiveVersion(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := repoWith(t, 1)
	fakeShards(t, cli, "s0")
	reg := prometheus.NewRegistry()
	m, err := manager.Start(context.Background(), manager.Options{Repo: repo, Etcd: cli, ScanInterval: time.Hour, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	testenv.Eventually(t, 20*time.Second, func() error {
		if mm := m.State().Models["m"]; mm == nil || mm.Live != 1 {
			return errors.New("not live yet")
		}
		return nil
	})
	mf, err := repo.Manifest("m", 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []int{1, 3} {
		if err := os.Truncate(filepath.Join(repo.VersionDir("m", 1), mf.Files[p].Path), 10); err != nil {
			t.Fatal(err)
		}
	}
	counted := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range mfs {
			for _, x := range f.GetMetric() {
				if f.GetName() == "cumulus_manager_damaged_versions_total" && len(x.GetLabel()) == 1 && x.GetLabel()[0].GetValue() == "changed" {
					return x.GetCounter().GetValue()
				}
			}
		}
		return 0
	}
	for range 3 {
		m.Rescan()
		testenv.Eventually(t, 20*time.Second, func() error {
			v := m.State().Models["m"].Versions[0]
			if !v.Damaged || !strings.Contains(v.Reason, "2 files damaged") || !strings.Contains(v.Reason, mf.Files[1].Path) || !strings.Contains(v.Reason, mf.Files[3].Path) {
				return fmt.Errorf("version 1: damaged %v, reason %q", v.Damaged, v.Reason)
			}
			return nil
		})
	}
	if n := counted(); n != 1 {
		t.Fatalf("counted %v times, want once", n)
	}
	if m.State().Models["m"].Live != 1 {
		t.Fatal("the damaged live version stopped being live (shards still serve what they verified)")
	}
}

// TestReadyFollowsEtcd: a manager is ready while etcd answers it, and
// says why not once etcd is gone.
func TestReadyFollowsEtcd(t *testing.T) {
	e, err := etcdlocal.Start(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	m, err := manager.Start(context.Background(), manager.Options{Repo: loader.Repo{Dir: t.TempDir()}, Etcd: cli, ScanInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ready := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return m.Ready(ctx)
	}
	if err := ready(); err != nil {
		t.Fatalf("with etcd up: %v", err)
	}
	e.Close()
	if err := ready(); err == nil || !strings.Contains(err.Error(), "etcd does not answer") {
		t.Fatalf("with etcd gone: %v", err)
	}
}

// TestStreamCompaction: deltas small beside their model (a stream of
// pushes) are compacted into one delta on the full version, not a
// rewrite of the model; it goes live, its chain two long, and it serves
// what the chain did.
func TestStreamCompaction(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := loader.Repo{Dir: t.TempDir()}
	big := &loader.Sparse{Shape: model.Shape{Type: model.LR}}
	for k := uint64(1); k <= 50_000; k++ {
		big.Keys, big.Values = append(big.Keys, k), append(big.Values, float32(k))
	}
	if _, err := repo.Publish("m", big, 8, ""); err != nil {
		t.Fatal(err)
	}
	fakeShards(t, cli, "s0")
	m, err := manager.Start(context.Background(), manager.Options{Repo: repo, Etcd: cli, ScanInterval: time.Hour, CompactAfter: 5})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	var last uint64
	for i := 1; i <= 5; i++ {
		d, err := repo.PublishDelta("m", loader.Delta{Upserts: &loader.Sparse{Shape: model.Shape{Type: model.LR}, Keys: []uint64{uint64(i), 1 << 40}, Values: []float32{-1, float32(i)}}})
		if err != nil {
			t.Fatal(err)
		}
		last = d.Version
	}
	testenv.Eventually(t, 30*time.Second, func() error {
		s := m.State().Models["m"]
		if s == nil || s.Live <= last || m.Compacting("m") {
			if s == nil {
				return errors.New("model m not scanned yet")
			}
			return fmt.Errorf("live %d; waiting for a compaction of %d", s.Live, last)
		}
		return nil
	})
	live := m.State().Models["m"].Live
	mf, err := repo.Manifest("m", live)
	if err != nil || mf.Kind != codec.KindDelta || mf.Parent != 1 || mf.SameAs != last {
		t.Fatalf("live %d: %+v, %v; want a delta on version 1 the same as %d", live, mf, err, last)
	}
	got, err := repo.Lookup([]*codec.Manifest{mf, mustManifest(t, repo, 1)}, []uint64{1, 5, 6, 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	if got[1][0] != -1 || got[5][0] != -1 || got[6][0] != 6 || got[1<<40][0] != 5 {
		t.Fatalf("the merged chain looks up %v", got)
	}
}

func mustManifest(t *testing.T, repo loader.Repo, v uint64) *codec.Manifest {
	t.Helper()
	m, err := repo.Manifest("m", v)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
