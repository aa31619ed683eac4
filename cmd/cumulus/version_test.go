package main

import (
	"bytes"
	"runtime"
	"strings"
	"testing"

	"github.com/cumulus-serving/cumulus/internal/buildinfo"
)

// `cumulus --version` prints one line: "cumulus " and the build
// description, which ends in the Go version that built the binary. The
// child is this test binary, so its description is ours.
func TestVersionFlag(t *testing.T) {
	cmd := cumulus("--version")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("cumulus --version: %v\n%s%s", err, out, stderr.String())
	}
	want := "cumulus " + buildinfo.String() + "\n"
	if string(out) != want || !strings.Contains(string(out), runtime.Version()) {
		t.Fatalf("cumulus --version printed %q, want %q, naming %s", out, want, runtime.Version())
	}
}
