package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/topo"
)

// TestIdleClusterStaysQuiet: an idle `cumulus dev` stays idle after the
// two ways it was once made to spin — a shard serving another
// repository's model of the same name joins it; the live version's
// directory is removed and a shard joins and leaves, so that loads fail
// and partitions move back. After each, over 10 s, the processes use
// under a second of CPU together and etcd's revision moves by at most a
// few writes (it once moved by thousands a second, with a core busy).
func TestIdleClusterStaysQuiet(t *testing.T) {
	dir := t.TempDir()
	repo, other := filepath.Join(dir, "models"), filepath.Join(dir, "other")
	for _, g := range [][]string{{repo, "1"}, {repo, "2"}, {other, "8"}, {other, "9"}} {
		if out, err := cumulus("model", "gen", "--name", "m", "--type", "lr", "--params", "20000", "--partitions", "8", "--seed", g[1], "--repo", g[0]).CombinedOutput(); err != nil {
			t.Fatalf("model gen: %v\n%s", err, out)
		}
	}
	dev := startDev(t, repo)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{dev.etcd}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	registration := func(id string) string {
		resp, err := cli.Get(context.Background(), topo.DefaultCluster.ShardKey(id))
		if err != nil || len(resp.Kvs) == 0 {
			return ""
		}
		return string(resp.Kvs[0].Value)
	}

	// (a) A shard whose repository holds other weights under the name.
	foreign := startShard(t, "foreign-0", other, dev.etcd)
	testenv.Eventually(t, 30*time.Second, func() error {
		if !strings.Contains(registration("foreign-0"), `"mismatched"`) {
			return fmt.Errorf("foreign-0 reports no mismatch yet: %s", registration("foreign-0"))
		}
		return nil
	})
	quiet(t, "a foreign shard joined", cli, dev.pid, foreign.Process.Pid)
	stopShard(t, foreign)

	// (b) The live version's directory removed; a shard joins, is
	// assigned partitions it cannot load, and leaves.
	if err := os.RemoveAll(filepath.Join(repo, "m", "2")); err != nil {
		t.Fatal(err)
	}
	extra := startShard(t, "extra-0", repo, dev.etcd)
	testenv.Eventually(t, 30*time.Second, func() error {
		if !strings.Contains(registration("extra-0"), `"errors"`) {
			return fmt.Errorf("extra-0 has not failed a load yet: %s", registration("extra-0"))
		}
		return nil
	})
	stopShard(t, extra)
	quiet(t, "a shard came and went with the live version's files gone", cli, dev.pid)
}

// quiet measures, over 10 s, the CPU time of pids and the etcd revision,
// and fails if either shows a busy idle cluster.
func quiet(t *testing.T, after string, cli *clientv3.Client, pids ...int) {
	t.Helper()
	rev := func() int64 {
		resp, err := cli.Get(context.Background(), "/cumulus/idle-probe")
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	cpu := func() (ticks int64) {
		for _, pid := range pids {
			ticks += cpuTicks(t, pid)
		}
		return ticks
	}
	// Let what the event itself set off (moves, loads, reports) finish:
	// the revision stands still for a second.
	testenv.Eventually(t, 30*time.Second, func() error {
		r := rev()
		time.Sleep(time.Second)
		if now := rev(); now != r {
			return fmt.Errorf("etcd still changing: %d writes in a second", now-r)
		}
		return nil
	})
	r0, c0 := rev(), cpu()
	time.Sleep(10 * time.Second)
	r1, c1 := rev(), cpu()
	t.Logf("after %s: %d etcd revisions and %.2f s of CPU in 10 s", after, r1-r0, float64(c1-c0)/100)
	if r1-r0 > 10 || c1-c0 > 100 {
		t.Errorf("after %s the idle cluster is busy: %d etcd revisions and %.2f s of CPU in 10 s", after, r1-r0, float64(c1-c0)/100)
	}
}

// cpuTicks is utime+stime of a process, in clock ticks (1/100 s).
func cpuTicks(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:])) // after "pid (comm) "
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}

// startShard runs `cumulus shard`; the test stops it if it has not.
func startShard(t *testing.T, id, repo, etcd string) *exec.Cmd {
	t.Helper()
	cmd := cumulus("shard", "--id", id, "--repo", repo, "--etcd", etcd, "--data-dir", t.TempDir(), "--log-level", "warn", "--drain-timeout", "2s")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// stopShard stops a shard with SIGTERM and waits for it.
func stopShard(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	cmd.Process.Signal(os.Interrupt)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("a shard did not stop within 20s of SIGTERM")
	}
}
