package main

import (
	"strings"
	"testing"
)

// bench runs a workload over each protocol of --protocol, on its own dev
// cluster, and refuses protocols it lacks an address for.
func TestBenchProtocols(t *testing.T) {
	out, err := cumulus("bench", "--workload", "small", "--params", "5000", "--shards", "2", "--concurrency", "1",
		"--requests", "3", "--protocol", "grpc,rest,rest-binary").CombinedOutput()
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	for _, p := range []string{"grpc", "rest", "rest-binary"} {
		if !strings.Contains(string(out), "small/"+p+" requests=3 errors=0 ") {
			t.Errorf("no clean run over %s:\n%s", p, out)
		}
	}
	for _, tc := range []struct{ args, want string }{
		{"--protocol quic", `unknown protocol "quic"`},
		{"--addr 127.0.0.1:1 --protocol grpc,rest", "needs --http-addr"},
		{"--http-addr 127.0.0.1:1", "--http-addr goes with --addr"},
	} {
		out, err := cumulus(append([]string{"bench"}, strings.Fields(tc.args)...)...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), tc.want) {
			t.Errorf("bench %s: %v, want an error saying %q\n%s", tc.args, err, tc.want, out)
		}
	}
}
