package manager_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/manager"
	"github.com/cumulus-serving/cumulus/model"
)

// TestPublishesAtOnce: a router watching the assignments must see the
// serving map change whole. If it could see one model assigned before
// another, it would call itself ready with a model still missing.
func TestPublishesAtOnce(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := loader.Repo{Dir: t.TempDir()}
	const models = 6
	for i := range models {
		m := &loader.Sparse{Shape: model.Shape{Type: model.LR}, Keys: []uint64{1, 2, 3}, Values: []float32{0.1, 0.2, 0.3}}
		if _, err := repo.Publish(fmt.Sprintf("m%d", i), m, 2, "test"); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The manager only reads registrations: a record is enough.
	info, _ := json.Marshal(topo.ShardInfo{Schema: topo.Schema, ID: "s0", Addr: "127.0.0.1:1"})
	if _, err := cli.Put(ctx, topo.DefaultCluster.ShardKey("s0"), string(info)); err != nil {
		t.Fatal(err)
	}
	sizes := make(chan int, 100)
	go topo.Watch(ctx, cli, topo.DefaultCluster.ModelsPrefix(), func(kv map[string][]byte, _ int64) {
		sizes <- len(topo.Assignments(kv, topo.DefaultCluster))
	})
	if n := <-sizes; n != 0 {
		t.Fatalf("%d assignments before the manager started", n)
	}
	m, err := manager.Start(ctx, manager.Options{Repo: repo, Etcd: cli, ScanInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	testenv.Eventually(t, 30*time.Second, func() error {
		select {
		case n := <-sizes:
			if n != models {
				t.Fatalf("a watcher saw %d of %d models assigned", n, models)
			}
			return nil
		default:
			return fmt.Errorf("no assignment yet")
		}
	})
}

// TestCompactAfterBound: CompactAfter defaults to 500 and must stay below
// the longest chain the loader accepts, or a chain could never be
// compacted before deltas on it are refused.
func TestCompactAfterBound(t *testing.T) {
	o := manager.Options{Repo: loader.Repo{Dir: t.TempDir()}, Etcd: &clientv3.Client{}}
	if err := o.Validate(); err != nil || o.CompactAfter != 500 {
		t.Fatalf("default: CompactAfter %d, %v", o.CompactAfter, err)
	}
	o.CompactAfter = loader.MaxChain
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "at most 1000 deltas") {
		t.Errorf("CompactAfter %d accepted: %v", loader.MaxChain, err)
	}
	o.CompactAfter = loader.MaxChain - 1
	if err := o.Validate(); err != nil {
		t.Errorf("CompactAfter %d: %v", loader.MaxChain-1, err)
	}
}
