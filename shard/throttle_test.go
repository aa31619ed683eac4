package shard

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
)

// publishLoadTest publishes model m, 4 partitions of about 1.5 MiB.
func publishLoadTest(t *testing.T) loader.Repo {
	repo := loader.Repo{Dir: t.TempDir()}
	sp := &loader.Sparse{Shape: model.Shape{Type: model.LR}}
	for k := range uint64(1 << 19) {
		sp.Keys = append(sp.Keys, k*2654435761+1)
		sp.Values = append(sp.Values, float32(k%7))
	}
	if _, err := repo.Publish("m", sp, 4, ""); err != nil {
		t.Fatal(err)
	}
	return repo
}

// startThrottled starts shard s1 loading at 1 MiB/s once it serves.
func startThrottled(t *testing.T, cli *clientv3.Client, repo loader.Repo) *Shard {
	s, err := Start(context.Background(), Options{ID: "s1", Repo: repo, Etcd: cli, DataDir: t.TempDir(), LoadRate: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// TestLoadRateNotBeforeServing: a shard that has answered no lookup (it
// is starting, or joining) loads at full speed: its throttle's bucket is
// untouched after 6 MiB.
func TestLoadRateNotBeforeServing(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := publishLoadTest(t)
	s := startThrottled(t, cli, repo)
	putMap(t, cli, repo, 4, 1, 0)
	testenv.Eventually(t, 30*time.Second, func() error {
		if l := s.Loaded(); len(l) == 0 || len(l[0].Have) < 4 {
			return errors.New("not yet")
		}
		return nil
	})
	if tokens := s.opts.Repo.Throttle.Tokens(); tokens < 1<<20-1 {
		t.Fatalf("loading before serving took turns: %v bytes left of 1 MiB", tokens)
	}
}

// TestLoadRateYieldsToNewerMap: a shard that serves loads at its
// LoadRate, and a newer map (here withdrawing the version being loaded)
// is taken between two partitions, not after the whole version.
func TestLoadRateYieldsToNewerMap(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := publishLoadTest(t)
	// About 1.5 MiB a partition, read at 1 MiB/s once serving.
	s := startThrottled(t, cli, repo)
	s.Lookup(context.Background(), []byte("not a request")) // it has been asked: it serves
	putMap(t, cli, repo, 4, 0, 1)
	testenv.Eventually(t, 30*time.Second, func() error {
		if len(s.Loaded()) == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	writeMap(t, cli, []byte(`{"schema":1,"model":"m","seq":2,"partitions":4,"replicas":[[],[],[],[]]}`))
	testenv.Eventually(t, 30*time.Second, func() error {
		if len(s.Loaded()) > 0 {
			return errors.New("not yet")
		}
		return nil
	})
	if n := testutil.ToFloat64(s.metrics.loads); n >= 4 {
		t.Fatalf("%v partitions loaded: the withdrawn version was loaded whole before the newer map was read", n)
	}
}

// TestLoadTurn: a shard given a LoadTurn another shard of its process
// holds loads nothing until that shard's load ends, then loads all.
func TestLoadTurn(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := publishLoadTest(t)
	turn := make(chan struct{}, 1)
	turn <- struct{}{} // another shard's load, under way
	asked := make(chan uint32, 4)
	s, err := Start(context.Background(), Options{ID: "s1", Repo: repo, Etcd: cli, DataDir: t.TempDir(), LoadTurn: turn,
		BeforeLoad: func(_ context.Context, _ string, _ uint64, p uint32) error { asked <- p; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	putMap(t, cli, repo, 4, 1, 0)
	select {
	case <-asked: // at the first load, waiting for its turn
	case <-time.After(30 * time.Second):
		t.Fatal("the shard never began to load")
	}
	// Without the turn, the first partition loads in milliseconds and
	// the second is asked for.
	select {
	case p := <-asked:
		t.Fatalf("partition %d asked for while another shard held the turn", p)
	case <-time.After(300 * time.Millisecond):
	}
	if l := s.Loaded(); len(l) > 0 && len(l[0].Have) > 0 {
		t.Fatalf("loaded %v while another shard held the turn", l[0].Have)
	}
	<-turn // that load ends
	testenv.Eventually(t, 30*time.Second, func() error {
		if l := s.Loaded(); len(l) == 0 || len(l[0].Have) < 4 {
			return errors.New("not yet")
		}
		return nil
	})
	if len(turn) != 0 {
		t.Fatal("the shard kept the turn after loading")
	}
}

// TestLoadTurnClose: a shard waiting for the turn another shard holds
// closes at once, without loading.
func TestLoadTurnClose(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := publishLoadTest(t)
	turn := make(chan struct{}, 1)
	turn <- struct{}{} // another shard's load, under way for ever
	asked := make(chan uint32, 4)
	s, err := Start(context.Background(), Options{ID: "s1", Repo: repo, Etcd: cli, DataDir: t.TempDir(), LoadTurn: turn,
		BeforeLoad: func(_ context.Context, _ string, _ uint64, p uint32) error { asked <- p; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	putMap(t, cli, repo, 4, 1, 0)
	select {
	case <-asked:
	case <-time.After(30 * time.Second):
		t.Fatal("the shard never began to load")
	}
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for another shard's turn")
	}
	if len(turn) != 1 {
		t.Fatal("the turn changed hands")
	}
}

// TestDefaultDataDirRemoved: a shard given no DataDir makes its own in
// the temporary directory and removes it when it closes; a shard refused
// its name does not remove it.
func TestDefaultDataDirRemoved(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := publishLoadTest(t)
	s, err := Start(context.Background(), Options{ID: "tmp-dir-test", Repo: repo, Etcd: cli})
	if err != nil {
		t.Fatal(err)
	}
	dir := s.opts.DataDir
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		s.Close()
		t.Fatalf("default data dir %s: %v", dir, err)
	}
	// A second shard of the same name is refused, and leaves the
	// directory to the one that has the name.
	if s2, err := Start(context.Background(), Options{ID: "tmp-dir-test", Repo: repo, Etcd: cli}); err == nil {
		s2.Close()
		s.Close()
		t.Fatal("a second shard of the same name started")
	}
	if _, err := os.Stat(dir); err != nil {
		s.Close()
		t.Fatalf("a refused shard of the same name removed the data dir: %v", err)
	}
	s.Close()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("default data dir %s left behind: %v", dir, err)
	}
}

// TestStartingStops: a shard still registering gives up once its
// Starting context ends (a SIGTERM to a process whose etcd is out of
// reach, or whose ID another live shard holds), and leaves the holder
// registered.
func TestStartingStops(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := publishLoadTest(t)
	holder, err := Start(context.Background(), Options{ID: "s1", Repo: repo, Etcd: cli, DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	gone, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer gone.Close()
	for name, etcd := range map[string]*clientv3.Client{"its ID held": cli, "etcd out of reach": gone} {
		starting, stop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			s, err := Start(context.Background(), Options{ID: "s1", Repo: repo, Etcd: etcd, DataDir: t.TempDir(), Starting: starting})
			if err == nil {
				s.Close()
			}
			done <- err
		}()
		stop()
		select {
		case err := <-done:
			if err == nil || !errors.Is(err, context.Canceled) {
				t.Errorf("%s: Start after Starting ended: %v", name, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: Start still registering 10s after Starting ended", name)
		}
	}
	resp, err := cli.Get(context.Background(), holder.opts.Cluster.ShardKey("s1"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the holder's registration: %v %v", resp, err)
	}
}
