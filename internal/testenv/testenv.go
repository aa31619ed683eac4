// Package testenv holds helpers shared by tests: finding external tools
// and waiting on conditions with deadlines instead of sleeping.
package testenv

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// Tool returns the path of an external program the test needs. Missing,
// the test is skipped, unless CUMULUS_REQUIRE_TOOLS=1 (as scripts/test.sh
// sets), where it fails: CI never passes by skipping.
func Tool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CUMULUS_REQUIRE_TOOLS") == "1" {
		t.Fatalf("%s is not installed; scripts/test.sh installs it", name)
	}
	t.Skipf("%s is not installed; run scripts/test.sh to install it", name)
	return ""
}

// Eventually polls cond until it returns nil or the deadline passes, and
// then fails with cond's last error.
func Eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	wait := time.Millisecond
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met after %v: %v", timeout, err)
		}
		time.Sleep(wait)
		wait = min(2*wait, 100*time.Millisecond)
	}
}
