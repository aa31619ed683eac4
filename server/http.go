package server

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cumulus-serving/cumulus/internal/admit"
	"github.com/cumulus-serving/cumulus/router"
)

func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	// KServe's REST clients read these bodies, not only the status.
	mux.HandleFunc("GET /v2/health/live", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]bool{"live": true})
	})
	mux.HandleFunc("GET /v2/health/ready", func(w http.ResponseWriter, r *http.Request) {
		ready := s.ready()
		code := http.StatusOK
		if !ready {
			code = http.StatusServiceUnavailable
		}
		writeJSON(w, code, map[string]bool{"ready": ready})
	})
	mux.HandleFunc("GET /v2", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]any{"name": "cumulus", "version": Version, "extensions": extensions})
	})
	mux.HandleFunc("GET /v2/models/{name}", s.httpMetadata)
	mux.HandleFunc("GET /v2/models/{name}/versions/{version}", s.httpMetadata)
	mux.HandleFunc("GET /v2/models/{name}/ready", s.httpModelReady)
	mux.HandleFunc("GET /v2/models/{name}/versions/{version}/ready", s.httpModelReady)
	mux.HandleFunc("POST /v2/models/{name}/infer", s.httpInfer)
	mux.HandleFunc("POST /v2/models/{name}/versions/{version}/infer", s.httpInfer)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.opts.Gatherer, promhttp.HandlerOpts{}))
	return mux
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// writeError maps router error codes to HTTP statuses; the body is
// KServe's {"error": "..."}, with the error's reason.
func writeError(w http.ResponseWriter, err error) {
	writeJSON(w, classify(err).http, map[string]string{"error": router.Reason(err)})
}

func (s *Server) httpMetadata(w http.ResponseWriter, r *http.Request) {
	md, err := s.metadata(r.PathValue("name"), r.PathValue("version"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, md)
}

func (s *Server) httpModelReady(w http.ResponseWriter, r *http.Request) {
	ready, err := s.modelReady(r.PathValue("name"), r.PathValue("version"))
	if err != nil {
		writeError(w, err)
		return
	}
	if !ready {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) httpInfer(w http.ResponseWriter, r *http.Request) {
	t0 := time.Now()
	var clientID string
	err := s.inferHTTP(w, r, t0, &clientID)
	s.latencies.WithLabelValues("http").Observe(time.Since(t0).Seconds())
	s.observe("http", err)
	if errors.Is(err, errReceiveTooSlow) {
		// Not r.Context(): the read cut off ended it. A client that
		// leaves meanwhile goes unnoticed, its connection unread.
		s.holdCut(context.Background(), t0, nil)
	}
	if err != nil {
		if classify(err).http == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "1")
		}
		// Its reason and request id (requestid.go).
		id := requestID(clientID)
		reason := s.told(r.Context(), "http", r.PathValue("name"), id, err)
		w.Header().Set(headerRequestID, id)
		writeJSON(w, classify(err).http, map[string]string{"error": reason, "id": id})
	}
}

// inferHTTP answers one REST infer call, or returns the error to answer
// with. Each step costs more than the one before: a model that is not
// served, or a body announced over the limit, is refused first, and so is
// any request while admission is refusing at once (every slot taken, the
// queue full); then the body is received, holding only the chunks its
// bytes fill (reception.go, body.go) and only for its receive time; then
// it takes a request slot and is decoded, stopping at the first element
// past a limit; then its decoded bytes are admitted. A slow sender holds
// bytes, never a slot.
func (s *Server) inferHTTP(w http.ResponseWriter, r *http.Request, t0 time.Time, clientID *string) error {
	deadline := t0.Add(s.opts.RequestTimeout)
	rd := s.receiveDeadline(t0, r.ContentLength, deadline)
	// From here on the body arrives within its receive time, also when
	// it is refused unread: net/http then reads and discards a small one
	// to keep the connection, and must not wait on a slow sender for it.
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(rd)
	model := r.PathValue("name")
	if err := s.knownModel(model); err != nil {
		return err
	}
	if r.ContentLength > int64(s.opts.MaxRequestBytes) {
		w.Header().Set("Connection", "close") // the body is not read
		return badInput("request body of %d bytes is over the limit of %d bytes", r.ContentLength, s.opts.MaxRequestBytes)
	}
	ctx, cancel := context.WithDeadline(r.Context(), deadline)
	defer cancel()
	if s.adm.slots.Refusing(1, s.recv.admitting()) {
		closeUnread(w, r, rc)
		return s.refusal(ctx, "http", "requests", admit.ErrOverloaded, t0)
	}
	b, err := s.receiveHTTP(w, r, rc, t0, rd, deadline)
	if err != nil {
		return err
	}
	defer b.release()
	slot, err := s.adm.slots.Acquire(ctx, 1)
	if err != nil {
		return s.refusal(ctx, "http", "requests", err, t0)
	}
	defer slot.Release()
	ib, err := decodeBody(b.body, r.Header.Get(headerLength), bodyLimits{maxIDs: s.opts.Limits.MaxIDs, maxRows: s.opts.Limits.MaxRows})
	b.release() // decoded: the body's chunks go back now
	if err != nil {
		return err
	}
	*clientID = ib.id
	req, err := buildRequest(model, r.PathValue("version"), ib.inputs)
	if err != nil {
		return err
	}
	req.CanaryKey = cmp.Or(ib.canaryKey, ib.id)
	t1 := time.Now()
	held, err := s.adm.bytes.Acquire(ctx, requestBytes(req))
	if err != nil {
		return s.refusal(ctx, "http", "bytes", err, t1)
	}
	defer held.Release()
	if ib.timeout > 0 { // counted from arrival, like the server's own bound
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, t0.Add(ib.timeout))
		defer cancel()
	}
	res, err := s.opts.Predictor.Predict(ctx, req)
	if err != nil {
		return err
	}
	binaryOut := ib.binaryOutput()
	out := appendJSONResponse(make([]byte, 0, 128+16*len(res.Scores)), res.Model, res.Version, ib.id, ib.idSet, res.Scores, binaryOut)
	if binaryOut {
		w.Header().Set(headerLength, strconv.Itoa(len(out)))
		w.Header().Set("Content-Type", "application/octet-stream")
		out = appendFloat32s(out, res.Scores)
	} else {
		w.Header().Set("Content-Type", "application/json")
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	w.WriteHeader(http.StatusOK)
	w.Write(out)
	return nil
}

// receivedBody is a body received whole and its share of reception,
// given back together by release (idempotent).
type receivedBody struct {
	*body
	x *receiving
}

func (b receivedBody) release() {
	b.free()
	b.x.done()
}

// receiveHTTP reads r's body within its receive time rd (already the
// connection's read deadline: inferHTTP), counted in reception. A body refused by a reception bound, or cut off,
// gets its answer with the connection closed: the rest of it is never
// read.
func (s *Server) receiveHTTP(w http.ResponseWriter, r *http.Request, rc *http.ResponseController, t0, rd, deadline time.Time) (receivedBody, error) {
	x, err := s.recv.begin(r.RemoteAddr, receiveOverhead)
	var refused errReceiving
	if errors.As(err, &refused) {
		closeUnread(w, r, rc)
		return receivedBody{}, s.receiveRefusal("http", refused, t0)
	}
	b, err := readBody(r, s.opts.MaxRequestBytes, x)
	x.arrived()
	if err == nil {
		// Once the body has ended, net/http reads on in the background
		// (to see the client leave), and a deadline passing then would
		// cancel the context of the connection, so of every request it
		// carries after this one: no deadline now. If it passed already,
		// the connection is not kept.
		rc.SetReadDeadline(time.Time{})
		if !time.Now().Before(rd) {
			w.Header().Set("Connection", "close")
		}
		return receivedBody{b, x}, nil
	}
	// The rest of the body is never read: the connection closes after
	// the answer, and net/http must not wait on the sender to discard
	// what is left of it first.
	w.Header().Set("Connection", "close")
	rc.SetReadDeadline(time.Now())
	var cut errBodyCut
	switch {
	case errors.As(err, &refused):
		err = s.receiveRefusal("http", refused, t0)
	case errors.As(err, &cut) && rd.Before(deadline):
		err = errReceiveTimeout("the request body", int64(cut.n), rd.Sub(t0))
	case errors.As(err, &cut):
		err = errBodyDeadline(cut)
	}
	x.done()
	return receivedBody{}, err
}

// closeUnread has a refused request answered without its body being
// read: net/http would otherwise read what it can of it first, to keep
// the connection. A small body is still read and discarded, keeping it.
func closeUnread(w http.ResponseWriter, r *http.Request, rc *http.ResponseController) {
	if r.ContentLength < 0 || r.ContentLength > unreadBodyToDiscard {
		w.Header().Set("Connection", "close")
		rc.SetReadDeadline(time.Now())
	}
}

// unreadBodyToDiscard is the largest body of a refused request that is
// left for net/http to read and discard, under the request's read
// deadline, so that the client's connection is kept; a refused request
// with a larger or unknown body gets its answer at once and the
// connection closed.
const unreadBodyToDiscard = 64 << 10

// decodeBody decodes an infer request body: all JSON, or, with the
// binary extension's header length hdr, a JSON header of that length and
// then the binary inputs' bytes.
func decodeBody(body *body, hdr string, lim bodyLimits) (*inferBody, error) {
	if hdr == "" {
		b, err := newJSONDecoder(body.section(0, body.n), lim).decode()
		if err != nil {
			return nil, err
		}
		for _, t := range b.inputs {
			if t.binarySize >= 0 {
				return nil, badInput("input %q has parameters.binary_data_size, but the request has no %s header", t.name, headerLength)
			}
		}
		return b, nil
	}
	n, err := strconv.Atoi(hdr)
	if err != nil || n < 0 || n > body.n {
		return nil, badInput("%s %q is not a length from 0 to the body's %d bytes", headerLength, hdr, body.n)
	}
	b, err := newJSONDecoder(body.section(0, n), lim).decode()
	if err != nil {
		return nil, err
	}
	return b, readBinaryInputs(body.section(n, body.n-n), b, lim)
}

// headerLength is the binary tensor extension's header: the length of
// the JSON that starts the body, before the inputs' bytes.
const headerLength = "Inference-Header-Content-Length"

// readBinaryInputs decodes b's binary inputs from raw, the body after
// the JSON header, in input order: each is checked against its datatype,
// its shape and the limits before its bytes are taken. Bytes after the
// last are an error.
func readBinaryInputs(raw *bodyReader, b *inferBody, lim bodyLimits) error {
	total := 0
	for i := range b.inputs {
		t := &b.inputs[i]
		if t.binarySize < 0 {
			total += t.count()
			continue
		}
		size := datatypeSize(t.datatype)
		if size == 0 {
			return t.unsupported()
		}
		n, err := elements(t.name, t.shape)
		if err != nil {
			return err
		}
		if cap := lim.elementCap(t.name); n > cap {
			return badInput("input %q has %d elements, over the limit of %d", t.name, n, cap)
		}
		if int64(n)*int64(size) != t.binarySize {
			return badInput("input %q: binary_data_size %d for shape %v of %s (want %d)", t.name, t.binarySize, t.shape, t.datatype, n*size)
		}
		if t.binarySize > int64(raw.Len()) {
			return badInput("input %q: the body ends before its %d bytes of binary data (%d left)", t.name, t.binarySize, raw.Len())
		}
		if total += n; total > lim.total() {
			return badInput("inputs have more than %d elements in all", lim.total())
		}
		if err := t.readRaw(raw, int(t.binarySize)); err != nil {
			return err
		}
	}
	if raw.Len() > 0 {
		return badInput("request body has %d bytes after the last binary input", raw.Len())
	}
	return nil
}
