// The push API: gRPC (cumulus.push.v1.Push) and HTTP on one port, and
// the sealer that turns each model's windows into deltas.

package manager

import (
	"cmp"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/adminhttp"
	"github.com/cumulus-serving/cumulus/internal/peerlimit"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/pushpb"
)

// PushOptions configure the push API. Zero values mean the documented
// default.
type PushOptions struct {
	// Addr is the listen address; required.
	Addr string
	// Token is the bearer token every push must carry; required, and
	// not the admin API's (a trainer cannot roll back; an operator
	// does not push).
	Token string
	// TLS, if set, serves the API over mutual TLS to trainers (role
	// trainer, see tlsconf).
	TLS *tlsconf.Source
	// Window is how long a model's pushes gather before they are sealed
	// into a delta. Default 1s.
	Window time.Duration
	// MaxBatchBytes bounds a batch's encoding. Default 16 MiB.
	MaxBatchBytes int64
	// InFlight bounds a producer's bytes in windows not yet answered.
	// Default 4 × MaxBatchBytes.
	InFlight int64
	// MaxReceiving bounds the bytes of batches being received and
	// decoded at once, over every connection: past it, an HTTP batch is
	// refused (429) and a gRPC stream waits. Default 4 × MaxBatchBytes.
	MaxReceiving int64
	// MaxConnsPerPeer bounds the connections one client address holds;
	// one past it is held unread for 2s, then closed (peerlimit).
	// Default 64.
	MaxConnsPerPeer int
	// WindowBytes: a window past it is sealed at once. Default 256 MiB.
	WindowBytes int64
	// Unpacked seals a window as a file per partition it touches
	// (manifest format 2), which shards of builds before format 3 read,
	// rather than as one file: for a cluster being upgraded from them.
	Unpacked bool
	// MaxPendingBytes bounds what a model's pushes weigh while a pin or
	// a canary holds them (the pending delta and the open window); past
	// it, pushes are refused (ResourceExhausted, 429). Default 256 MiB.
	MaxPendingBytes int64
	// Registry receives the push metrics; nil registers nowhere.
	Registry prometheus.Registerer
}

// Validate checks required fields and fills defaults.
func (o *PushOptions) Validate() error {
	switch {
	case o.Addr == "":
		return errors.New("manager: the push API needs an address (--push-addr)")
	case o.Token == "":
		return errors.New("manager: the push API needs a token (--push-token, --push-token-file or CUMULUS_PUSH_TOKEN)")
	case o.Window < 0 || o.MaxBatchBytes < 0 || o.InFlight < 0 || o.WindowBytes < 0 || o.MaxPendingBytes < 0 || o.MaxReceiving < 0 || o.MaxConnsPerPeer < 0:
		return errors.New("manager: push options must not be negative")
	}
	o.Window = cmp.Or(o.Window, time.Second)
	o.MaxBatchBytes = cmp.Or(o.MaxBatchBytes, 16<<20)
	o.InFlight = cmp.Or(o.InFlight, 4*o.MaxBatchBytes)
	o.MaxReceiving = max(cmp.Or(o.MaxReceiving, 4*o.MaxBatchBytes), o.MaxBatchBytes)
	o.MaxConnsPerPeer = cmp.Or(o.MaxConnsPerPeer, 64)
	o.WindowBytes = cmp.Or(o.WindowBytes, 256<<20)
	o.MaxPendingBytes = cmp.Or(o.MaxPendingBytes, 256<<20)
	if o.WindowBytes > 4<<30 || o.MaxPendingBytes > 4<<30 {
		return errors.New("manager: push windows and pending pushes of at most 4 GiB")
	}
	return nil
}

// limits are a model's push limits: the options', and the manager's
// bounds on producers.
func (s *PushServer) limits() PushLimits {
	o := s.opts
	return PushLimits{Window: o.Window, WindowBytes: o.WindowBytes, InFlight: o.InFlight, ProducerTTL: s.m.opts.PushProducerTTL, MaxProducers: s.m.opts.MaxPushProducers}
}

// PushServer serves the push API of a manager: only while it leads; a
// follower answers 503 (Unavailable) naming the leader.
type PushServer struct {
	m    *Manager
	opts PushOptions
	srv  *http.Server
	lis  net.Listener
	grpc *grpc.Server

	mu    sync.Mutex
	logs  map[string]*pushLog // by model, this reign's
	last  map[string]uint64   // by model, the newest delta this reign sealed
	reign uint64
	kick  chan struct{}
	// closed: the sealer has stopped; nothing more is taken.
	closed bool

	// receiving counts the bytes of batches being received and decoded
	// (MaxReceiving).
	receiving *semaphore.Weighted

	cancel  context.CancelFunc
	done    sync.WaitGroup
	metrics pushMetrics
}

type pushMetrics struct {
	rows    *prometheus.CounterVec
	batches *prometheus.CounterVec
	seal    prometheus.Histogram
}

// ServePush starts the push API of m on opts.Addr:
//
//	gRPC cumulus.push.v1.Push/Send     a stream of batches (pushpb)
//	POST /push/v1/models/{name}        one batch: KServe v2 JSON, or its
//	                                   binary tensor extension
//	GET  /healthz                      (no token)
//
// Both take "Authorization: Bearer TOKEN".
func (m *Manager) ServePush(opts PushOptions) (*PushServer, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &PushServer{m: m, opts: opts, logs: map[string]*pushLog{}, last: map[string]uint64{}, kick: make(chan struct{}, 1), receiving: semaphore.NewWeighted(opts.MaxReceiving)}
	s.metrics = pushMetrics{
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cumulus_push_rows_total",
			Help: "Rows (upserts and deletions) pushed and applied to a window, by model."}, []string{"model"}),
		batches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cumulus_push_batches_total",
			Help: "Push batches by model and outcome: applied, duplicate, invalid, sequence, busy, unknown_model (model \"\"), failed (its delta not published), unavailable; and conn_refused: connections past --max-conns-per-peer."}, []string{"model", "outcome"}),
		seal: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "cumulus_push_seal_seconds",
			Help: "From a window's sealing to its delta published in the repository.", Buckets: prometheus.ExponentialBuckets(0.002, 2, 14)}),
	}
	if opts.Registry != nil {
		for _, c := range []prometheus.Collector{s.metrics.rows, s.metrics.batches, s.metrics.seal} {
			if err := opts.Registry.Register(c); err != nil {
				return nil, fmt.Errorf("manager: push metrics: %w", err)
			}
		}
	}
	gopts := []grpc.ServerOption{grpc.MaxRecvMsgSize(int(opts.MaxBatchBytes)), grpc.StreamInterceptor(s.authStream)}
	s.grpc = grpc.NewServer(gopts...)
	pushpb.RegisterPushServer(s.grpc, pushGRPC{s: s})
	reflection.Register(s.grpc) // grpcurl without the .proto
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("POST /push/v1/models/{name}", adminhttp.AuthFor("manager push API", "push", opts.Token, s.pushHTTP))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such path %s %s (the push API is POST /push/v1/models/NAME, or gRPC cumulus.push.v1.Push)", r.Method, r.URL.Path))
	})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			s.grpc.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(w, r)
	})
	lis, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("manager: push API: %w", err)
	}
	s.lis = lis
	lis = peerlimit.Limit(lis, opts.MaxConnsPerPeer, 2*time.Second, func() { s.count("", "conn_refused", 0) })
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetHTTP2(true)
	protos.SetUnencryptedHTTP2(opts.TLS == nil)
	s.srv = &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 5 * time.Minute,
		MaxHeaderBytes: 64 << 10, Protocols: &protos, ErrorLog: tlsconf.HTTPErrorLog("manager push API"),
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: maxPushStreams}}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.done.Add(2)
	go func() {
		defer s.done.Done()
		var err error
		if opts.TLS != nil {
			s.srv.TLSConfig = opts.TLS.Server(tlsconf.RoleTrainer)
			err = s.srv.ServeTLS(lis, "", "")
		} else {
			err = s.srv.Serve(lis)
		}
		if !errors.Is(err, http.ErrServerClosed) {
			slog.Error("manager: push API stopped", "err", err)
		}
	}()
	go func() { defer s.done.Done(); s.seal(ctx) }()
	return s, nil
}

// Addr is the address the push API listens on.
func (s *PushServer) Addr() string { return s.lis.Addr().String() }

// Close stops serving: windows not yet sealed are answered Unavailable.
func (s *PushServer) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.cancel()
	s.srv.Shutdown(ctx)
	s.grpc.Stop()
	s.done.Wait()
}

// errPushStopped answers what a stopped server or a deposed leader did
// not seal.
var errPushStopped = fmt.Errorf("%w: the push API stopped or its manager lost the lead before sealing the batch: send it again (to the leader)", ErrNotLeader)

// pushAnswer is a batch's answer: at once, or once w is answered.
type pushAnswer struct {
	model     string
	producer  string
	sequence  uint64
	w         *pushWindow
	duplicate bool
	err       error
}

// offer takes one batch on this manager: refused if it does not lead, or
// for the batch's own fault; otherwise its answer waits on a window.
func (s *PushServer) offer(b *PushBatch) pushAnswer {
	a := pushAnswer{model: b.Model, producer: b.Producer, sequence: b.Sequence}
	// The reign first, then the state: a state read in an earlier reign
	// (the lead lost and won again meanwhile) could hold sealed marks
	// older than another leader's, and apply a batch twice.
	reign := s.m.reign.Load()
	if !s.m.acting.Load() {
		a.err = s.m.notLeader()
		s.count("", "unavailable", 0) // no model label: a follower does not check the name
		return a
	}
	st := s.m.State()
	ms := st.Models[b.Model]
	width := pushWidth(ms)
	if width == 0 || ms.Partitions == 0 { // no partitions: no version validated whole yet (a delta's own files may pass before its parent's)
		a.err = fmt.Errorf("%w: model %q (no version of it is served to push onto)", ErrNotFound, b.Model)
		s.count("", "unknown_model", 0)
		return a
	}
	if err := b.Check(width); err != nil {
		a.err = err
		s.count(b.Model, "invalid", 0)
		return a
	}
	b.parts, b.partsOf = b.partitions(ms.Partitions), ms.Partitions // off the lock
	s.mu.Lock()
	s.checkReign()
	if s.closed || s.reign != reign {
		s.mu.Unlock()
		a.err = errPushStopped
		s.count("", "unavailable", 0)
		return a
	}
	l := s.logs[b.Model]
	if l == nil || l.width != width || l.partitions != ms.Partitions {
		if l != nil {
			l.fail(fmt.Errorf("%w: model %s changed to %d values per id in %d partitions: send again", ErrNotLeader, b.Model, width, ms.Partitions))
		}
		l = newPushLog(s.limits(), width, ms.Partitions)
		s.logs[b.Model] = l
	}
	opened := l.open == nil
	if holdOf(ms) != "" && l.heldBytes()+b.Size(width) > s.opts.MaxPendingBytes {
		s.mu.Unlock()
		what := fmt.Sprintf("pinned to version %d", ms.Pin)
		if ms.Canary != nil {
			what = "under a canary"
		}
		a.err = fmt.Errorf("%w: model %s is %s: its pushes wait to be served, and %d bytes of them is the most held (--max-pending-push-bytes); they are served once the pin is lifted or the canary ends", ErrBusy, b.Model, what, s.opts.MaxPendingBytes)
		s.count(b.Model, "busy", 0)
		return a
	}
	a.w, a.duplicate, a.err = l.offer(b, ms.Pushed[b.Producer].Seq, time.Now())
	due := l.due(time.Now())
	s.mu.Unlock()
	switch {
	case errors.Is(a.err, ErrSequence):
		s.count(b.Model, "sequence", 0)
	case errors.Is(a.err, ErrBusy):
		s.count(b.Model, "busy", 0)
	case a.duplicate:
		s.count(b.Model, "duplicate", 0)
	default:
		s.count(b.Model, "applied", len(b.IDs)+len(b.Deletes))
	}
	if (opened && a.w != nil) || due {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	return a
}

func (s *PushServer) count(model, outcome string, rows int) {
	s.metrics.batches.WithLabelValues(model, outcome).Inc()
	if rows > 0 {
		s.metrics.rows.WithLabelValues(model).Add(float64(rows))
	}
}

// pushWidth is the values per id of a model's newest validated version
// (0: none, or no such model).
func pushWidth(ms *ModelState) int {
	if ms == nil {
		return 0
	}
	for i := len(ms.Versions) - 1; i >= 0; i-- {
		if v := &ms.Versions[i]; v.Info != nil && v.Phase != PhaseRejected {
			return v.Info.Width()
		}
	}
	return 0
}

// checkReign drops the windows of an earlier reign (the manager lost
// the lead, and perhaps won it again, since they were opened): the
// marks they were offered on may be stale. s.mu is held.
func (s *PushServer) checkReign() {
	r := s.m.reign.Load()
	if !s.m.acting.Load() {
		r = 0
	}
	if r == s.reign {
		return
	}
	for _, l := range s.logs {
		l.fail(errPushStopped)
	}
	s.logs, s.last, s.reign = map[string]*pushLog{}, map[string]uint64{}, r
}

// wait answers a, waiting for its window (or ctx).
func (a *pushAnswer) wait(ctx context.Context) (version uint64, err error) {
	if a.err != nil || a.w == nil {
		return 0, a.err
	}
	select {
	case <-a.w.done:
		return a.w.version, a.w.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// seal seals each model's window when it is due, one at a time, until
// ctx ends.
func (s *PushServer) seal(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		type due struct {
			name string
			l    *pushLog
			w    *pushWindow
		}
		var todo []due
		next := time.Duration(0)
		s.mu.Lock()
		s.checkReign()
		now := time.Now()
		for name, l := range s.logs {
			if l.due(now) {
				todo = append(todo, due{name, l, l.take()})
			} else if d := l.wait(now); d > 0 && (next == 0 || d < next) {
				next = d
			}
		}
		reign := s.reign
		s.mu.Unlock()
		for _, d := range todo {
			start := time.Now()
			version, err := s.publish(d.name, d.l, d.w, reign)
			s.metrics.seal.Observe(time.Since(start).Seconds())
			s.mu.Lock()
			if err != nil {
				slog.Warn("manager: a push window could not be published; its batches are refused", "model", d.name, "err", err)
				s.count(d.name, "failed", 0)
			} else {
				s.last[d.name] = version
			}
			d.l.sealed(d.w, version, err)
			s.mu.Unlock()
		}
		if len(todo) > 0 {
			s.m.newVersions()
			continue // windows may have come due while these were sealed
		}
		if next == 0 {
			next = time.Hour
		}
		timer.Reset(next)
		select {
		case <-ctx.Done():
			s.mu.Lock()
			for _, l := range s.logs {
				l.fail(errPushStopped)
			}
			s.logs, s.closed = map[string]*pushLog{}, true
			s.mu.Unlock()
			return
		case <-s.kick:
		case <-timer.C:
		}
	}
}

// publish writes w as a delta of model on its newest version: the newest
// this reign sealed, or the state's newest not rejected, whichever is
// newer (a full version published meanwhile takes the windows after
// it).
//
// While a pin or a canary holds the model, the windows are held instead:
// each is published merged with those before it, as one delta on the
// version that was newest when the hold began, and the delta it
// replaces is removed (never served, and nothing built on it). When the
// hold ends (or another begins), the held delta is a version like any
// other: the newest, served and built on. A version that comes while
// the model is held takes the held pushes onto it if it does not hold
// them already, unless it is a new full version (a batch job's): that
// one replaces what came before it, held pushes included.
func (s *PushServer) publish(model string, l *pushLog, w *pushWindow, reign uint64) (uint64, error) {
	if !s.m.acting.Load() || s.m.reign.Load() != reign {
		return 0, errPushStopped
	}
	s.mu.Lock()
	parent, held := s.last[model], l.held
	s.mu.Unlock()
	ms := s.m.State().Models[model]
	hold := holdOf(ms)
	if held != nil && held.hold != hold {
		held = nil // the hold ended, or changed: the held delta is a version like any other
	}
	newest := uint64(0) // the newest not rejected, the held delta aside
	if ms != nil {
		for i := len(ms.Versions) - 1; i >= 0; i-- {
			v := &ms.Versions[i]
			if v.Version == parent && v.Phase == PhaseRejected {
				parent = 0 // rejected since: build on what serves
			}
			if v.Phase != PhaseRejected && !v.Gone && v.Broken == "" && (held == nil || v.Version != held.version) {
				newest = v.Version
				break
			}
		}
	}
	if held != nil && parent == held.version {
		parent = 0
	}
	parent = max(parent, newest)
	body, replaced := w, uint64(0)
	switch {
	case hold == "":
	case held == nil:
		held = &heldPushes{hold: hold, base: parent}
	case parent <= max(held.base, held.version):
		parent, body, replaced = held.base, merged(held.rows, w), held.version
	default:
		// A version came meanwhile.
		chain, err := s.m.opts.Repo.Chain(model, parent)
		if err != nil {
			return 0, err
		}
		switch {
		case slices.Contains(codec.ChainVersions(chain), held.version):
			// Built on the held delta: it holds those pushes.
		case chain[0].Kind == codec.KindFull && chain[0].SameAs == 0:
			// A new full version: it replaces them (the README says so).
		default:
			body, replaced = merged(held.rows, w), held.version
		}
		held = &heldPushes{hold: hold, base: parent}
	}
	if parent == 0 {
		return 0, fmt.Errorf("%w: model %s has no version to seal pushes onto", ErrNotFound, model)
	}
	// The loader checks each row's partition against the parent's.
	m, err := s.m.opts.Repo.PublishDelta(model, loader.Delta{Split: body.delta(),
		// The parent's files are the manager's to validate (every version
		// is): not read again on the answer's path.
		// Packed: a window touching hundreds of partitions is one file
		// to create, sync, verify and load, not hundreds.
		Parent: parent, ParentChecked: true, Pack: !s.opts.Unpacked, Source: "push", Pushed: body.pushMarks(time.Now()), Fence: func() error {
			// Still leading, in the same reign, as the version becomes
			// visible: a successor seals its first window only after
			// it has scanned the repository and a window has passed,
			// far longer than a deposed leader takes to learn it.
			if !s.m.acting.Load() || s.m.reign.Load() != reign {
				return errPushStopped
			}
			return nil
		},
		// Not read back by the validator (see validate): told before
		// the version is visible, so before any scan can queue it.
		Written: func(version uint64, dir string) {
			s.m.sealed.add(Validate{Model: model, Version: version}, fingerprint(dir))
		}})
	if err != nil {
		return 0, err
	}
	if held != nil {
		if replaced != 0 && replaced != m.Version && unserved(s.m.State().Models[model], replaced) {
			if err := s.m.removeVersion(s.m.opts.Repo.VersionDir(model, replaced)); err != nil {
				slog.Warn("manager: removing a held push delta, replaced by a newer one", "model", model, "version", replaced, "err", err)
			}
		}
		held = &heldPushes{hold: hold, base: parent, version: m.Version, rows: body.compacted()}
	}
	s.mu.Lock()
	l.held = held
	s.mu.Unlock()
	return m.Version, nil
}

// holdOf names what holds a model's pushes: its pin (a rollback is one)
// or its canary; "" when nothing does.
func holdOf(ms *ModelState) string {
	switch {
	case ms == nil:
		return ""
	case ms.Pin != 0:
		return fmt.Sprintf("pin %d", ms.Pin)
	case ms.Canary != nil:
		return fmt.Sprintf("canary %d", ms.Canary.Version)
	}
	return ""
}

// unserved says whether version v of a model may be removed as a
// replaced held delta: never live, not staged, pinned or the canary, and
// nothing in the state built on it.
func unserved(ms *ModelState, v uint64) bool {
	if ms == nil {
		return true
	}
	if ms.Live == v || ms.Staged == v || ms.Pin == v || ms.Canary != nil && ms.Canary.Version == v {
		return false
	}
	for _, x := range ms.Versions {
		if x.Version == v && x.LiveSeq != 0 || x.Parent == v {
			return false
		}
	}
	return true
}

// pushHTTP is POST /push/v1/models/{name}: one batch, answered once it
// is sealed.
func (s *PushServer) pushHTTP(w http.ResponseWriter, r *http.Request) {
	// The server sets no ReadTimeout (it would cut gRPC streams, which
	// live long): a batch's body gets one of its own.
	http.NewResponseController(w).SetReadDeadline(time.Now().Add(pushBodyTimeout))
	need := s.opts.MaxBatchBytes // a body of unknown length may be that long
	if r.ContentLength >= 0 && r.ContentLength < need {
		need = r.ContentLength
	}
	if !s.receiving.TryAcquire(need) {
		s.count("", "busy", 0)
		writeError(w, http.StatusTooManyRequests, fmt.Sprintf("the push API is receiving its most bytes at once (--max-push-receiving-bytes %d): send again shortly", s.opts.MaxReceiving))
		return
	}
	defer s.receiving.Release(need)
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBatchBytes))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("batch over %d bytes (--max-push-bytes): send smaller batches", s.opts.MaxBatchBytes))
		return
	case errors.Is(err, os.ErrDeadlineExceeded):
		writeError(w, http.StatusRequestTimeout, fmt.Sprintf("the batch's body did not arrive within %s", pushBodyTimeout))
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, "reading the batch: "+err.Error())
		return
	}
	b, err := DecodePushHTTP(body, r.Header.Get(headerLength))
	if err != nil {
		s.count("", "invalid", 0)
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	b.Model = r.PathValue("name")
	a := s.offer(b)
	version, err := a.wait(r.Context())
	if err != nil {
		code, _ := pushCode(err)
		writeJSON(w, code, pushHTTPAnswer(a, 0, err))
		return
	}
	writeJSON(w, http.StatusOK, pushHTTPAnswer(a, version, nil))
}

// maxPushStreams bounds the HTTP/2 streams (gRPC calls) of one
// connection.
const maxPushStreams = 64

// pushBodyTimeout bounds how long an HTTP batch's body may take to
// arrive.
const pushBodyTimeout = 30 * time.Second

// PushAnswer is the HTTP push API's answer.
type PushAnswer struct {
	Model     string `json:"model"`
	Producer  string `json:"producer"`
	Sequence  uint64 `json:"sequence"`
	Version   uint64 `json:"version,omitempty"`
	Duplicate bool   `json:"duplicate,omitempty"`
	Expected  uint64 `json:"expected,omitempty"`
	Error     string `json:"error,omitempty"`
}

func pushHTTPAnswer(a pushAnswer, version uint64, err error) PushAnswer {
	out := PushAnswer{Model: a.model, Producer: a.producer, Sequence: a.sequence, Version: version, Duplicate: a.duplicate}
	if err != nil {
		out.Error = err.Error()
		var se *SequenceError
		if errors.As(err, &se) {
			out.Expected = se.Expected
		}
	}
	return out
}

// pushCode maps a push error to its HTTP status and gRPC code.
func pushCode(err error) (int, codes.Code) {
	switch {
	case errors.Is(err, ErrInvalid):
		return http.StatusBadRequest, codes.InvalidArgument
	case errors.Is(err, ErrNotFound):
		return http.StatusNotFound, codes.NotFound
	case errors.Is(err, ErrSequence):
		return http.StatusConflict, codes.FailedPrecondition
	case errors.Is(err, ErrBusy):
		return http.StatusTooManyRequests, codes.ResourceExhausted
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return http.StatusServiceUnavailable, codes.Canceled
	}
	return http.StatusServiceUnavailable, codes.Unavailable
}

// authStream checks a gRPC call's bearer token.
func (s *PushServer) authStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	md, _ := metadata.FromIncomingContext(ss.Context())
	want := []byte("Bearer " + s.opts.Token)
	if got := md.Get("authorization"); len(got) != 1 || subtle.ConstantTimeCompare([]byte(got[0]), want) != 1 {
		slog.Warn("manager push API: call refused: missing or wrong token", "method", info.FullMethod)
		return status.Error(codes.Unauthenticated, "missing or wrong push token (authorization: Bearer TOKEN)")
	}
	return h(srv, ss)
}

type pushGRPC struct {
	pushpb.UnimplementedPushServer
	s *PushServer
}

// maxPendingAnswers bounds a stream's batches awaiting their answers;
// past it, the stream is read no further until answers go out.
const maxPendingAnswers = 1024

// Send answers each batch of the stream in order, once its window is
// sealed.
func (g pushGRPC) Send(stream pushpb.Push_SendServer) error {
	ctx := stream.Context()
	pending := make(chan pushAnswer, maxPendingAnswers)
	sent := make(chan error, 1)
	go func() {
		var err error
		for a := range pending {
			if err != nil {
				continue // the stream failed: drain
			}
			version, werr := a.wait(ctx)
			ack := &pushpb.Ack{Producer: a.producer, Sequence: a.sequence, Version: version, Duplicate: a.duplicate}
			if werr != nil {
				_, code := pushCode(werr)
				ack.Code, ack.Error = int32(code), werr.Error()
				var se *SequenceError
				if errors.As(werr, &se) {
					ack.Expected = se.Expected
				}
			}
			err = stream.Send(ack)
		}
		sent <- err
	}()
	var rerr error
	for {
		in, err := stream.Recv()
		if err != nil {
			if err != io.EOF {
				rerr = err
			}
			break
		}
		// Counted while it is decoded and offered: past the bound, this
		// stream reads no more until others are done.
		size := int64(8*len(in.GetIds()) + 4*len(in.GetValues()) + 8*len(in.GetDeletes()))
		size = min(max(size, 1), g.s.opts.MaxReceiving)
		if err := g.s.receiving.Acquire(ctx, size); err != nil {
			rerr = err
			break
		}
		b := &PushBatch{Model: in.GetModel(), Producer: in.GetProducer(), Sequence: in.GetSequence(), IDs: in.GetIds(), Values: in.GetValues(), Deletes: in.GetDeletes()}
		a := g.s.offer(b)
		g.s.receiving.Release(size)
		if errors.Is(a.err, ErrNotLeader) {
			rerr = status.Error(codes.Unavailable, a.err.Error())
			break
		}
		pending <- a
	}
	close(pending)
	if err := <-sent; err != nil && rerr == nil {
		rerr = err
	}
	return rerr
}

// servedPushAge is cumulus_push_served_age_seconds: per model whose live
// version is a delta sealed from pushes, how long ago it was sealed.
type servedPushAge struct{ m *Manager }

var servedPushAgeDesc = prometheus.NewDesc("cumulus_push_served_age_seconds",
	"Per model whose live version is a delta sealed from pushes: the time since it was sealed (how old the newest pushed values served are).", []string{"model"}, nil)

func (c servedPushAge) Describe(ch chan<- *prometheus.Desc) { ch <- servedPushAgeDesc }

func (c servedPushAge) Collect(ch chan<- prometheus.Metric) {
	st := c.m.State()
	for name, ms := range st.Models {
		if v := ms.version(ms.Live); v != nil && !v.PushedAt.IsZero() {
			ch <- prometheus.MustNewConstMetric(servedPushAgeDesc, prometheus.GaugeValue, time.Since(v.PushedAt).Seconds(), name)
		}
	}
}
