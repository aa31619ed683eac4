package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/cumulus-serving/cumulus/manager"
)

// hostile is what a validator says of a version it refuses: markup that
// would run script if the console put it in the page as HTML.
const hostile = `<img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script> AUC 0.50`

// browser starts Debian's chromium, headless, for a test; it fails the
// test if chromium is missing and CUMULUS_REQUIRE_TOOLS is set, and
// skips it otherwise. problems collects the page's exceptions and the
// console errors it logs (CSP violations among them).
func browser(t testing.TB) (ctx context.Context, problems func() []string) {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("CUMULUS_REQUIRE_TOOLS") == "1" {
			t.Fatal("chromium is not installed (apt-get install chromium)")
		}
		t.Skip("chromium is not installed (apt-get install chromium)")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.Headless, chromedp.DisableGPU,
		chromedp.WindowSize(1400, 1000), chromedp.UserDataDir(t.TempDir()),
		// Its singleton socket's directory too (org.chromium.Chromium.*,
		// which it leaves behind in $TMPDIR).
		chromedp.Env("TMPDIR="+t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	var mu sync.Mutex
	var seen []string
	err = chromedp.Listen(ctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			seen = append(seen, "exception: "+ev.ExceptionDetails.Text+" "+jsonOf(ev.ExceptionDetails.Exception))
		case *log.EventEntryAdded:
			// Refusals the test causes (the wrong token's 401, the stale
			// precondition's 409) are logged as failed resources.
			if ev.Entry.Level == log.EntryLevelError && !strings.Contains(ev.Entry.Text, "status of 401") && !strings.Contains(ev.Entry.Text, "status of 409") {
				seen = append(seen, "console: "+ev.Entry.Text)
			}
		}
	})
	if err == nil {
		_, err = chromedp.Call(ctx, log.Enable, cdp.Empty{})
	}
	if err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	return ctx, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string{}, seen...)
	}
}

// step runs actions with a deadline, failing the test with what.
func step(t testing.TB, ctx context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	c, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if err := chromedp.Do(c, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// until waits for a JavaScript predicate to hold in the page.
func until(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(60*time.Second), chromedp.WithPollingInterval(50*time.Millisecond))
}

// text is the page's expression for the text of selector sel ("" when
// there is none).
func text(sel string) string {
	b, _ := json.Marshal(sel)
	return fmt.Sprintf(`(document.querySelector(%s)?.textContent ?? "")`, b)
}

func TestConsole(t *testing.T) {
	ctx, problems := browser(t)
	dir := t.TempDir()
	repo := filepath.Join(dir, "repo")
	cli := func(args ...string) string { t.Helper(); return mustRun(t, args...) }
	gen := func(seed string) {
		cli("model", "gen", "--repo", repo, "--name", "demo", "--params", "5000", "--partitions", "8", "--seed", seed, "--log-level", "warn")
	}
	gen("1")
	// The validator refuses seed 7's version, saying markup.
	validator := filepath.Join(dir, "validate")
	script := "#!/bin/sh\nif grep -q -- '--seed 7 ' \"$1/manifest.json\"; then echo '" + hostile + "' >&2; exit 1; fi\n"
	if err := os.WriteFile(validator, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	dev := startProcess(t, []string{"http: http://", "admin: http://", "console: ", "ready"}, "dev", "--repo", repo, "--shards", "3",
		"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--admin-token", "console-token",
		"--log-level", "warn", "--validator", validator, "--scan-interval", "200ms")
	adminAddr, _, _ := strings.Cut(dev.out["admin: http://"], " ")
	consoleURL, _, _ := strings.Cut(dev.out["console: "], " ")
	if consoleURL != "http://"+adminAddr+"/console/" {
		t.Fatalf("cumulus dev printed the console at %q; want http://%s/console/", consoleURL, adminAddr)
	}
	shots := os.Getenv("CUMULUS_CONSOLE_SCREENSHOTS")
	shot := func(name string) {
		if shots == "" {
			return
		}
		b, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(shots, name+".png"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	live := `tr[data-model="demo"] [data-field="live"]`

	// A wrong token is refused, and nothing is shown.
	step(t, ctx, "a wrong token", chromedp.Navigate(consoleURL), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), "not-the-token"), chromedp.Click(chromedp.ID("login-button")),
		until(text("#login-error")+`.includes("refused")`), until(`document.getElementById("view-models").hidden`))

	// Signing in shows the demo model live; the token is kept in the
	// tab's sessionStorage only, and never in the URL.
	step(t, ctx, "sign in", chromedp.SendKeys(chromedp.ID("token"), "console-token"), chromedp.Click(chromedp.ID("login-button")),
		until(text(live)+` === "1"`))
	stored, err := chromedp.Run(ctx, chromedp.Evaluate[string](`sessionStorage.getItem("cumulus-admin-token") + " " + document.cookie + " " + location.href`))
	if err != nil || stored != "console-token  "+consoleURL {
		t.Fatalf("after signing in, sessionStorage, cookies and URL are %q (%v); want only the token in sessionStorage", stored, err)
	}

	// The first render after a load (the token kept), as the browser
	// measures it.
	step(t, ctx, "reload", chromedp.Reload(), until(text(live)+` === "1"`))
	first, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`performance.getEntriesByName("cumulus-console-rendered")[0].startTime`))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first render %.0f ms after navigation", first)

	// A new version becomes live in the page.
	gen("2")
	step(t, ctx, "version 2 live", until(text(live)+` === "2"`))
	step(t, ctx, "open the model", chromedp.Click(chromedp.CSS(`[data-key="model:demo"]`)), until(text(`[data-field="detail-live"]`)+` === "2"`))

	// Traffic: predict calls through the router show as its rate and
	// p99, which the manager reads from the router's metrics.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		body := `{"inputs": [{"name": "ids", "datatype": "INT64", "shape": [5], "data": [1, 2, 3, 10, 20]},
			{"name": "row_splits", "datatype": "INT64", "shape": [3], "data": [0, 3, 5]}]}`
		for {
			select {
			case <-stop:
				return
			default:
			}
			resp, err := http.Post("http://"+dev.out["http: http://"]+"/v2/models/demo/infer", "application/json", strings.NewReader(body))
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}()
	step(t, ctx, "traffic shown", until(text(`tr[data-model="demo"] [data-field="traffic-stable"]`)+`.includes("p99 ") && !`+
		text(`tr[data-model="demo"] [data-field="traffic-stable"]`)+`.startsWith("0/s")`))
	shot("console-model")
	close(stop)
	wg.Wait()

	// A version the validator refuses: its reason, markup, is shown as
	// text, and no element is made from it.
	gen("7")
	adminGet := func(path string, v any) {
		t.Helper()
		out := cli("admin", "show", "demo", "--json", "--addr", adminAddr, "--admin-token", "console-token")
		if err := json.Unmarshal([]byte(out), v); err != nil {
			t.Fatalf("%s: %v\n%s", path, err, out)
		}
	}
	var reason string
	var d manager.ModelDetail
	deadline := time.Now().Add(60 * time.Second)
	for reason == "" && time.Now().Before(deadline) {
		adminGet("demo", &d)
		for _, v := range d.Versions {
			for _, g := range v.Gates {
				if v.Version == 3 && g.Outcome == "failed" {
					reason = g.Reason
				}
			}
		}
		if reason == "" {
			time.Sleep(100 * time.Millisecond) // polling the admin API with a deadline
		}
	}
	if !strings.Contains(reason, "<img src=x") || !strings.Contains(reason, "<script>") {
		t.Fatalf("version 3's failed gate says %q; want the validator's markup in it", reason)
	}
	reasonJSON, _ := json.Marshal(reason)
	step(t, ctx, "the markup shown as text", until(fmt.Sprintf(`[...document.querySelectorAll('tr[data-version="3"] [data-field="gate-reason"]')].some((e) => e.textContent === %s)`, reasonJSON)))
	safe, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelectorAll("img").length + " " + document.querySelectorAll("script").length + " " + (window.__pwned === undefined)`))
	if err != nil || safe != "0 1 true" {
		t.Fatalf("images, scripts and whether nothing ran: %q (%v); want 0 images, the console's one script, nothing run", safe, err)
	}
	// Accepting it through the page, with a reason of markup too.
	acceptReason := `<script>window.__pwned=3</script> checked by hand`
	step(t, ctx, "accept", chromedp.Click(chromedp.CSS(`[data-key="accept:3"]`)), until(`document.getElementById("confirm").open`),
		chromedp.SendKeys(chromedp.ID("field-reason"), acceptReason), chromedp.Click(chromedp.ID("confirm-ok")),
		until(`!document.getElementById("confirm").open`),
		until(fmt.Sprintf(`document.querySelector('tr[data-version="3"] [data-field="accept-reason"]')?.textContent === %q`, acceptReason)))
	safe, err = chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelectorAll("img").length + " " + document.querySelectorAll("script").length + " " + (window.__pwned === undefined)`))
	if err != nil || safe != "0 1 true" {
		t.Fatalf("after accepting: images, scripts and whether nothing ran: %q (%v)", safe, err)
	}
	// Accepted, it goes live.
	step(t, ctx, "version 3 live", until(text(live)+` === "3"`))

	// Roll back through the page: the confirmation says what changes;
	// the model and its audit entries follow.
	step(t, ctx, "roll back", chromedp.Click(chromedp.CSS(`[data-key="model-rollback"]`)), until(`document.getElementById("confirm").open`),
		until(text("#confirm-body")+`.includes("live 3 → 2")`),
		until(`document.activeElement.id === "confirm-cancel"`), // Enter does not confirm by default
		chromedp.Click(chromedp.ID("confirm-ok")),
		until(`!document.getElementById("confirm").open`), until(text(live)+` === "2"`),
		until(text(`[data-field="detail-live"]`)+` === "2"`), until(text(`[data-detail="demo"]`)+`.includes("rollback")`))
	step(t, ctx, "the audit view", chromedp.Click(chromedp.ID("tab-audit")), until(`document.querySelector('#audit tr[data-op="rollback"]') !== null`))
	shot("console-audit")

	// Cordon a shard: it empties, as the page shows.
	step(t, ctx, "shards", chromedp.Click(chromedp.ID("tab-shards")), until(text(`tr[data-shard="shard-0"] [data-field="state"]`)+` === "active"`))
	shot("console-shards")
	step(t, ctx, "cordon", chromedp.Click(chromedp.CSS(`[data-key="cordon:shard-0"]`)), until(`document.getElementById("confirm").open`),
		until(text("#confirm-body")+`.includes("shard-0: active → cordoned")`), chromedp.Click(chromedp.ID("confirm-ok")),
		until(text(`tr[data-shard="shard-0"] [data-field="state"]`)+` === "empty"`),
		until(text(`tr[data-shard="shard-0"] [data-field="held"]`)+` === "0 / 0"`),
		until(`document.activeElement?.getAttribute("data-key") === "cordon:shard-0"`)) // focus back on its button

	// A stale precondition: rolling back from a live version someone else
	// has changed is refused, and the page says what is live now.
	step(t, ctx, "to models", chromedp.Click(chromedp.ID("tab-models")), until(text(`[data-field="detail-live"]`)+` === "2"`))
	step(t, ctx, "pin 3 in the page", chromedp.Click(chromedp.CSS(`[data-key="pin:3"]`)), until(`document.getElementById("confirm").open`))
	cli("admin", "rollback", "demo", "--to", "1", "--from", "2", "--addr", adminAddr, "--admin-token", "console-token")
	step(t, ctx, "the refusal", chromedp.Click(chromedp.ID("confirm-ok")),
		until(text("#confirm-error")+`.includes("the live version is now 1")`), chromedp.Click(chromedp.ID("confirm-cancel")))

	// Signing out leaves nothing read with the token in the page, nor
	// the token.
	step(t, ctx, "sign out", chromedp.Click(chromedp.ID("signout")), until(`getComputedStyle(document.getElementById("tabs")).display === "none"`),
		until(`document.querySelectorAll("main tr, main canvas").length === 0 && sessionStorage.length === 0`))

	if p := problems(); len(p) > 0 {
		t.Errorf("the page logged errors (a CSP violation, an exception):\n%s", strings.Join(p, "\n"))
	}
}

// BenchmarkConsoleAtScale measures the console against a dev cluster
// serving 50 models, one of them in 4,096 partitions, as the browser
// measures it: the first render after a load (the token kept), the
// longest render of a poll and the longest task (anything that held the
// page's main thread over 50 ms) while the big model's view updates
// for 5 seconds.
//
//	go test -run '^$' -bench ConsoleAtScale -benchtime 1x ./cmd/cumulus
func BenchmarkConsoleAtScale(b *testing.B) {
	ctx, problems := browser(b)
	dir := b.TempDir()
	repo := filepath.Join(dir, "repo")
	gen := func(name string, params, partitions int) {
		mustRun(b, "model", "gen", "--repo", repo, "--name", name, "--params", fmt.Sprint(params), "--partitions", fmt.Sprint(partitions), "--log-level", "warn")
	}
	gen("big", 200_000, 4096)
	for i := range 49 {
		gen(fmt.Sprintf("m%02d", i), 2000, 8)
	}
	dev := startProcess(b, []string{"admin: http://", "console: ", "ready"}, "dev", "--repo", repo, "--shards", "8",
		"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--admin-token", "t", "--log-level", "warn")
	consoleURL, _, _ := strings.Cut(dev.out["console: "], " ")
	// Long tasks are observed from the document's start (a script the
	// browser adds, outside the page's CSP).
	if _, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: `
		window.__long = [];
		new PerformanceObserver((l) => { for (const e of l.getEntries()) window.__long.push(e.duration); }).observe({ type: "longtask", buffered: true });`}); err != nil {
		b.Fatal(err)
	}
	big := `tr[data-model="big"] [data-field="live"]`
	step(b, ctx, "sign in", chromedp.Navigate(consoleURL), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), "t"), chromedp.Click(chromedp.ID("login-button")), until(text(big)+` === "1"`))
	var first, longest, render []float64
	for i := 0; i < b.N; i++ {
		step(b, ctx, "reload", chromedp.Reload(), until(text(big)+` === "1"`),
			chromedp.Click(chromedp.CSS(`[data-key="model:big"]`)), until(`document.querySelector('canvas.map') !== null`))
		f, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`performance.getEntriesByName("cumulus-console-rendered")[0].startTime`))
		if err != nil {
			b.Fatal(err)
		}
		step(b, ctx, "updates", chromedp.Poll[chromedp.Void](`performance.getEntriesByName("cumulus-render").length >= 8`, chromedp.WithPollingTimeout(30*time.Second)))
		got, err := chromedp.Run(ctx, chromedp.Evaluate[[]float64](`[Math.max(0, ...window.__long), Math.max(...performance.getEntriesByName("cumulus-render").map((e) => e.duration)), document.querySelectorAll("#models tbody tr").length, document.querySelector("canvas.map").width]`))
		if err != nil {
			b.Fatal(err)
		}
		if got[2] != 50 || got[3] != 128*6 {
			b.Fatalf("%v model rows, a map %v pixels wide; want 50, and 4,096 partitions in 128 columns of 6 pixels", got[2], got[3])
		}
		first, longest, render = append(first, f), append(longest, got[0]), append(render, got[1])
		if dir := os.Getenv("CUMULUS_CONSOLE_SCREENSHOTS"); dir != "" {
			png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, "console-4096.png"), png, 0o644)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(slices.Max(first), "first-render-ms")
	b.ReportMetric(slices.Max(render), "max-render-ms")
	b.ReportMetric(slices.Max(longest), "max-long-task-ms")
	if os.Getenv("CUMULUS_CHECK_LONGTASK") == "1" {
		lt, err := chromedp.Run(ctx, chromedp.Evaluate[float64](`new Promise((ok) => { setTimeout(() => { const t = performance.now(); while (performance.now() - t < 150) {} setTimeout(() => ok(Math.max(0, ...window.__long)), 100); }, 0); })`, chromedp.EvalAwaitPromise))
		b.Logf("a 150 ms busy loop observed as a long task of %v ms (%v)", lt, err)
	}
	if p := problems(); len(p) > 0 {
		b.Errorf("the page logged errors:\n%s", strings.Join(p, "\n"))
	}
}
