package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/internal/testenv"
)

// answerID finds the request id in a failed call's answer.
var answerID = regexp.MustCompile(`request id ([0-9A-Za-z._-]+)\)`)

// checkFailure asserts that a failed call's answer names none of
// internals (shard IDs, addresses, transport messages), and that its
// request id finds, in the router's log, a line with the detail (one of
// detail).
func checkFailure(t *testing.T, answer, id, routerLog string, internals, detail []string) {
	t.Helper()
	for _, s := range internals {
		if strings.Contains(answer, s) {
			t.Errorf("the answer names %q: %s", s, answer)
		}
	}
	var line string
	for _, l := range strings.Split(routerLog, "\n") {
		if strings.Contains(l, "id="+id+" ") {
			line = l
		}
	}
	if line == "" {
		t.Fatalf("no line of the router's log has request id %s:\n%s", id, routerLog)
	}
	for _, d := range detail {
		if strings.Contains(line, d) {
			return
		}
	}
	t.Errorf("the router's line for request id %s has none of %q: %s", id, detail, line)
}

// TestFailuresNameNoInternals: with the only shard killed, a client's
// failed calls, over gRPC and HTTP, are answered with their code, a
// short reason and a request id (its own KServe id, when it sent one),
// naming no shard, address or transport message; the router logs the
// detail under that id.
func TestFailuresNameNoInternals(t *testing.T) {
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	if b, err := cumulus("model", "gen", "--name", "ctr", "--repo", repo, "--params", "2000", "--partitions", "4").CombinedOutput(); err != nil {
		t.Fatalf("model gen: %v\n%s", err, b)
	}
	cli := testenv.Etcd(t)
	common := []string{"--etcd", cli.Endpoints()[0], "--log-level", "warn"}
	sh := startProcess(t, []string{"shard s0 serving on "}, append([]string{"shard", "--id", "s0", "--repo", repo, "--addr", "127.0.0.1:0",
		"--data-dir", filepath.Join(dir, "s0")}, common...)...)
	startProcess(t, []string{"admin: http://"}, append([]string{"manager", "--repo", repo, "--admin-addr", "127.0.0.1:0", "--admin-token", "t"}, common...)...)
	rt := startProcess(t, []string{"http: http://", "grpc: "}, append([]string{"router", "--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0"}, common...)...)
	shardAddr := sh.out["shard s0 serving on "]
	rows := filepath.Join(dir, "rows.svm")
	if err := os.WriteFile(rows, []byte("1 1:1 7:1 99:1\n0 3:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	predict := func() (string, error) {
		out, err := cumulus("predict", rows, "--addr", rt.out["grpc: "], "--model", "ctr").CombinedOutput()
		return string(out), err
	}
	infer := func(id string) (int, http.Header, map[string]string) {
		body := `{"inputs":[{"name":"ids","datatype":"INT64","shape":[2],"data":[1,7]},{"name":"row_splits","datatype":"INT64","shape":[2],"data":[0,2]}]}`
		if id != "" {
			body = `{"id":"` + id + `",` + body[1:]
		}
		resp, err := http.Post("http://"+rt.out["http: http://"]+"/v2/models/ctr/infer", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]string
		json.Unmarshal(b, &m)
		return resp.StatusCode, resp.Header, m
	}
	testenv.Eventually(t, 60*time.Second, func() error {
		if out, err := predict(); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})

	sh.cmd.Process.Kill()
	<-sh.exited
	internals := []string{"s0", shardAddr, "127.0.0.1", "connection refused", "dial", "transport"}
	detail := []string{shardAddr, "s0"}
	// Until the shard's registration expires the router still calls it:
	// these answers have detail to hide.
	var grpcAnswer string
	testenv.Eventually(t, 30*time.Second, func() error {
		out, err := predict()
		if err == nil {
			return fmt.Errorf("answered with the only shard killed: %s", out)
		}
		if !strings.Contains(out, "unavailable (request id ") {
			return fmt.Errorf("not a partition's failure yet: %s", out)
		}
		grpcAnswer = out
		return nil
	})
	m := answerID.FindStringSubmatch(grpcAnswer)
	if m == nil || !strings.Contains(grpcAnswer, "code = Unavailable") {
		t.Fatalf("gRPC answer without its code or request id: %s", grpcAnswer)
	}
	testenv.Eventually(t, 10*time.Second, func() error {
		if !strings.Contains(rt.stderr.String(), "id="+m[1]+" ") {
			return fmt.Errorf("not logged yet")
		}
		return nil
	})
	t.Logf("gRPC answer: %s", grpcAnswer)
	checkFailure(t, grpcAnswer, m[1], rt.stderr.String(), internals, detail)

	for _, clientID := range []string{"client-request-7", ""} {
		code, hdr, body := infer(clientID)
		if code == http.StatusOK {
			t.Fatalf("HTTP: answered with the only shard killed: %v", body)
		}
		id := body["id"]
		if id == "" || hdr.Get("X-Request-Id") != id || clientID != "" && id != clientID {
			t.Fatalf("HTTP %d: request id %q in the body, %q in the header; the client sent %q", code, id, hdr.Get("X-Request-Id"), clientID)
		}
		raw, _ := json.Marshal(body)
		t.Logf("HTTP %d answer: %s", code, raw)
		if strings.Contains(body["error"], "unavailable") && bytes.Contains(raw, []byte("partition")) {
			testenv.Eventually(t, 10*time.Second, func() error {
				if !strings.Contains(rt.stderr.String(), "id="+id+" ") {
					return fmt.Errorf("not logged yet")
				}
				return nil
			})
			checkFailure(t, string(raw), id, rt.stderr.String(), internals, detail)
		} else {
			for _, s := range internals {
				if strings.Contains(string(raw), s) {
					t.Errorf("HTTP answer names %q: %s", s, raw)
				}
			}
		}
	}
}

// logOf is what a process has logged so far.
func logOf(p *process) string { return p.stderr.String() }
