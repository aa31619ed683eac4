package raftstore

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// The crash workload's child: with RAFTSTORE_CRASH_DIR set, the test
// binary is a process that appends to the store there until it is
// killed (see TestCrashWorkload).
func TestMain(m *testing.M) {
	if dir := os.Getenv("RAFTSTORE_CRASH_DIR"); dir != "" {
		seed, _ := strconv.ParseUint(os.Getenv("RAFTSTORE_CRASH_SEED"), 10, 64)
		if err := appendUntilKilled(dir, seed); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	os.Exit(m.Run())
}

// appendUntilKilled appends batches of entry(i) after the last stored,
// records the last index in the stable store, and now and then deletes
// all but the last 100 entries, as raft compacts behind a snapshot. It
// prints "acked N" once both writes of a batch ending at N returned,
// "deleting N" before a deletion up to N, and never stops by itself.
func appendUntilKilled(dir string, seed uint64) error {
	s, err := Open(dir)
	if err != nil {
		return err
	}
	last, err := s.LastIndex()
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	for {
		if first, _ := s.FirstIndex(); rng.IntN(8) == 0 && last > first+100 {
			fmt.Printf("deleting %d\n", last-100)
			if err := s.DeleteRange(first, last-100); err != nil {
				return err
			}
		}
		n := 1 + uint64(rng.IntN(64))
		if err := s.StoreLogs(entries(last+1, last+n)); err != nil {
			return err
		}
		last += n
		if err := s.SetUint64([]byte("last"), last); err != nil {
			return err
		}
		fmt.Printf("acked %d\n", last)
	}
}

// TestCrashWorkload: a process appending to the store is killed (SIGKILL)
// at a random moment, again and again, each time resuming from what the
// store holds. After every kill, nothing acknowledged is lost: the log is
// whole and intact from its first index to its last, which is at least
// the last acknowledged; the stable value written with it is too; and
// the first index is no later than the deletions asked for allow. (A
// killed process loses what it had not handed to the kernel; what a
// power cut loses depends on the syncs, which no test here can cut.)
func TestCrashWorkload(t *testing.T) {
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(42, 42))
	var acked, deleting uint64
	for cycle := range 8 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "RAFTSTORE_CRASH_DIR="+dir, fmt.Sprintf("RAFTSTORE_CRASH_SEED=%d", cycle))
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		killAt := 10 + rng.IntN(150)
		lines := bufio.NewScanner(out)
		seen := 0
		for lines.Scan() {
			// Lines written before the kill still arrive: each counts.
			f := strings.Fields(lines.Text())
			n, err := strconv.ParseUint(f[len(f)-1], 10, 64)
			if err != nil {
				t.Fatalf("cycle %d: child printed %q", cycle, lines.Text())
			}
			switch f[0] {
			case "acked":
				acked = max(acked, n)
				if seen++; seen == killAt {
					cmd.Process.Kill()
				}
			case "deleting":
				deleting = max(deleting, n)
			}
		}
		err = cmd.Wait()
		if seen < killAt {
			t.Fatalf("cycle %d: the child stopped by itself after %d batches: %v\n%s", cycle, seen, err, stderr.String())
		}

		s := open(t, dir)
		first, last := edges(t, s)
		if last < acked {
			t.Fatalf("cycle %d: last index %d after a kill; %d was acknowledged", cycle, last, acked)
		}
		if first > deleting+1 {
			t.Fatalf("cycle %d: first index %d; no deletion past %d was asked for", cycle, first, deleting)
		}
		for i := first; i <= last; i++ {
			checkLog(t, s, i)
		}
		v, err := s.GetUint64([]byte("last"))
		if err != nil || v < acked || v > last {
			t.Fatalf("cycle %d: stable value %d (%v); acknowledged %d, last index %d", cycle, v, err, acked, last)
		}
		// last > acked: the kill came between a batch's sync and its
		// acknowledgement (or mid-way through the next batch).
		t.Logf("cycle %d: killed after %d batches; log %d to %d, %d acknowledged", cycle, seen, first, last, acked)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
