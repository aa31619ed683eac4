package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/manager"
	"github.com/cumulus-serving/cumulus/server"
)

// recorder is a Registerer that keeps what is registered, so that every
// metric can be described, those with no sample yet included.
type recorder struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	if err := r.Registerer.Register(c); err != nil {
		return err
	}
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

var descParts = regexp.MustCompile(`^Desc\{fqName: "([^"]+)", .*constLabels: \{([^}]*)\}, variableLabels: \{([^}]*)\}\}$`)

// servedMetrics is every metric a cluster's processes serve, by name,
// with its label names: a dev cluster's router, shard and manager and a
// front, as cumulus dev assembles them, with the Go and process
// collectors every process has.
func servedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	rec := &recorder{Registerer: prometheus.NewRegistry()}
	rec.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	c, err := devcluster.Start(context.Background(), devcluster.Options{Repo: t.TempDir(), Shards: 1, Registry: rec})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv, err := server.Start(server.Options{Predictor: c.Router, GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Registry: rec})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	push, err := c.Manager.ServePush(manager.PushOptions{Addr: "127.0.0.1:0", Token: "t", Registry: rec})
	if err != nil {
		t.Fatal(err)
	}
	defer push.Close()
	metrics := map[string][]string{}
	for _, col := range rec.collectors {
		ch := make(chan *prometheus.Desc, 64)
		go func() { col.Describe(ch); close(ch) }()
		for d := range ch {
			m := descParts.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("a descriptor this test cannot read: %s", d)
			}
			var labels []string
			for _, kv := range strings.Split(m[2], ",") {
				if k, _, ok := strings.Cut(kv, "="); ok {
					labels = append(labels, k)
				}
			}
			for _, l := range strings.Split(m[3], ",") {
				if l != "" {
					labels = append(labels, strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"))
				}
			}
			metrics[m[1]] = labels
		}
	}
	return metrics
}

// TestGrafanaDashboard reads deploy/grafana/cumulus.json and checks every
// query against the metrics the processes serve: each metric it names
// exists (a histogram's _bucket, _sum and _count by its name), and each
// label it groups, filters or titles by is one of that metric's (or one
// Prometheus adds: instance, job; le and quantile).
func TestGrafanaDashboard(t *testing.T) {
	b, err := os.ReadFile("../../deploy/grafana/cumulus.json")
	if err != nil {
		t.Fatal(err)
	}
	type target struct {
		RefID        string          `json:"refId"`
		Expr         string          `json:"expr"`
		LegendFormat string          `json:"legendFormat"`
		Datasource   json.RawMessage `json:"datasource"`
	}
	type panel struct {
		ID      int      `json:"id"`
		Type    string   `json:"type"`
		Title   string   `json:"title"`
		Targets []target `json:"targets"`
	}
	var dash struct {
		UID    string  `json:"uid"`
		Title  string  `json:"title"`
		Panels []panel `json:"panels"`
	}
	// Grafana's dashboard model has many more fields: read what is checked.
	if err := json.NewDecoder(bytes.NewReader(b)).Decode(&dash); err != nil {
		t.Fatalf("cumulus.json: %v", err)
	}
	if dash.UID == "" || dash.Title == "" {
		t.Errorf("dashboard uid %q title %q", dash.UID, dash.Title)
	}
	served := servedMetrics(t)
	ids := map[int]bool{}
	queries := 0
	name := regexp.MustCompile(`\b(?:cumulus|go|process)_[a-z0-9_]+\b`)
	grouped := regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	matched := regexp.MustCompile(`([a-z_]+)\s*(?:=~|!~|!=|=)\s*"`)
	legend := regexp.MustCompile(`\{\{\s*([a-z_]+)\s*\}\}`)
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel %q: id %d taken", p.Title, p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q: no query", p.Title)
		}
		for _, q := range p.Targets {
			queries++
			where := p.Title + " " + q.RefID
			labels := map[string]bool{"instance": true, "job": true, "le": true, "quantile": true}
			names := name.FindAllString(q.Expr, -1)
			if len(names) == 0 {
				t.Errorf("%s: %q names no metric", where, q.Expr)
			}
			for _, n := range names {
				ls, ok := served[n]
				if !ok {
					for _, suffix := range []string{"_bucket", "_sum", "_count"} {
						if base, cut := strings.CutSuffix(n, suffix); cut {
							ls, ok = served[base]
						}
					}
				}
				if !ok {
					t.Errorf("%s: no process serves %s", where, n)
				}
				for _, l := range ls {
					labels[l] = true
				}
			}
			var used []string
			for _, m := range grouped.FindAllStringSubmatch(q.Expr, -1) {
				for _, l := range strings.Split(m[1], ",") {
					used = append(used, strings.TrimSpace(l))
				}
			}
			for _, m := range matched.FindAllStringSubmatch(q.Expr, -1) {
				used = append(used, m[1])
			}
			for _, m := range legend.FindAllStringSubmatch(q.LegendFormat, -1) {
				used = append(used, m[1])
			}
			for _, l := range used {
				if !labels[l] {
					t.Errorf("%s: label %q is none of %v's", where, l, names)
				}
			}
		}
	}
	if queries < 20 {
		t.Errorf("%d queries", queries)
	}
	for _, want := range []string{"cumulus_infer_seconds", "go_goroutines", "process_open_fds", "cumulus_model_version", "cumulus_shard_lookup_keys_total"} {
		if !slices.ContainsFunc(dash.Panels, func(p panel) bool {
			return slices.ContainsFunc(p.Targets, func(q target) bool { return strings.Contains(q.Expr, want) })
		}) {
			t.Errorf("no panel shows %s", want)
		}
	}
}
