package manager

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/internal/raftgroup"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/loader"
)

// BenchmarkGroupApply: entries committed and applied by a three-member
// group on loopback (pebble on disk, synced), as the leader's decisions
// are: one model's state and an audit entry each, from 64 callers at once
// (raft batches what arrives together). One op is one entry; entries/s
// is reported.
func BenchmarkGroupApply(b *testing.B) {
	dir := b.TempDir()
	var fsms []*replicated
	start := func(id string, peers []raftgroup.Peer) *raftgroup.Group {
		fsm := newReplicated(AuditRetention{Keep: 1000})
		g, err := raftgroup.Start(raftgroup.Config{ID: id, Addr: "127.0.0.1:0", Dir: filepath.Join(dir, id), Peers: peers, FSM: fsm})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { g.Close() })
		fsms = append(fsms, fsm)
		return g
	}
	a := start("a", []raftgroup.Peer{{ID: "a"}})
	testenv.Eventually(b, 10*time.Second, func() error {
		if !a.Leading() {
			return fmt.Errorf("a does not lead")
		}
		return nil
	})
	ctx := context.Background()
	for _, id := range []string{"b", "c"} {
		g := start(id, nil)
		if err := a.Add(ctx, id, g.Addr()); err != nil {
			b.Fatal(err)
		}
	}
	at := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	entries := make([][]byte, 64)
	for i := range entries {
		name := fmt.Sprintf("m%d", i)
		entries[i] = entryJSON(b, change{states: map[string][]byte{name: modelJSON(b, name, uint64(i))},
			audit: []AuditEntry{{Time: at, Op: "pin", Model: name, Version: 1, Result: "ok"}}}, nil, at)
	}
	b.SetBytes(int64(len(entries[0])))
	b.ResetTimer()
	t0 := time.Now()
	var wg sync.WaitGroup
	next := make(chan int)
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				if _, err := a.Apply(ctx, entries[w]); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	for i := range b.N {
		next <- i
	}
	close(next)
	wg.Wait()
	// Until every member has applied them all.
	_, done := fsms[0].view()
	testenv.Eventually(b, 30*time.Second, func() error {
		for i, f := range fsms[1:] {
			if _, applied := f.view(); applied < done {
				return fmt.Errorf("member %d has applied %d of %d", i+1, applied, done)
			}
		}
		return nil
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "entries/s")
}

// BenchmarkAdminWrite: an operator's change (a cordon, then its undoing)
// asked of the leader of three raft managers through its admin API (HTTP
// on loopback), answered once committed; one after another. ns/op is the
// mean; p50 and p99 are reported.
func BenchmarkAdminWrite(b *testing.B) {
	cli := testenv.Etcd(b)
	dir := b.TempDir()
	repo := b.TempDir()
	var ms []*Manager
	start := func(id string, peers []raftgroup.Peer) *Manager {
		m, err := Start(context.Background(), Options{Repo: loader.Repo{Dir: repo}, Etcd: cli, ScanInterval: time.Hour,
			Raft: &RaftOptions{ID: id, Addr: "127.0.0.1:0", Dir: filepath.Join(dir, id), Peers: peers}})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(m.Close)
		ms = append(ms, m)
		return m
	}
	a := start("a", []raftgroup.Peer{{ID: "a"}})
	ctx := context.Background()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := a.WaitLeading(wctx); err != nil {
		b.Fatal(err)
	}
	for _, id := range []string{"b", "c"} {
		m := start(id, nil)
		if err := a.Group().Add(ctx, id, m.Group().Addr()); err != nil {
			b.Fatal(err)
		}
	}
	srv, err := a.ServeAdmin(AdminOptions{Addr: "127.0.0.1:0", Token: "t"})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	url := "http://" + srv.Addr() + "/admin/v1/shards/bench/cordon"
	client := &http.Client{}
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		method := http.MethodPost
		if i%2 == 1 {
			method = http.MethodDelete
		}
		req, _ := http.NewRequest(method, url, nil)
		req.Header.Set("Authorization", "Bearer t")
		t0 := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("%s %s: %s", method, url, resp.Status)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
}
