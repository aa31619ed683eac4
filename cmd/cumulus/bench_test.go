package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/server/kservepb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
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

// TestBenchRequest: bench request writes a rank200 request another tool
// can send as it is: a dev cluster scores its 200 rows.
func TestBenchRequest(t *testing.T) {
	repo := filepath.Join(t.TempDir(), "repo")
	if b, err := cumulus("model", "gen", "--name", "ctr", "--repo", repo, "--params", "20000", "--partitions", "4").CombinedOutput(); err != nil {
		t.Fatalf("model gen: %v\n%s", err, b)
	}
	raw, err := cumulus("bench", "request", "--repo", repo, "--model", "ctr").Output()
	if err != nil {
		t.Fatalf("bench request: %v", err)
	}
	var req kservepb.ModelInferRequest
	if err := proto.Unmarshal(raw, &req); err != nil {
		t.Fatalf("bench request wrote %d bytes that are no ModelInferRequest: %v", len(raw), err)
	}
	dev := startProcess(t, []string{"grpc: ", "ready"}, "dev", "--repo", repo, "--shards", "2", "--http-addr", "127.0.0.1:0",
		"--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--admin-token", "t", "--log-level", "warn")
	conn, err := grpc.NewClient(dev.out["grpc: "], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := kservepb.NewGRPCInferenceServiceClient(conn).ModelInfer(t.Context(), &req)
	if err != nil {
		t.Fatal(err)
	}
	if scores, err := bench.Scores(resp); err != nil || len(scores) != 200 {
		t.Errorf("%d scores, %v; want 200 (rank200)", len(scores), err)
	}
	for _, c := range [][]string{{"--repo", repo}, {"--repo", repo, "--model", "ctr", "--workload", "huge"}, {"--repo", repo, "--model", "nope"}} {
		if out, err := cumulus(append([]string{"bench", "request"}, c...)...).CombinedOutput(); err == nil {
			t.Errorf("bench request %v: no error\n%.200s", c, out)
		}
	}
}

// TestBenchRollback: bench rollback runs its rollouts, rollbacks and
// delta under load on a dev cluster and pools the windows of each kind:
// two rollouts' stagings; two rollouts, two rollbacks (--rounds 1) and a
// delta going live, each pool of those holding requests.
func TestBenchRollback(t *testing.T) {
	out, err := cumulus("bench", "rollback", "--params", "20000", "--partitions", "4", "--rounds", "1", "--delta-keys", "100",
		"--settle", "300ms", "--warm", "300ms", "--rate", "100").CombinedOutput()
	if err != nil {
		t.Fatalf("bench rollback: %v\n%s", err, out)
	}
	for _, want := range []string{"rollouts: 2 stagings", "rollouts: 2 going live", "rollbacks: 2 going live", "deltas: 1 going live", "all 5 going live"} {
		i := strings.Index(string(out), want)
		if i < 0 {
			t.Errorf("no %q line:\n%s", want, out)
			continue
		}
		// A staging of a model this small may fall between two requests.
		line, _, _ := strings.Cut(string(out[i:]), "\n")
		if strings.Contains(line, "going live") && strings.Contains(line, "requests=0 ") {
			t.Errorf("an empty pool: %s\n%s", line, out)
		}
	}
}
