package manager

// The operator console: static files served at /console/ on the admin
// address, and GET /admin/v1/console, which answers everything the page
// shows in one call (the page polls it every second). The files hold no
// data and need no token; every call they make carries the admin token
// in a header, as any admin client's does.

import (
	"crypto/tls"
	"embed"
	"encoding/json"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
	"github.com/cumulus-serving/cumulus/internal/topo"
)

//go:embed console
var consoleFiles embed.FS

// consoleCSP is the console's Content-Security-Policy: its own scripts
// and styles only, calls to its own origin only, no inline script or
// style, no frames, no forms posted anywhere.
const consoleCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// handleConsole serves the console's files under /console/.
func handleConsole(mux *http.ServeMux) {
	sub, err := fs.Sub(consoleFiles, "console")
	if err != nil {
		panic(err) // embedded at build time
	}
	files := http.StripPrefix("/console/", http.FileServerFS(sub))
	mux.Handle("GET /console/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", consoleCSP)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	}))
	mux.Handle("GET /console", http.RedirectHandler("/console/", http.StatusMovedPermanently))
}

// ConsoleView is GET /admin/v1/console[?model=NAME].
type ConsoleView struct {
	Time    time.Time      `json:"time"`
	Manager ConsoleSelf    `json:"manager"`
	Models  []ConsoleModel `json:"models"`
	Shards  []ShardSummary `json:"shards"`
	Routers []RouterView   `json:"routers"`
	// Members is the raft group (absent without one).
	Members []Member `json:"members,omitempty"`
	Plan    []Move   `json:"plan"`
	// Traffic is the routers' predict calls over the last 10 seconds,
	// per model and track.
	Traffic []Traffic `json:"traffic"`
	// Model is the model asked for with ?model=NAME.
	Model *ConsoleDetail `json:"model,omitempty"`
}

// ConsoleSelf is the manager answering and whom it knows as the leader.
type ConsoleSelf struct {
	ID      string `json:"id,omitempty"` // its raft ID (none without a group)
	Leading bool   `json:"leading"`
	// Leader is the leader's raft ID, and LeaderAdmin its admin API's
	// URL, as far as this manager knows.
	Leader      string `json:"leader,omitempty"`
	LeaderAdmin string `json:"leader_admin,omitempty"`
}

// ConsoleModel is one model in the console's overview.
type ConsoleModel struct {
	ModelSummary
	Type string `json:"type,omitempty"` // the live version's (lr, fm, ffm, dnn)
	// LiveCreated is when the live version was published (its manifest's
	// word), LiveAt when it went live.
	LiveCreated time.Time `json:"live_created,omitzero"`
	LiveAt      time.Time `json:"live_at,omitzero"`
	Rollout     *Rollout  `json:"rollout,omitempty"`
}

// RouterView is a router's registration and whether its metrics could
// be read.
type RouterView struct {
	topo.RouterInfo
	MetricsError string `json:"metrics_error,omitempty"`
}

// ConsoleDetail is one model in full, with its partition map.
type ConsoleDetail struct {
	ModelDetail
	// Map has a letter per partition: 'l' every replica holds the live
	// version (and the staged one, if any); 'r' the staged version is
	// still loading; 'd' some replica lacks the live version; 'x' none
	// holds it; '-' no replica assigned (or nothing live or staged).
	Map string `json:"map"`
	// Placement lists, per partition, its replicas as indexes into
	// Shards.
	Placement [][]int `json:"placement"`
	// Audit is the model's newest audit entries, newest first.
	Audit []AuditEntry `json:"audit"`
}

// rollout is how far m's staged version has loaded (nil: none staged).
func rollout(st *State, m *ModelState) *Rollout {
	if m.Staged == 0 {
		return nil
	}
	h := st.holding(m.Name)
	r := &Rollout{Version: m.Staged}
	for p, reps := range m.Replicas {
		for _, id := range reps {
			r.Replicas++
			if st.holdsIn(h, m, id, m.Staged, p) {
				r.Holding++
			}
		}
	}
	return r
}

// partitionMap is ConsoleDetail.Map and Placement for m; shards are the
// detail's shards, in order.
func partitionMap(st *State, m *ModelState, shards []ShardDetail, h holding) (string, [][]int) {
	index := map[string]int{}
	for i, s := range shards {
		index[s.ID] = i
	}
	b := make([]byte, len(m.Replicas))
	placement := make([][]int, len(m.Replicas))
	for p, reps := range m.Replicas {
		live, staged := 0, 0
		placement[p] = []int{}
		for _, id := range reps {
			if i, ok := index[id]; ok {
				placement[p] = append(placement[p], i)
			}
			if m.Live != 0 && st.holdsIn(h, m, id, m.Live, p) {
				live++
			}
			if m.Staged != 0 && st.holdsIn(h, m, id, m.Staged, p) {
				staged++
			}
		}
		switch {
		case len(reps) == 0 || (m.Live == 0 && m.Staged == 0):
			b[p] = '-'
		case m.Live != 0 && live == 0:
			b[p] = 'x'
		case m.Live != 0 && live < len(reps):
			b[p] = 'd'
		case m.Staged != 0 && staged < len(reps):
			b[p] = 'r'
		default:
			b[p] = 'l'
		}
	}
	return string(b), placement
}

// consoleAudit is how many audit entries the model view reads.
const consoleAudit = 200

func (a *admin) console(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("model")
	if name != "" && !codec.ValidName(name) {
		writeError(w, http.StatusBadRequest, "invalid model name in ?model=")
		return
	}
	st := a.m.State()
	now := time.Now().UTC()
	v := ConsoleView{Time: now, Models: []ConsoleModel{}, Routers: []RouterView{}, Plan: append([]Move{}, st.Plan(a.m.policy)...)}
	v.Manager.Leading = a.m.leading.Load()
	if g := a.m.group; g != nil {
		v.Manager.ID = g.ID()
		v.Manager.Leader, _ = g.Leader()
		if ms, err := a.m.members(r.Context()); err == nil {
			v.Members = ms
			for _, mb := range ms {
				if mb.ID == v.Manager.Leader {
					v.Manager.LeaderAdmin = mb.Admin
				}
			}
		}
	}
	for _, n := range slices.Sorted(maps.Keys(st.Models)) {
		m := st.Models[n]
		cm := ConsoleModel{ModelSummary: summary(m), Rollout: rollout(st, m)}
		if lv := m.version(m.Live); lv != nil {
			cm.LiveCreated, cm.LiveAt = lv.Created, lv.LiveAt
			if lv.Info != nil {
				cm.Type = string(lv.Info.Shape.Type)
			}
		}
		v.Models = append(v.Models, cm)
	}
	v.Shards = shardList(st, a.m.ShardState).Shards
	rs := a.m.Routers()
	var errs map[string]string
	v.Traffic, errs = a.traffic.read(r.Context(), rs, now, func(model string) bool { return st.Models[model] != nil })
	for _, id := range slices.Sorted(maps.Keys(rs)) {
		v.Routers = append(v.Routers, RouterView{RouterInfo: rs[id], MetricsError: errs[id]})
	}
	if name != "" {
		m := st.Models[name]
		if m == nil {
			writeError(w, http.StatusNotFound, "model "+name+" is not known")
			return
		}
		d := ConsoleDetail{ModelDetail: detail(st, m), Audit: []AuditEntry{}}
		d.Map, d.Placement = partitionMap(st, m, d.Shards, st.holding(name))
		for i := range d.Shards {
			d.Shards[i].Partitions = nil // Placement says it, once
		}
		if entries, err := a.m.readAudit(r.Context(), consoleAudit); err == nil {
			for _, e := range slices.Backward(entries) {
				if e.Model == name {
					d.Audit = append(d.Audit, e)
				}
			}
		}
		v.Model = &d
	}
	// Compact: polled every second, it is a quarter of its indented size
	// (33 against 135 KB with a 4,096-partition model shown).
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// trafficTLS is how the manager reads routers' metrics served over TLS:
// with its own certificate, checking theirs against its CA (nil without
// --tls-*: the system's roots).
func trafficTLS(src *tlsconf.Source) func(host string) *tls.Config {
	if src == nil {
		return nil
	}
	return func(host string) *tls.Config { return src.Client(host, tlsconf.RoleRouter) }
}

// adminURL is the URL a browser or client reaches the admin API at,
// given its listen address: an unspecified host (0.0.0.0, [::]) is
// replaced by the host of the manager's raft address, which its peers
// reach it at.
func adminURL(listen string, tlsOn bool, raftAddr string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		rh, _, err := net.SplitHostPort(raftAddr)
		if err != nil || rh == "" {
			return ""
		}
		host = rh
	}
	u := url.URL{Scheme: "http", Host: net.JoinHostPort(host, port), Path: "/console/"}
	if tlsOn {
		u.Scheme = "https"
	}
	return u.String()
}
