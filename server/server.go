package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/internal/admit"
	"github.com/cumulus-serving/cumulus/internal/peerlimit"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// Version is reported by ServerMetadata.
const Version = "0.1.0"

// extensions are the protocol extensions server metadata lists: KServe's
// and Triton's name for the binary tensor extension.
var extensions = []string{"binary_tensor_data"}

// Predictor is what the front needs of a router.
type Predictor interface {
	Predict(ctx context.Context, req *router.Request) (*router.Response, error)
	Ready() bool
	Model(name string) (router.ModelStatus, bool)
	// Revision is the etcd revision of the cluster state it serves from;
	// 0 until it has read it.
	Revision() int64
}

// Options configure the front. Zero values mean the documented default.
type Options struct {
	// Predictor answers requests; required.
	Predictor Predictor
	// GRPCAddr is the KServe gRPC listen address. Default 127.0.0.1:8001.
	GRPCAddr string
	// HTTPAddr is the HTTP/JSON, health and metrics address.
	// Default 127.0.0.1:8000.
	HTTPAddr string
	// TLS, if set, serves both addresses over TLS; with a CA, only to
	// clients whose certificate it signed (see tlsconf).
	TLS *tlsconf.Source
	// MaxRequestBytes bounds one HTTP request body. Default: what the
	// largest request within Limits needs as JSON (jsonBodyLimit: about
	// 42 MB for a million ids). The gRPC receive limit is the smaller of
	// this and the largest message that can carry Limits' ids and rows
	// (grpcRecvLimit).
	MaxRequestBytes int
	// Limits bound one request; bodies are decoded only up to them.
	// Give the router's.
	Limits router.Limits
	// RequestTimeout bounds a request from its arrival: an HTTP body must
	// be read within it, and a caller's longer deadline (gRPC's, or the
	// request's timeout parameter) is cut to it. Default 1s, the
	// router's default.
	RequestTimeout time.Duration
	// MaxInflight bounds the infer requests admitted at once; past it, a
	// request waits at most MaxQueueTime, then is refused
	// (ResourceExhausted, HTTP 429). Default 4 per CPU.
	MaxInflight int
	// MaxInflightBytes bounds the bytes of the requests admitted at once:
	// HTTP bodies by their Content-Length (a body of unknown length
	// weighs MaxRequestBytes), gRPC requests by their decoded ids and
	// values. Default 256 MiB.
	MaxInflightBytes int64
	// MaxQueueTime is the longest an infer request waits for admission.
	// Default 5ms.
	MaxQueueTime time.Duration
	// MaxReceivingBytes bounds what the requests still arriving hold
	// (reception.go): HTTP bodies by the chunks they have been read into,
	// gRPC messages by the bytes of their frames arrived, every request a
	// few KiB besides. Past it a request is refused (ResourceExhausted,
	// HTTP 429); a gRPC connection whose frames would take it past is
	// closed. Default half of
	// MaxInflightBytes, and at least what two bodies of MaxRequestBytes
	// need.
	MaxReceivingBytes int64
	// MaxReceivingPerPeer bounds what the requests arriving from one
	// client address hold, counted as MaxReceivingBytes is. Default a
	// quarter of MaxReceivingBytes, and at least what one body of
	// MaxRequestBytes needs (less is refused at start).
	MaxReceivingPerPeer int64
	// ReceiveTimeout is how long a request's bytes may take to arrive,
	// from its arrival, plus 200ms per MB of an HTTP body's
	// Content-Length; never past the request's own deadline. A request
	// still arriving then is cut off: HTTP 408 and the connection closed,
	// a gRPC stream ended with DeadlineExceeded, answered once
	// HeaderTimeout has passed since its arrival (holdCut says when
	// sooner). Default 200ms.
	ReceiveTimeout time.Duration
	// MaxConnsPerPeer bounds the connections one client address holds
	// open on each front; one past it is held unread for HeaderTimeout,
	// then closed (internal/peerlimit). Default 64.
	MaxConnsPerPeer int
	// HeaderTimeout bounds how long a connection may take to send its
	// request headers (HTTP) or to establish itself (gRPC: TLS and the
	// HTTP/2 preface). Default 2s.
	HeaderTimeout time.Duration
	// Registry receives the front's metrics; Gatherer is served at
	// /metrics. Both default to the Prometheus default registry.
	Registry prometheus.Registerer
	Gatherer prometheus.Gatherer
}

// Validate checks required fields and fills defaults.
func (o *Options) Validate() error {
	if o.Predictor == nil {
		return errors.New("server: Options.Predictor is required")
	}
	if o.GRPCAddr == "" {
		o.GRPCAddr = "127.0.0.1:8001"
	}
	if o.HTTPAddr == "" {
		o.HTTPAddr = "127.0.0.1:8000"
	}
	var err error
	if o.Limits, err = o.Limits.OrDefault(); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	if o.MaxRequestBytes == 0 {
		o.MaxRequestBytes = jsonBodyLimit(o.Limits)
	}
	if o.RequestTimeout == 0 {
		o.RequestTimeout = time.Second
	}
	if err := admit.Defaults(&o.MaxInflight, &o.MaxInflightBytes, &o.MaxQueueTime, 4); err != nil {
		return fmt.Errorf("server: %w", err)
	}
	if o.MaxConnsPerPeer == 0 {
		o.MaxConnsPerPeer = 64
	}
	if o.HeaderTimeout == 0 {
		o.HeaderTimeout = 2 * time.Second
	}
	if o.MaxRequestBytes < 0 || o.RequestTimeout < 0 || o.MaxReceivingBytes < 0 || o.MaxReceivingPerPeer < 0 || o.ReceiveTimeout < 0 || o.MaxConnsPerPeer < 0 || o.HeaderTimeout < 0 {
		return errors.New("server: limits and timeouts must not be negative")
	}
	need := bodyCharge(int64(o.MaxRequestBytes))
	if o.MaxReceivingBytes == 0 {
		o.MaxReceivingBytes = max(o.MaxInflightBytes/2, 2*need)
	}
	if o.MaxReceivingPerPeer == 0 {
		o.MaxReceivingPerPeer = max(o.MaxReceivingBytes/4, need)
	}
	if o.ReceiveTimeout == 0 {
		o.ReceiveTimeout = 200 * time.Millisecond
	}
	if min(o.MaxReceivingBytes, o.MaxReceivingPerPeer) < need {
		return fmt.Errorf("server: a body of MaxRequestBytes (%d) needs %d bytes of reception, more than MaxReceivingBytes (%d) or MaxReceivingPerPeer (%d) allow: raise them or lower MaxRequestBytes",
			o.MaxRequestBytes, need, o.MaxReceivingBytes, o.MaxReceivingPerPeer)
	}
	if o.Registry == nil {
		o.Registry = prometheus.DefaultRegisterer
	}
	if o.Gatherer == nil {
		o.Gatherer = prometheus.DefaultGatherer
	}
	return nil
}

// Server is the network front of a router: KServe v2 over gRPC and
// HTTP/JSON, health, metrics.
type Server struct {
	opts      Options
	grpcLis   net.Listener
	httpLis   net.Listener
	grpc      *grpc.Server
	http      *http.Server
	done      sync.WaitGroup
	adm       *admission
	recv      *reception
	codec     requestCodec
	requests  *prometheus.CounterVec
	latencies *prometheus.HistogramVec
	draining  atomic.Bool
	inflight  atomic.Int64 // requests under way, both protocols
	heldCuts  atomic.Int64 // requests cut off and not yet answered (holdCut)
	holds     context.Context
	endHolds  context.CancelFunc // answers every request held, at stop
}

// Start listens on both addresses and serves until Close.
func Start(opts Options) (*Server, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &Server{opts: opts, adm: newAdmission(&opts), recv: newReception(&opts),
		codec: newRequestCodec(bodyLimits{maxIDs: opts.Limits.MaxIDs, maxRows: opts.Limits.MaxRows})}
	s.holds, s.endHolds = context.WithCancel(context.Background())
	s.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cumulus_infer_requests_total", Help: "Infer requests by API and outcome."}, []string{"api", "code"})
	s.latencies = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "cumulus_infer_seconds", Help: "Infer latency by API.",
		Buckets: prometheus.ExponentialBuckets(100e-6, 2, 16)}, []string{"api"})
	receiving := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "cumulus_receiving_bytes",
		Help: "What the infer requests still arriving are counted at now (MaxReceivingBytes bounds it)."}, func() float64 { return float64(s.recv.bytes()) })
	held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "cumulus_cut_requests_held",
		Help: "Requests cut off for arriving too slowly whose answer is held until HeaderTimeout after their arrival."}, func() float64 { return float64(s.heldCuts.Load()) })
	connsRefused := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cumulus_connections_refused_total",
		Help: "Connections refused, their client address holding MaxConnsPerPeer already (held unread for HeaderTimeout, then closed), by API."}, []string{"api"})
	connsCut := prometheus.NewCounter(prometheus.CounterOpts{Name: "cumulus_grpc_connections_cut_total",
		Help: "gRPC connections closed because their DATA kept the messages in reception past MaxReceivingBytes or MaxReceivingPerPeer for longer than the later of ReceiveTimeout and HeaderTimeout, and a second."})
	for _, c := range []prometheus.Collector{s.requests, s.latencies, s.adm.refused, s.adm.refusedIn, s.adm.waiting, receiving, held, connsRefused, connsCut} {
		if err := opts.Registry.Register(c); err != nil {
			return nil, fmt.Errorf("server: metrics: %w", err)
		}
	}
	var err error
	if s.grpcLis, err = net.Listen("tcp", opts.GRPCAddr); err != nil {
		return nil, fmt.Errorf("server: gRPC: %w", err)
	}
	if s.httpLis, err = net.Listen("tcp", opts.HTTPAddr); err != nil {
		s.grpcLis.Close()
		return nil, fmt.Errorf("server: HTTP: %w", err)
	}
	s.grpcLis = peerlimit.Limit(s.grpcLis, opts.MaxConnsPerPeer, opts.HeaderTimeout, connsRefused.WithLabelValues("grpc").Inc)
	s.httpLis = peerlimit.Limit(s.httpLis, opts.MaxConnsPerPeer, opts.HeaderTimeout, connsRefused.WithLabelValues("http").Inc)
	gopts := []grpc.ServerOption{grpc.MaxRecvMsgSize(grpcRecvLimit(opts)), grpc.ChainUnaryInterceptor(s.counting, s.timing),
		// Streams past admission are refused at once, not queued in the
		// transport; this only bounds what one connection can pile up.
		grpc.MaxConcurrentStreams(uint32(max(4*opts.MaxInflight, 100))),
		grpc.ConnectionTimeout(opts.HeaderTimeout),
		grpc.ForceServerCodecV2(s.codec)}
	creds := insecure.NewCredentials()
	if opts.TLS != nil {
		creds = opts.TLS.GRPC("router front (gRPC)")
	}
	// Messages are counted as their frames arrive (h2watch.go).
	gopts = append(gopts, grpc.Creds(watchCreds{TransportCredentials: creds, r: s.recv, wait: max(opts.ReceiveTimeout, opts.HeaderTimeout) + time.Second, closed: connsCut.Inc}))
	s.grpc = grpc.NewServer(gopts...)
	s.grpc.RegisterService(s.inferenceService(), &kserveGRPC{s: s})
	healthpb.RegisterHealthServer(s.grpc, healthService{s: s})
	reflection.Register(s.grpc)
	routes := s.routes()
	// Infer bodies are read under the request's deadline (inferHTTP);
	// these bound the rest: headers, and connections left idle.
	s.http = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.inflight.Add(1)
		defer s.inflight.Add(-1)
		routes.ServeHTTP(w, r)
	}), ReadHeaderTimeout: opts.HeaderTimeout, IdleTimeout: time.Minute}
	serveHTTP := func() { s.http.Serve(s.httpLis) }
	if opts.TLS != nil {
		s.http.TLSConfig, s.http.ErrorLog = opts.TLS.Server(), tlsconf.HTTPErrorLog("router front (HTTP)")
		serveHTTP = func() { s.http.ServeTLS(s.httpLis, "", "") }
	}
	s.done.Add(2)
	go func() { defer s.done.Done(); s.grpc.Serve(s.grpcLis) }()
	go func() { defer s.done.Done(); serveHTTP() }()
	return s, nil
}

// grpcRecvLimit is the largest gRPC message a request within o.Limits
// can need: every id (shared ones too) as a 10-byte varint with a 4-byte
// value, a 2-byte field (fields are below model.MaxFields) and a 4-byte
// continuous feature (dense has at most as many elements as ids), every
// row split as a varint, and 64 KiB for names, shapes and framing; or
// MaxRequestBytes if smaller. A larger message is refused from its
// length prefix, before it is read.
func grpcRecvLimit(o Options) int {
	need := int64(o.Limits.MaxIDs)*20 + int64(o.Limits.MaxRows+1)*10 + 64<<10
	return int(min(need, int64(o.MaxRequestBytes)))
}

// jsonBodyLimit is the largest JSON body a request within l needs: 64
// bytes an id (a 20-digit id, a value of up to 17 characters, a field of
// up to 4 digits and a continuous feature of up to 17, with their
// commas), 24 a row split, and 64 KiB for the rest. A larger body is
// refused from its Content-Length, before it is read.
func jsonBodyLimit(l router.Limits) int {
	return int(min(int64(l.MaxIDs)*64+int64(l.MaxRows+1)*24+64<<10, math.MaxInt32))
}

// GRPCAddr and HTTPAddr are the bound addresses.
func (s *Server) GRPCAddr() string { return s.grpcLis.Addr().String() }
func (s *Server) HTTPAddr() string { return s.httpLis.Addr().String() }

// Close drains in-flight requests for up to 5 seconds, then stops.
func (s *Server) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.stop(ctx)
}

// Drain stops the front without failing a request, for a rolling
// restart: at once it answers not ready (/v2/health/ready 503, gRPC
// health NOT_SERVING, ServerReady false); then gRPC clients are told to
// go elsewhere (GOAWAY) and the HTTP server stops accepting and closes
// idle connections, while the requests under way finish. If ctx ends
// first, it stops at once, failing what is under way, and says so. The
// Predictor must keep serving until Drain returns.
func (s *Server) Drain(ctx context.Context) error {
	t0 := time.Now()
	slog.Info("server: draining", "in_flight", s.inflight.Load())
	left, err := s.stop(ctx)
	took := time.Since(t0).Round(time.Millisecond)
	if err != nil {
		slog.Warn("server: drain timed out; stopped, failing the requests under way", "in_flight", left, "took", took)
		return fmt.Errorf("server: drain: %w with %d requests under way; they were failed", err, left)
	}
	slog.Info("server: drained", "took", took)
	return nil
}

// stop drains until ctx ends, then stops hard; left is the number of
// requests then still under way.
func (s *Server) stop(ctx context.Context) (left int64, err error) {
	s.draining.Store(true)
	s.endHolds()
	stopped := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(stopped) }()
	err = s.http.Shutdown(ctx)
	if err == nil {
		select {
		case <-stopped:
		case <-ctx.Done():
			err = ctx.Err()
		}
	}
	if err != nil {
		left = s.inflight.Load()
		s.grpc.Stop()
		s.http.Close()
	}
	s.done.Wait()
	return left, err
}

// ready is what readiness reports: the router can serve and the front is
// not draining.
func (s *Server) ready() bool { return !s.draining.Load() && s.opts.Predictor.Ready() }

// Ready is readiness as an error saying why not (for a probe address).
func (s *Server) Ready(context.Context) error {
	switch {
	case s.draining.Load():
		return errors.New("draining")
	case !s.opts.Predictor.Ready():
		return errors.New("a model the router is assigned cannot be served yet")
	}
	return nil
}

// healthService is gRPC health as readiness: SERVING while the router
// can serve and the front is not draining, for the whole server ("") and
// the KServe service. Watch is not implemented: clients that health-check
// with it then treat the server as healthy, and GOAWAY moves them away
// when it drains.
type healthService struct {
	healthpb.UnimplementedHealthServer
	s *Server
}

func (h healthService) Check(_ context.Context, r *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	switch r.Service {
	case "", kservepb.GRPCInferenceService_ServiceDesc.ServiceName:
	default:
		return nil, status.Errorf(codes.NotFound, "server: no service %q", r.Service)
	}
	if h.s.ready() {
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}, nil
}

func (s *Server) counting(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	return h(ctx, req)
}

func (s *Server) timing(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if info.FullMethod != kservepb.GRPCInferenceService_ModelInfer_FullMethodName {
		return h(ctx, req)
	}
	t0 := time.Now()
	defer func() { s.latencies.WithLabelValues("grpc").Observe(time.Since(t0).Seconds()) }()
	return h(ctx, req)
}

func (s *Server) observe(api string, err error) {
	s.requests.WithLabelValues(api, classify(err).label).Inc()
}

// outcome is how an error (or success) reaches clients and metrics.
type outcome struct {
	grpc  codes.Code
	http  int
	label string
}

// classify maps the router's error codes (router/errors.go) to gRPC codes
// and HTTP statuses. Anything unclassified is Unavailable: retryable.
func classify(err error) outcome {
	switch {
	case err == nil:
		return outcome{codes.OK, http.StatusOK, "ok"}
	case errors.Is(err, errReceiveTooSlow):
		return outcome{codes.DeadlineExceeded, http.StatusRequestTimeout, "receive_timeout"}
	case errors.Is(err, router.ErrInvalidArgument):
		return outcome{codes.InvalidArgument, http.StatusBadRequest, "invalid_argument"}
	case errors.Is(err, router.ErrNotFound):
		return outcome{codes.NotFound, http.StatusNotFound, "not_found"}
	case errors.Is(err, router.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return outcome{codes.DeadlineExceeded, http.StatusGatewayTimeout, "deadline_exceeded"}
	case errors.Is(err, router.ErrResourceExhausted):
		return outcome{codes.ResourceExhausted, http.StatusTooManyRequests, "resource_exhausted"}
	case errors.Is(err, router.ErrInternal):
		return outcome{codes.Internal, http.StatusInternalServerError, "internal"}
	case errors.Is(err, context.Canceled):
		// The client went away; nobody reads the answer. 499 is nginx's
		// "client closed request".
		return outcome{codes.Canceled, 499, "canceled"}
	}
	// gRPC's own refusals, before Cumulus has the message: one over the
	// receive limit, one that is not protobuf.
	switch st, _ := status.FromError(err); st.Code() {
	case codes.ResourceExhausted:
		return outcome{codes.ResourceExhausted, http.StatusTooManyRequests, "resource_exhausted"}
	case codes.InvalidArgument, codes.Internal:
		return outcome{st.Code(), http.StatusBadRequest, "invalid_argument"}
	}
	return outcome{codes.Unavailable, http.StatusServiceUnavailable, "unavailable"}
}

// model describes a served model: ErrNotFound when it is not served,
// ErrUnavailable while the router has not yet read which models are (a
// router just started: a client of a restarted router must not be told
// that a served model does not exist).
func (s *Server) model(name string) (router.ModelStatus, error) {
	st, ok := s.opts.Predictor.Model(name)
	switch {
	case ok:
		return st, nil
	case s.opts.Predictor.Revision() == 0:
		return st, fmt.Errorf("server: %w: the router has not read the serving map yet", router.ErrUnavailable)
	}
	return st, fmt.Errorf("server: %w: model %q is not served", router.ErrNotFound, name)
}

// knownModel fails for a model that is not served (see model), so that
// answer comes before any complaint about the request's inputs.
func (s *Server) knownModel(name string) error {
	_, err := s.model(name)
	return err
}

func (s *Server) modelReady(name, version string) (bool, error) {
	st, err := s.model(name)
	if err != nil {
		return false, err
	}
	if version == "" {
		return st.Ready, nil
	}
	v, err := strconv.ParseUint(version, 10, 64)
	if err != nil {
		return false, badInput("model version %q is not a positive integer", version)
	}
	for _, have := range st.Versions {
		if have == v {
			return true, nil
		}
	}
	return false, nil
}

// tensorMeta and modelMeta mirror the KServe metadata shapes.
type tensorMeta struct {
	Name     string  `json:"name"`
	Datatype string  `json:"datatype"`
	Shape    []int64 `json:"shape"`
}

type modelMeta struct {
	Name     string       `json:"name"`
	Versions []string     `json:"versions"`
	Platform string       `json:"platform"`
	Inputs   []tensorMeta `json:"inputs"`
	Outputs  []tensorMeta `json:"outputs"`
}

// metadata describes model name, or its version (when not ""), which
// must be served.
func (s *Server) metadata(name, version string) (*modelMeta, error) {
	st, err := s.model(name)
	if err != nil {
		return nil, err
	}
	if version != "" {
		v, err := strconv.ParseUint(version, 10, 64)
		if err != nil || v == 0 {
			return nil, badInput("model version %q is not a positive integer", version)
		}
		if !slices.Contains(st.Versions, v) {
			return nil, fmt.Errorf("server: %w: model %q version %d is not served (servable: %v)", router.ErrNotFound, name, v, st.Versions)
		}
	}
	md := &modelMeta{Name: name, Platform: "cumulus_" + st.Type, Versions: []string{},
		Outputs: []tensorMeta{{outScores, "FP32", []int64{-1}}},
	}
	for _, in := range st.Shape.Inputs() {
		md.Inputs = append(md.Inputs, tensorMeta{in.Name, in.Datatype, in.Shape})
	}
	for _, v := range st.Versions {
		md.Versions = append(md.Versions, strconv.FormatUint(v, 10))
	}
	return md, nil
}
