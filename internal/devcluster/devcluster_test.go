package devcluster_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/internal/devcluster/devclustertest"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/manager"
	"github.com/cumulus-serving/cumulus/model"
)

// Shard N keeps its copies of mapped partitions in DataDir/shard-N, next
// to etcd's DataDir/etcd.
func TestShardDataDirs(t *testing.T) {
	repo := loader.Repo{Dir: t.TempDir()}
	m := &loader.Sparse{Shape: model.Shape{Type: model.LR}}
	for k := uint64(1); k <= 1000; k++ {
		m.Keys = append(m.Keys, k)
		m.Values = append(m.Values, float32(k))
	}
	if _, err := repo.Publish("m", m, 4, ""); err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	// A budget of one byte: every partition is served mapped.
	c := devclustertest.Start(t, devcluster.Options{Repo: repo.Dir, DataDir: dataDir, Shards: 2, MemoryBudget: 1, ScanInterval: time.Hour})
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "etcd")); err != nil {
		t.Errorf("etcd's data: %v", err)
	}
	total := 0
	for i, s := range c.Shards {
		dir := filepath.Join(dataDir, fmt.Sprintf("shard-%d", i))
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			t.Fatalf("shard %d's data dir: %v", i, err)
		}
		holds := 0
		for _, l := range s.Loaded() {
			holds += len(l.Have)
		}
		total += holds
		if mapped := strings.Count(string(maps), dir+"/"); (mapped > 0) != (holds > 0) {
			t.Errorf("%s holds %d partitions and maps %d files from %s", s.ID(), holds, mapped, dir)
		}
	}
	if total < 4 {
		t.Fatalf("the shards hold %d of 4 partitions once ready", total)
	}
}

// TestStartFailsCleanly: a cluster whose manager refuses its options
// (here a CompactAfter at the loader's chain cap) returns the refusal,
// having stopped what it started and removed its temporary directory;
// it used to panic closing a nil cluster.
func TestStartFailsCleanly(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	c, err := devcluster.Start(context.Background(), devcluster.Options{Repo: t.TempDir(), Shards: 1,
		Manager: func(o *manager.Options) { o.CompactAfter = loader.MaxChain }})
	if c != nil || err == nil || !strings.Contains(err.Error(), "CompactAfter") {
		t.Fatalf("cluster %v, error %v; want the manager's refusal", c, err)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left behind in the temporary directory: %v", left)
	}
}
