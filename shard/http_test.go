package shard

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/loader"
)

func TestHTTPSurface(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := loader.Repo{Dir: t.TempDir()}
	if _, err := repo.Publish("m", testModel(1), 2, ""); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s, err := Start(context.Background(), Options{ID: "s1", Repo: repo, Etcd: cli, DataDir: t.TempDir(), Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	srv := httptest.NewServer(s.HTTPHandler("sesame", reg))
	defer srv.Close()
	call := func(method, path, token, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := call("GET", "/healthz", "", ""); code != 200 {
		t.Errorf("healthz: %d", code)
	}
	putMap(t, cli, repo, 2, 1, 0)
	testenv.Eventually(t, 30*time.Second, func() error {
		if _, err := lookup(s, 1, 2, []uint64{1, 2, 3}); err != nil {
			return err
		}
		if code, body := call("GET", "/readyz", "", ""); code != 200 {
			return errors.New(body)
		}
		return nil
	})
	for _, tc := range []struct {
		method, path, token, body string
		code                      int
		says                      string
	}{
		{"PUT", "/admin/v1/fault", "", `{"spec": "stall"}`, 401, "token"},
		{"PUT", "/admin/v1/fault", "open", `{"spec": "stall"}`, 401, "token"},
		{"GET", "/admin/v1/fault", "", "", 401, "token"},
		{"PUT", "/admin/v1/fault", "sesame", `{"spec": "slow"}`, 400, "unknown kind"},
		{"PUT", "/admin/v1/fault", "sesame", `{"spec": "stall", "x": 1}`, 400, "unknown field"},
		{"PUT", "/admin/v1/fault", "sesame", `not json`, 400, "body must be"},
		{"PUT", "/admin/v1/fault", "sesame", `{"spec": "stall"} {"spec": ""}`, 400, "body must be"},
		{"PUT", "/admin/v1/fault", "sesame", `{"spec": "` + strings.Repeat("stall;", 1000) + `"}`, 400, "over the limit"},
		{"PUT", "/admin/v1/fault", "sesame", `{"spec": "` + strings.Repeat("stall;", 100_000) + `"}`, 400, "too large"},
		{"POST", "/admin/v1/other", "sesame", ``, 404, "no admin call"},
		{"GET", "/nothing", "", ``, 404, "no such path"},
		{"PUT", "/admin/v1/fault", "sesame", `{"spec": "error=unavailable"}`, 200, "error=unavailable"},
		{"GET", "/admin/v1/fault", "sesame", "", 200, "error=unavailable"},
	} {
		if code, body := call(tc.method, tc.path, tc.token, tc.body); code != tc.code || !strings.Contains(body, tc.says) {
			t.Errorf("%s %s (token %q) %.40s: %d %s, want %d saying %q", tc.method, tc.path, tc.token, tc.body, code, body, tc.code, tc.says)
		}
	}
	keys := []uint64{1, 2, 3}
	if _, err := lookup(s, 1, 2, keys); status.Code(err) != codes.Unavailable {
		t.Errorf("lookup with error=unavailable injected: %v", err)
	}
	if _, body := call("GET", "/metrics", "", ""); !strings.Contains(body, `cumulus_shard_faults_injected_total{kind="error",shard="s1"} 1`) {
		t.Errorf("metrics do not count the injected fault:\n%s", body)
	}
	if code, body := call("PUT", "/admin/v1/fault", "sesame", `{"spec": ""}`); code != 200 || s.Faults() != nil {
		t.Errorf("clearing: %d %s, faults %v", code, body, s.Faults())
	}
	if _, err := lookup(s, 1, 2, keys); err != nil {
		t.Errorf("lookup once cleared: %v", err)
	}
	// Without a token, admin calls are refused, whatever is sent.
	open := httptest.NewServer(s.HTTPHandler("", nil))
	defer open.Close()
	req, _ := http.NewRequest("PUT", open.URL+"/admin/v1/fault", strings.NewReader(`{"spec":"stall"}`))
	req.Header.Set("Authorization", "Bearer ")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 401 {
		t.Errorf("no token configured: %v %v, want 401", resp.StatusCode, err)
	}
	if s.Faults() != nil {
		t.Error("a fault was set without a token")
	}
	// A draining shard is not ready.
	if err := s.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code, _ := call("GET", "/readyz", "", ""); code != 503 {
		t.Errorf("readyz once drained: %d, want 503", code)
	}
}
