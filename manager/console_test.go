package manager_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/manager"
)

// TestConsoleAPI: the console's files are served with a strict CSP and
// no token; what they read needs the token, and names the model asked
// for with its partition map. (cmd/cumulus's TestConsole drives the page
// in a browser.)
func TestConsoleAPI(t *testing.T) {
	cli := testenv.Etcd(t)
	repo := repoWith(t, 2)
	fakeShards(t, cli, "s0", "s1")
	m := startWith(t, cli, repo, 2)
	adm, err := m.ServeAdmin(manager.AdminOptions{Addr: "127.0.0.1:0", Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	get := func(path, token string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+adm.Addr()+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	for path, want := range map[string]string{"/console/": "text/html", "/console/console.js": "javascript", "/console/console.css": "text/css"} {
		resp, body := get(path, "")
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), want) || body == "" {
			t.Fatalf("GET %s: %s %q", path, resp.Status, resp.Header.Get("Content-Type"))
		}
		csp := resp.Header.Get("Content-Security-Policy")
		if !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe") || !strings.Contains(csp, "default-src 'none'") ||
			resp.Header.Get("X-Content-Type-Options") != "nosniff" || resp.Header.Get("X-Frame-Options") != "DENY" {
			t.Fatalf("GET %s: headers %v", path, resp.Header)
		}
	}
	// Nothing in the files makes HTML from strings, or reaches another
	// origin.
	_, js := get("/console/console.js", "")
	for _, bad := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "localStorage", "document.cookie", "http://", "https://"} {
		if strings.Contains(js, bad) {
			t.Errorf("console.js uses %s", bad)
		}
	}
	_, html := get("/console/", "")
	if strings.Contains(html, "style=") || strings.Contains(html, "<script>") || strings.Contains(html, "http") {
		t.Errorf("index.html has inline style or script, or names another origin")
	}
	if resp, _ := get("/console/nope.js", ""); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("GET /console/nope.js: %s", resp.Status)
	}
	if resp, _ := get("/console", ""); resp.Request.URL.Path != "/console/" {
		t.Fatalf("GET /console led to %s", resp.Request.URL.Path)
	}

	if resp, _ := get("/admin/v1/console", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /admin/v1/console without the token: %s", resp.Status)
	}
	if resp, _ := get("/admin/v1/console", "wrong"); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("GET /admin/v1/console with a wrong token: %s", resp.Status)
	}
	for path, code := range map[string]int{"/admin/v1/console?model=..%2Fx": 400, "/admin/v1/console?model=nope": 404} {
		if resp, body := get(path, "t"); resp.StatusCode != code || !strings.Contains(body, "error") {
			t.Fatalf("GET %s: %s %s; want %d", path, resp.Status, body, code)
		}
	}
	resp, body := get("/admin/v1/console?model=m", "t")
	var v manager.ConsoleView
	if err := json.Unmarshal([]byte(body), &v); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%s %v: %s", resp.Status, err, body)
	}
	if !v.Manager.Leading || len(v.Models) != 1 || v.Models[0].Live != 2 || v.Models[0].Type != "lr" || v.Models[0].LiveAt.IsZero() || v.Models[0].LiveCreated.IsZero() {
		t.Fatalf("overview %+v", v.Models)
	}
	if len(v.Shards) != 2 || v.Model == nil || v.Model.Name != "m" || v.Model.Map != "llll" || len(v.Model.Placement) != 4 {
		t.Fatalf("shards %+v, model %+v", v.Shards, v.Model)
	}
	for p, reps := range v.Model.Placement {
		if len(reps) != 1 || reps[0] < 0 || reps[0] >= len(v.Model.Shards) {
			t.Fatalf("partition %d placed on %v", p, reps)
		}
	}
}
