package shard

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
)

// TestMappedSurvivesRepositoryChanges: a partition served mapped comes
// from the shard's own copy, so overwriting or truncating the
// repository's file in place afterwards changes no answer and crashes
// nothing; and the copies leave nothing behind.
func TestMappedSurvivesRepositoryChanges(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(path string, size int64) error
	}{
		{"overwrite", func(path string, size int64) error {
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			// The middle half of the file: directory and records.
			junk := make([]byte, size/2)
			for i := range junk {
				junk[i] = byte(i*131 + 7)
			}
			if _, err := f.WriteAt(junk, size/4); err != nil {
				f.Close()
				return err
			}
			return f.Close()
		}},
		{"truncate", func(path string, size int64) error { return os.Truncate(path, size/2) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dataDir := t.TempDir()
			serveDamagedRepo(t, dataDir, tc.damage)
			// The shard is closed and unreachable: once its tables are
			// collected, no mapping or open file of a copy remains, so
			// their disk space is free.
			testenv.Eventually(t, 10*time.Second, func() error {
				runtime.GC()
				if held, err := heldUnder(dataDir); err != nil || len(held) > 0 {
					return fmt.Errorf("still held: %q (%v)", held, err)
				}
				return nil
			})
		})
	}
}

// serveDamagedRepo starts a shard whose budget maps every partition,
// checks its answers, damages the repository's partition files, checks
// the answers again and closes the shard.
func serveDamagedRepo(t *testing.T, dataDir string, damage func(path string, size int64) error) {
	cli := testenv.Etcd(t)
	repo := loader.Repo{Dir: t.TempDir()}
	const spread = 0x9e3779b97f4a7c15 // odd: k*spread is a bijection
	model := &loader.Sparse{Shape: model.Shape{Type: model.LR}}
	want := map[uint64]float32{}
	for k := uint64(1); k <= 200000; k++ {
		model.Keys = append(model.Keys, k*spread)
		model.Values = append(model.Values, float32(k)/4)
		want[k*spread] = float32(k) / 4
	}
	m, err := repo.Publish("m", model, 2, "")
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(context.Background(), Options{ID: "s1", Repo: repo, Etcd: cli, MemoryBudget: 1, DataDir: dataDir})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	putMap(t, cli, repo, 2, 1, 0)
	testenv.Eventually(t, 10*time.Second, func() error {
		if v := s.snap.Load().get("m", 1); v == nil || v.layers[0] == nil || v.layers[1] == nil {
			return errors.New("version 1 not loaded")
		}
		return nil
	})
	for p, l := range s.snap.Load().get("m", 1).layers {
		if len(l) != 1 || !l[0].Mapped {
			t.Fatalf("partition %d is not served mapped: the test would not exercise mappings", p)
		}
	}
	// Served from unlinked copies in the data dir.
	if held, err := heldUnder(dataDir); err != nil || len(held) == 0 {
		t.Fatalf("no mapping or open file under the data dir: %v", err)
	}
	if ents, err := os.ReadDir(dataDir); err != nil || len(ents) > 0 {
		t.Fatalf("the data dir lists %d files (%v); the copies should be unlinked", len(ents), err)
	}

	// Every key in one batch (read by pread), a few in small batches
	// (read through the mapping), and keys that are absent.
	check := func(when string) {
		t.Helper()
		all := slices.Clone(model.Keys)
		batches := [][]uint64{all}
		for i := 0; i < len(all); i += 20011 {
			batches = append(batches, []uint64{all[i], all[i] + 1, all[(i+7919)%len(all)]})
		}
		wrong := 0
		for _, keys := range batches {
			r, err := lookup(s, 1, 2, keys)
			if err != nil {
				t.Fatalf("%s: %v", when, err)
			}
			k := 0
			for i, key := range keys {
				w, present := want[key]
				if r.Found(i) != present {
					wrong++
					continue
				}
				if present {
					if r.Value(k, 0) != w {
						wrong++
					}
					k++
				}
			}
		}
		if wrong > 0 {
			t.Fatalf("%s: %d wrong answers", when, wrong)
		}
	}
	check("before the repository changed")
	for _, f := range m.Files {
		if err := damage(filepath.Join(repo.VersionDir("m", 1), f.Path), f.Size); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := repo.ReadPartition(m, 0); !errors.Is(err, codec.ErrCorrupt) {
		t.Fatalf("the damage went unnoticed by the loader (%v): the test would not exercise it", err)
	}
	check("after the repository's files changed")
}

// heldUnder lists the files under dir (unlinked ones included) that
// this process maps or holds open, and those dir lists.
func heldUnder(dir string) ([]string, error) {
	var held []string
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		held = append(held, "listed: "+e.Name())
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return nil, err
	}
	for line := range strings.Lines(string(maps)) {
		if i := strings.Index(line, dir+"/"); i >= 0 {
			held = append(held, "mapped: "+strings.TrimSpace(line[i:]))
		}
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return nil, err
	}
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name())); err == nil && strings.HasPrefix(target, dir+"/") {
			held = append(held, "open: "+target)
		}
	}
	return held, nil
}

// Start creates the data dir and removes the copies a previous run left
// in it, and nothing else.
func TestStartClearsDataDir(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := loader.Repo{Dir: t.TempDir()}
	dataDir := filepath.Join(t.TempDir(), "shard")
	// A run that died mid-copy: how loader names its copies.
	leftover, err := func() (string, error) {
		if err := os.Mkdir(dataDir, 0o700); err != nil {
			return "", err
		}
		f, err := os.CreateTemp(dataDir, "m-1-0-*.partcopy")
		if err != nil {
			return "", err
		}
		return f.Name(), f.Close()
	}()
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dataDir, "README")
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Start(context.Background(), Options{ID: "s1", Repo: repo, Etcd: cli, DataDir: dataDir})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := os.Stat(leftover); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("leftover copy kept: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("a file that is not a copy was touched: %v", err)
	}

	// Created when missing.
	fresh := filepath.Join(t.TempDir(), "a", "b")
	s, err = Start(context.Background(), Options{ID: "s1", Repo: repo, Etcd: cli, DataDir: fresh})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if st, err := os.Stat(fresh); err != nil || !st.IsDir() {
		t.Fatalf("data dir not created: %v", err)
	}
}

func TestDataDirDefault(t *testing.T) {
	// An ID is a key under which a shard's reports sit: no '/'.
	bad := Options{ID: "rack1/s1", Repo: loader.Repo{Dir: "r"}, Etcd: new(clientv3.Client)}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), `ID "rack1/s1"`) {
		t.Fatalf("an ID with a '/': %v", err)
	}
	// Negative durations and rates are refused, not a panic at Start.
	for field, o := range map[string]Options{
		"HotInterval": {HotInterval: -time.Second},
		"LoadRate":    {LoadRate: -1},
	} {
		o.ID, o.Repo, o.Etcd = "s1", loader.Repo{Dir: "r"}, new(clientv3.Client)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), field+" must not be negative") {
			t.Fatalf("a negative %s: %v", field, err)
		}
	}
	for cluster, want := range map[topo.Cluster]string{"": "cumulus-shard-default-rack1.s1", "blue": "cumulus-shard-blue-rack1.s1"} {
		o := Options{ID: "rack1.s1", Cluster: cluster, Repo: loader.Repo{Dir: "r"}, Etcd: new(clientv3.Client)}
		if err := o.Validate(); err != nil {
			t.Fatal(err)
		}
		if want := filepath.Join(os.TempDir(), want); o.DataDir != want {
			t.Fatalf("DataDir = %q, want %q: one directory under os.TempDir() per cluster and shard", o.DataDir, want)
		}
	}
}
