package manager

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dustin/go-humanize"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/adminhttp"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
	"github.com/cumulus-serving/cumulus/internal/topo"
)

// AdminOptions configure the admin API. Zero values mean the documented
// default.
type AdminOptions struct {
	// Addr is the listen address. Default 127.0.0.1:8002.
	Addr string
	// Token is the bearer token every /admin/ call must carry; required.
	Token string
	// Gatherer is served at /metrics; nil serves no metrics.
	Gatherer prometheus.Gatherer
	// CommandTimeout bounds how long a state-changing call waits for its
	// result to be persisted. Default 10s.
	CommandTimeout time.Duration
	// TLS, if set, serves the API over TLS; with a CA, only to clients
	// whose certificate it signed (see tlsconf).
	TLS *tlsconf.Source
}

// Validate checks required fields and fills defaults.
func (o *AdminOptions) Validate() error {
	if o.Token == "" {
		return errors.New("manager: the admin API needs a token (--admin-token, --admin-token-file or CUMULUS_ADMIN_TOKEN)")
	}
	if o.Addr == "" {
		o.Addr = "127.0.0.1:8002"
	}
	if o.CommandTimeout == 0 {
		o.CommandTimeout = 10 * time.Second
	}
	return nil
}

// AdminServer serves the admin API, /metrics and /healthz.
type AdminServer = adminhttp.Server

// maxAdminBody bounds an admin request's body.
const maxAdminBody = 64 << 10

// ServeAdmin starts the admin API of m on opts.Addr:
//
//	GET    /console/                          the operator console (console.go; its files need no token)
//	GET    /admin/v1/console[?model=NAME]     what the console shows, in one answer
//	GET    /admin/v1/models
//	GET    /admin/v1/models/{name}
//	POST   /admin/v1/models/{name}/rollback   {"to": V} optional
//	PUT    /admin/v1/models/{name}/pin        {"version": V}
//	DELETE /admin/v1/models/{name}/pin
//	POST   /admin/v1/models/{name}/accept     {"version": V, "reason": TEXT}
//	PUT    /admin/v1/models/{name}/canary     {"version": V, "fraction": F, "from": LIVE}
//	DELETE /admin/v1/models/{name}/canary?from=LIVE
//	POST   /admin/v1/models/{name}/promote    {"from": LIVE}
//	POST   /admin/v1/rescan
//	GET    /admin/v1/audit[?limit=N]
//	GET    /admin/v1/routers
//	GET    /admin/v1/shards
//	GET    /admin/v1/plan
//	POST   /admin/v1/shards/{id}/cordon
//	DELETE /admin/v1/shards/{id}/cordon
//	GET    /admin/v1/managers                 the raft group's members
//	POST   /admin/v1/managers                 {"id": ID, "addr": HOST:PORT}: add one (the leader)
//	DELETE /admin/v1/managers/{id}            remove one (the leader)
//	GET    /metrics, /healthz                 (no token)
//
// Errors are {"error": "..."} with 400, 401, 404, 409 (or 503 when the
// result could not be persisted).
func (m *Manager) ServeAdmin(opts AdminOptions) (*AdminServer, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	a := &admin{m: m, opts: opts, traffic: newTrafficReader(trafficTLS(m.opts.ShardTLS))}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	if opts.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{}))
	}
	handleConsole(mux)
	mux.HandleFunc("GET /admin/v1/console", a.auth(a.console))
	mux.HandleFunc("GET /admin/v1/models", a.auth(a.models))
	mux.HandleFunc("GET /admin/v1/models/{name}", a.auth(a.model))
	mux.HandleFunc("POST /admin/v1/models/{name}/rollback", a.auth(a.rollback))
	mux.HandleFunc("PUT /admin/v1/models/{name}/pin", a.auth(a.pin))
	mux.HandleFunc("DELETE /admin/v1/models/{name}/pin", a.auth(a.unpin))
	mux.HandleFunc("POST /admin/v1/models/{name}/prune", a.auth(a.prune))
	mux.HandleFunc("POST /admin/v1/models/{name}/accept", a.auth(a.accept))
	mux.HandleFunc("PUT /admin/v1/models/{name}/canary", a.auth(a.canary))
	mux.HandleFunc("DELETE /admin/v1/models/{name}/canary", a.auth(a.canaryOff))
	mux.HandleFunc("POST /admin/v1/models/{name}/promote", a.auth(a.promote))
	mux.HandleFunc("POST /admin/v1/rescan", a.auth(a.rescan))
	mux.HandleFunc("GET /admin/v1/audit", a.auth(a.audit))
	mux.HandleFunc("GET /admin/v1/routers", a.auth(a.routers))
	mux.HandleFunc("GET /admin/v1/shards", a.auth(a.shards))
	mux.HandleFunc("GET /admin/v1/plan", a.auth(func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, struct {
			Moves []Move `json:"moves"`
		}{append([]Move{}, a.m.State().Plan(a.m.policy)...)})
	}))
	mux.HandleFunc("POST /admin/v1/shards/{id}/cordon", a.auth(func(w http.ResponseWriter, r *http.Request) {
		a.do(w, r, Command{Op: OpCordon, Shard: r.PathValue("id")})
	}))
	mux.HandleFunc("DELETE /admin/v1/shards/{id}/cordon", a.auth(func(w http.ResponseWriter, r *http.Request) {
		a.do(w, r, Command{Op: OpUncordon, Shard: r.PathValue("id")})
	}))
	mux.HandleFunc("GET /admin/v1/managers", a.auth(a.managers))
	mux.HandleFunc("POST /admin/v1/managers", a.auth(func(w http.ResponseWriter, r *http.Request) { a.changeMembers(w, r, true) }))
	mux.HandleFunc("DELETE /admin/v1/managers/{id}", a.auth(func(w http.ResponseWriter, r *http.Request) { a.changeMembers(w, r, false) }))
	mux.HandleFunc("/admin/", a.auth(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no admin call %s %s", r.Method, r.URL.Path))
	}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such path %s (the admin API is under /admin/v1/, the console at /console/)", r.URL.Path))
	})
	var tc *tls.Config
	if opts.TLS != nil {
		tc = opts.TLS.Server(tlsconf.RoleOperator)
	}
	s, err := adminhttp.Serve(opts.Addr, mux, opts.CommandTimeout+10*time.Second, tc, "manager admin API")
	if err != nil {
		return nil, fmt.Errorf("manager: admin API: %w", err)
	}
	raftAddr := ""
	if m.group != nil {
		raftAddr = m.group.Addr()
	}
	u := adminURL(s.Addr(), tc != nil, raftAddr)
	m.adminURL.Store(&u)
	return s, nil
}

type admin struct {
	m       *Manager
	opts    AdminOptions
	traffic *trafficReader
}

// auth refuses a call without the right bearer token; it changes
// nothing and is not audited (a stranger could otherwise flood the audit
// log).
func (a *admin) auth(h http.HandlerFunc) http.HandlerFunc {
	return adminhttp.Auth("manager", a.opts.Token, h)
}

func writeJSON(w http.ResponseWriter, code int, v any) { adminhttp.WriteJSON(w, code, v) }

func writeError(w http.ResponseWriter, code int, msg string) { adminhttp.WriteError(w, code, msg) }

// ModelSummary is one model in GET /admin/v1/models.
type ModelSummary struct {
	Name       string   `json:"name"`
	Partitions uint32   `json:"partitions"`
	Live       uint64   `json:"live"`
	Staged     uint64   `json:"staged,omitempty"`
	Pin        uint64   `json:"pin,omitempty"`
	Canary     *Canary  `json:"canary,omitempty"`
	Standby    []uint64 `json:"standby"`
	// RollbackTo is the version a rollback naming none goes to (absent:
	// none can).
	RollbackTo uint64 `json:"rollback_to,omitempty"`
	Versions   int    `json:"versions"`
	Rejected   int    `json:"rejected"`
	// HeldPushes, while a pin or a canary holds the model, is the delta
	// its pushes are held in (push.go): served once the hold ends.
	HeldPushes *HeldPushes `json:"held_pushes,omitempty"`
}

// HeldPushes is the delta a held model's pushes wait in.
type HeldPushes struct {
	Version uint64 `json:"version"`
	Bytes   int64  `json:"bytes,omitempty"` // its files' (0 until validated)
	Why     string `json:"why"`
}

// ModelDetail is GET /admin/v1/models/{name}.
type ModelDetail struct {
	ModelSummary
	Versions []VersionDetail `json:"versions"`
	// Rollout is the staged version's progress; nil when none.
	Rollout *Rollout      `json:"rollout,omitempty"`
	Shards  []ShardDetail `json:"shards"`
	// OverBudget, when set, says the model does not fit: shards it is
	// placed on are assigned more than their memory budgets, with no
	// other shard having room (such shards serve it from disk).
	OverBudget string `json:"over_budget,omitempty"`
}

// VersionDetail is one version in ModelDetail.
type VersionDetail struct {
	Version uint64 `json:"version"`
	Kind    string `json:"kind,omitempty"`
	Parent  uint64 `json:"parent,omitempty"`
	Phase   Phase  `json:"phase"`
	Reason  string `json:"reason,omitempty"`
	Bytes   int64  `json:"bytes,omitempty"`
	// Gates are the validation gates' outcomes.
	Gates []GateResult `json:"gates,omitempty"`
	// Accepted: an operator accepted it despite failed gates.
	Accepted *Acceptance `json:"accepted,omitempty"`
	// Created is its publication time (its manifest's word), LiveAt when
	// it last went live.
	Created time.Time `json:"created,omitzero"`
	LiveAt  time.Time `json:"live_at,omitzero"`
}

// Rollout is how far the staged version has loaded.
type Rollout struct {
	Version uint64 `json:"version"`
	// Replicas is how many (partition, shard) placements the version
	// needs; Holding how many report it with the expected content.
	Replicas int `json:"replicas"`
	Holding  int `json:"holding"`
}

// ShardDetail is one shard as it concerns a model.
type ShardDetail struct {
	ID       string `json:"id"`
	Addr     string `json:"addr"`
	Build    string `json:"build,omitempty"`
	Assigned int    `json:"assigned"` // partitions of the model assigned to it
	// Partitions are the partitions assigned to it, ascending.
	Partitions []uint32 `json:"partitions"`
	// Loaded maps each version it reports to how many partitions.
	Loaded     map[string]int `json:"loaded"`
	Mismatched []uint64       `json:"mismatched,omitempty"`
	Errors     []string       `json:"errors,omitempty"`
}

func summary(m *ModelState) ModelSummary {
	s := ModelSummary{Name: m.Name, Partitions: m.Partitions, Live: m.Live, Staged: m.Staged, Pin: m.Pin,
		Standby: m.Standby(), RollbackTo: m.RollbackTarget(), Versions: len(m.Versions), Canary: m.Canary}
	for _, v := range m.Versions {
		if v.Phase == PhaseRejected {
			s.Rejected++
		}
	}
	if m.Pin != 0 || m.Canary != nil {
		for i := len(m.Versions) - 1; i >= 0 && m.Versions[i].Version > m.Live; i-- {
			if v := m.Versions[i]; !v.PushedAt.IsZero() && v.Phase != PhaseRejected {
				why := fmt.Sprintf("pinned to version %d", m.Pin)
				if m.Canary != nil {
					why = "a canary is on"
				}
				s.HeldPushes = &HeldPushes{Version: v.Version, Bytes: v.Bytes, Why: why + ": pushes are held until it ends"}
				break
			}
		}
	}
	if s.Standby == nil {
		s.Standby = []uint64{}
	}
	return s
}

func (a *admin) models(w http.ResponseWriter, _ *http.Request) {
	st := a.m.State()
	out := struct {
		Models []ModelSummary `json:"models"`
	}{Models: []ModelSummary{}}
	for _, name := range slices.Sorted(maps.Keys(st.Models)) {
		out.Models = append(out.Models, summary(st.Models[name]))
	}
	writeJSON(w, http.StatusOK, out)
}

// detail describes one model from state st.
func detail(st *State, m *ModelState) ModelDetail {
	d := ModelDetail{ModelSummary: summary(m), Versions: []VersionDetail{}, Shards: []ShardDetail{}}
	for _, v := range m.Versions {
		d.Versions = append(d.Versions, VersionDetail{Version: v.Version, Kind: v.Kind, Parent: v.Parent, Phase: v.Phase, Reason: v.Reason, Bytes: v.Bytes, Gates: v.Gates,
			Accepted: v.Accepted, Created: v.Created, LiveAt: v.LiveAt})
	}
	d.Rollout = rollout(st, m)
	mismatches := st.Mismatches(m.Name)
	over := st.overBudget()
	var overs []string
	for _, id := range slices.Sorted(maps.Keys(st.Shards)) {
		si := st.Shards[id]
		sd := ShardDetail{ID: id, Addr: si.Addr, Build: si.Build, Loaded: map[string]int{}, Mismatched: mismatches[id]}
		for _, e := range si.Errors {
			if strings.HasPrefix(e, m.Name+"/") {
				sd.Errors = append(sd.Errors, e)
			}
		}
		sd.Partitions = []uint32{}
		for p, reps := range m.Replicas {
			if slices.Contains(reps, id) {
				sd.Assigned++
				sd.Partitions = append(sd.Partitions, uint32(p))
			}
		}
		if b, ok := over[id]; ok && sd.Assigned > 0 {
			overs = append(overs, fmt.Sprintf("%s is assigned %s of its %s budget", id, humanize.IBytes(uint64(b)), humanize.IBytes(uint64(si.Budget))))
		}
		for _, v := range m.kept() {
			if n := heldCount(si, m, m.version(v)); n > 0 {
				sd.Loaded[strconv.FormatUint(v, 10)] = n
			}
		}
		d.Shards = append(d.Shards, sd)
	}
	if len(overs) > 0 {
		d.OverBudget = "does not fit the shards' memory budgets: " + strings.Join(overs, "; ")
	}
	return d
}

func (a *admin) model(w http.ResponseWriter, r *http.Request) {
	if !codec.ValidName(r.PathValue("name")) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid model name %q", r.PathValue("name")))
		return
	}
	st := a.m.State()
	m := st.Models[r.PathValue("name")]
	if m == nil {
		writeError(w, http.StatusNotFound, fmt.Sprintf("model %q is not known", r.PathValue("name")))
		return
	}
	writeJSON(w, http.StatusOK, detail(st, m))
}

// readBody decodes an optional JSON body into v: empty is allowed when
// optional; unknown fields, trailing data and oversized bodies are not.
func readBody(r *http.Request, v any, optional bool) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, maxAdminBody+1))
	if err != nil {
		return fmt.Errorf("reading the body: %w", err)
	}
	if len(b) > maxAdminBody {
		return fmt.Errorf("body over %d bytes", maxAdminBody)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		if optional {
			return nil
		}
		return errors.New("a JSON body is required")
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("malformed JSON body: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("malformed JSON body: data after the object")
	}
	return nil
}

// do applies a command and answers with the model's state after it.
func (a *admin) do(w http.ResponseWriter, r *http.Request, c Command) {
	if c.Model != "" && !codec.ValidName(c.Model) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("invalid model name %q", c.Model))
		return
	}
	c.At, c.From = time.Now().UTC(), r.RemoteAddr
	ctx, cancel := context.WithTimeout(r.Context(), a.opts.CommandTimeout)
	defer cancel()
	res, err := a.m.do(ctx, c)
	st := res.st
	var moved *LiveMovedError
	switch {
	case errors.As(err, &moved):
		writeJSON(w, http.StatusConflict, map[string]any{"error": err.Error(), "live": moved.Live})
	case errors.Is(err, ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, ErrConflict):
		writeError(w, http.StatusConflict, err.Error())
	case errors.Is(err, ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, ErrTooLarge):
		writeError(w, http.StatusInternalServerError, err.Error())
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		writeError(w, http.StatusGatewayTimeout, fmt.Sprintf("no answer within %s: the call may still be applied; see the model and the audit log", a.opts.CommandTimeout))
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err.Error())
	case c.Op == OpCordon || c.Op == OpUncordon:
		slog.Info("manager: admin call applied", "op", c.Op, "shard", c.Shard, "from", c.From)
		writeJSON(w, http.StatusOK, shardList(st, a.m.ShardState))
	case c.Model == "":
		a.models(w, r)
	case c.Op == OpPrune:
		slog.Info("manager: admin call applied", "op", c.Op, "model", c.Model, "keep", c.Keep, "removed", res.removed, "from", c.From)
		writeJSON(w, http.StatusOK, PruneResult{Model: c.Model, Removed: append([]uint64{}, res.removed...)})
	default:
		slog.Info("manager: admin call applied", "op", c.Op, "model", c.Model, "version", c.Version, "from", c.From)
		writeJSON(w, http.StatusOK, detail(st, st.Models[c.Model]))
	}
}

// errNoFrom is the answer to a change that does not say the live version
// it acts on.
const errNoFrom = `"from" is required: the live version this call acts on (0 if none), as GET /admin/v1/models/NAME shows it; the call is refused if another has changed it since`

func (a *admin) rollback(w http.ResponseWriter, r *http.Request) {
	var body struct {
		To   *uint64 `json:"to"`
		From *uint64 `json:"from"`
	}
	if err := readBody(r, &body, true); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if body.From == nil {
		writeError(w, http.StatusBadRequest, errNoFrom)
		return
	}
	c := Command{Op: OpRollback, Model: r.PathValue("name"), Expect: body.From}
	if body.To != nil {
		if *body.To == 0 {
			writeError(w, http.StatusBadRequest, `"to" must be a version ≥ 1`)
			return
		}
		c.Version = *body.To
	}
	a.do(w, r, c)
}

func (a *admin) pin(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Version *uint64 `json:"version"`
		From    *uint64 `json:"from"`
	}
	if err := readBody(r, &body, false); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if body.Version == nil || *body.Version == 0 {
		writeError(w, http.StatusBadRequest, `"version" must be a version ≥ 1`)
		return
	}
	if body.From == nil {
		writeError(w, http.StatusBadRequest, errNoFrom)
		return
	}
	a.do(w, r, Command{Op: OpPin, Model: r.PathValue("name"), Version: *body.Version, Expect: body.From})
}

// maxReason bounds an accept's reason: it is kept with the version and
// in the audit log.
const maxReason = 1024

func (a *admin) accept(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Version *uint64 `json:"version"`
		Reason  string  `json:"reason"`
	}
	if err := readBody(r, &body, false); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	switch {
	case body.Version == nil || *body.Version == 0:
		writeError(w, http.StatusBadRequest, `"version" must be a version ≥ 1`)
		return
	case strings.TrimSpace(body.Reason) == "" || len(body.Reason) > maxReason || !utf8.ValidString(body.Reason) || strings.ContainsFunc(body.Reason, unicode.IsControl):
		writeError(w, http.StatusBadRequest, fmt.Sprintf(`"reason" is required (it is audited): one line of printable text, 1 to %d bytes`, maxReason))
		return
	}
	a.do(w, r, Command{Op: OpAccept, Model: r.PathValue("name"), Version: *body.Version, Reason: body.Reason})
}

func (a *admin) unpin(w http.ResponseWriter, r *http.Request) {
	if from, ok := fromQuery(w, r); ok {
		a.do(w, r, Command{Op: OpUnpin, Model: r.PathValue("name"), Expect: &from})
	}
}

// fromQuery is a DELETE's ?from=LIVE precondition; ok is false once a
// missing or bad one is answered.
func fromQuery(w http.ResponseWriter, r *http.Request) (uint64, bool) {
	q := r.URL.Query().Get("from")
	if q == "" {
		writeError(w, http.StatusBadRequest, strings.Replace(errNoFrom, `"from" is required`, `?from=V is required`, 1))
		return 0, false
	}
	from, err := strconv.ParseUint(q, 10, 64)
	if err != nil {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("from %q is not a version (0 if none is live)", q))
		return 0, false
	}
	return from, true
}

func (a *admin) canary(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Version  *uint64  `json:"version"`
		Fraction *float64 `json:"fraction"`
		From     *uint64  `json:"from"`
	}
	if err := readBody(r, &body, false); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	switch {
	case body.Version == nil || *body.Version == 0:
		writeError(w, http.StatusBadRequest, `"version" must be a version ≥ 1`)
	case body.Fraction == nil || !(*body.Fraction > 0 && *body.Fraction <= MaxCanaryFraction):
		writeError(w, http.StatusBadRequest, fmt.Sprintf(`"fraction" must be above 0 and at most %g`, MaxCanaryFraction))
	case body.From == nil:
		writeError(w, http.StatusBadRequest, errNoFrom)
	default:
		a.do(w, r, Command{Op: OpCanary, Model: r.PathValue("name"), Version: *body.Version, Fraction: *body.Fraction, Expect: body.From})
	}
}

func (a *admin) canaryOff(w http.ResponseWriter, r *http.Request) {
	if from, ok := fromQuery(w, r); ok {
		a.do(w, r, Command{Op: OpCanaryOff, Model: r.PathValue("name"), Expect: &from})
	}
}

func (a *admin) promote(w http.ResponseWriter, r *http.Request) {
	var body struct {
		From *uint64 `json:"from"`
	}
	if err := readBody(r, &body, false); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if body.From == nil {
		writeError(w, http.StatusBadRequest, errNoFrom)
		return
	}
	a.do(w, r, Command{Op: OpPromote, Model: r.PathValue("name"), Expect: body.From})
}

// PruneResult is the answer to a prune: the versions whose directories
// were removed.
type PruneResult struct {
	Model   string   `json:"model"`
	Removed []uint64 `json:"removed"`
}

func (a *admin) prune(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Keep *int `json:"keep"`
	}
	if err := readBody(r, &body, false); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if body.Keep == nil || *body.Keep < 0 {
		writeError(w, http.StatusBadRequest, `"keep" is required: how many removable versions to keep (the newest), ≥ 0`)
		return
	}
	a.do(w, r, Command{Op: OpPrune, Model: r.PathValue("name"), Keep: *body.Keep})
}

func (a *admin) rescan(w http.ResponseWriter, r *http.Request) {
	a.do(w, r, Command{Op: OpRescan})
}

// routers answers GET /admin/v1/routers: the registered routers, with
// the versions each can score and why not the others.
func (a *admin) routers(w http.ResponseWriter, _ *http.Request) {
	rs := a.m.Routers()
	out := make([]topo.RouterInfo, 0, len(rs))
	for _, id := range slices.Sorted(maps.Keys(rs)) {
		out = append(out, rs[id])
	}
	writeJSON(w, http.StatusOK, struct {
		Routers []topo.RouterInfo `json:"routers"`
	}{out})
}

// ShardSummary is one shard in GET /admin/v1/shards.
type ShardSummary struct {
	ID     string  `json:"id"`
	Addr   string  `json:"addr,omitempty"` // "": not registered (a cordon on a shard not running)
	Zone   string  `json:"zone,omitempty"`
	Weight float64 `json:"weight"`
	// State is "active", "cordoned" (it still holds partitions assigned
	// to it) or "empty" (cordoned, assigned nothing: it can be stopped).
	State string `json:"state"`
	// Assigned is the partition replicas assigned to it, every model;
	// Bytes their resident size (each model's live and canary chains, an
	// equal part per partition: see budget.go). Budget is the memory budget it reports (0: none); Bytes
	// beyond it are served from disk, and mean the models
	// assigned to it do not fit the cluster's budgets.
	Assigned int   `json:"assigned"`
	Bytes    int64 `json:"bytes"`
	Budget   int64 `json:"budget,omitempty"`
	// Held is the partitions it reports loaded, every model and version.
	Held int `json:"held"`
	// Errors are the loads it reports failing ("model/version/part:
	// why"); Mismatched the versions ("model@version") it reports content
	// of other than validated (it is assigned none of those models).
	Errors     []string `json:"errors,omitempty"`
	Mismatched []string `json:"mismatched,omitempty"`
}

// shardList lists the registered and the cordoned shards of st, each in
// the state state gives.
func shardList(st *State, state func(id string) string) shardsAnswer {
	ids := slices.Sorted(maps.Keys(st.Shards))
	for _, id := range st.Cordoned {
		if _, ok := st.Shards[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	replicas, bytes := st.assigned()
	out := []ShardSummary{}
	for _, id := range ids {
		si := st.Shards[id]
		s := ShardSummary{ID: id, Addr: si.Addr, Zone: si.Zone, Weight: cmp.Or(si.Weight, 1), State: state(id), Budget: si.Budget,
			Assigned: replicas[id], Bytes: bytes[id], Errors: si.Errors}
		mm := st.mismatchesOf(si, "")
		for _, name := range slices.Sorted(maps.Keys(mm)) {
			for _, v := range mm[name] {
				s.Mismatched = append(s.Mismatched, fmt.Sprintf("%s@%d", name, v))
			}
		}
		for _, m := range st.Models {
			for _, v := range m.kept() {
				s.Held += heldCount(si, m, m.version(v))
			}
		}
		out = append(out, s)
	}
	return shardsAnswer{out}
}

// shardsAnswer is GET /admin/v1/shards.
type shardsAnswer struct {
	Shards []ShardSummary `json:"shards"`
}

func (a *admin) shards(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, shardList(a.m.State(), a.m.ShardState))
}

func (a *admin) audit(w http.ResponseWriter, r *http.Request) {
	limit := int64(100)
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 || n > maxAudit {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit must be 1..%d", maxAudit))
			return
		}
		limit = n
	}
	entries, err := a.m.readAudit(r.Context(), limit)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Entries []AuditEntry `json:"entries"`
	}{entries})
}
