package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/cumulus-serving/cumulus/internal/admit"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
		writeJSON(w, http.StatusOK, map[string]any{"name": "cumulus", "version": Version, "extensions": []string{}})
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
// KServe's {"error": "..."}.
func writeError(w http.ResponseWriter, err error) {
	writeJSON(w, classify(err).http, map[string]string{"error": err.Error()})
}

func (s *Server) httpMetadata(w http.ResponseWriter, r *http.Request) {
	md, err := s.metadata(r.PathValue("name"))
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
	err := s.inferHTTP(w, r, t0)
	s.latencies.WithLabelValues("http").Observe(time.Since(t0).Seconds())
	s.observe("http", err)
	if err != nil {
		if errors.Is(err, admit.ErrOverloaded) {
			w.Header().Set("Retry-After", "1")
		}
		writeError(w, err)
	}
}

// inferHTTP answers one REST infer call, or returns the error to answer
// with. In order, each step before the next costs more: a model that is
// not served, then admission (a slot, then the body's bytes by its
// Content-Length), all refused before the body is read; the body is read
// under the request's deadline and decoded as it arrives, stopping at the
// first element past a limit.
func (s *Server) inferHTTP(w http.ResponseWriter, r *http.Request, t0 time.Time) error {
	model := r.PathValue("name")
	if err := s.knownModel(model); err != nil {
		return err
	}
	if r.ContentLength > int64(s.opts.MaxRequestBytes) {
		w.Header().Set("Connection", "close") // the body is not read
		return badInput("request body of %d bytes is over the limit of %d bytes", r.ContentLength, s.opts.MaxRequestBytes)
	}
	ctx, cancel := context.WithDeadline(r.Context(), t0.Add(s.opts.RequestTimeout))
	defer cancel()
	// A body trickled in slower than the request may take is cut off.
	http.NewResponseController(w).SetReadDeadline(t0.Add(s.opts.RequestTimeout))
	release, err := s.admit(ctx, "http", r.ContentLength)
	if err != nil {
		if r.ContentLength < 0 || r.ContentLength > unreadBodyToDiscard {
			// Answer without reading the body at all: net/http would
			// otherwise read what it can of it first, to keep the
			// connection.
			w.Header().Set("Connection", "close")
		}
		return err
	}
	defer release()
	body := http.MaxBytesReader(w, r.Body, int64(s.opts.MaxRequestBytes))
	b, err := decodeBody(body, r.Header.Get(headerLength), int64(s.opts.MaxRequestBytes),
		bodyLimits{maxIDs: s.opts.Limits.MaxIDs, maxRows: s.opts.Limits.MaxRows})
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("server: %w: reading the request body: %v", router.ErrDeadlineExceeded, err)
		}
		return err
	}
	req, err := buildRequest(model, r.PathValue("version"), b.inputs)
	if err != nil {
		return err
	}
	if b.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.timeout)
		defer cancel()
	}
	res, err := s.opts.Predictor.Predict(ctx, req)
	if err != nil {
		return err
	}
	out := appendJSONResponse(make([]byte, 0, 128+16*len(res.Scores)), res.Model, res.Version, b.id, b.idSet, res.Scores, b.binaryOutput)
	if b.binaryOutput {
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

// unreadBodyToDiscard is the largest body of a refused request that is
// left for net/http to read and discard, under the request's read
// deadline, so that the client's connection is kept; a refused request
// with a larger or unknown body gets its answer at once and the
// connection closed.
const unreadBodyToDiscard = 64 << 10

// decodeBody decodes an infer request body: all JSON, or, with the
// binary extension's header length hdr, a JSON header of that length and
// then the binary inputs' bytes.
func decodeBody(body io.Reader, hdr string, maxBytes int64, lim bodyLimits) (*inferBody, error) {
	if hdr == "" {
		b, err := newJSONDecoder(body, lim).decode()
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
	n, err := strconv.ParseInt(hdr, 10, 64)
	if err != nil || n < 0 || n > maxBytes {
		return nil, badInput("%s %q is not a length from 0 to %d", headerLength, hdr, maxBytes)
	}
	b, err := newJSONDecoder(io.LimitReader(body, n), lim).decode()
	if err != nil {
		return nil, err
	}
	return b, readBinaryInputs(body, b, lim)
}

// headerLength is the binary tensor extension's header: the length of
// the JSON that starts the body, before the inputs' bytes.
const headerLength = "Inference-Header-Content-Length"

// readBinaryInputs reads the bytes of b's binary inputs, in input order,
// from the rest of the body: each checked against its shape, datatype and
// the limits before it is read. Bytes after the last are an error.
func readBinaryInputs(body io.Reader, b *inferBody, lim bodyLimits) error {
	var raw []byte
	for i := range b.inputs {
		t := &b.inputs[i]
		if t.binarySize < 0 {
			continue
		}
		n, err := elements(t.name, t.shape)
		if err != nil {
			return err
		}
		if cap := lim.elementCap(t.name); n > cap {
			return badInput("input %q has %d elements, over the limit of %d", t.name, n, cap)
		}
		if size := datatypeSize(t.datatype); size > 0 && int64(n*size) != t.binarySize {
			return badInput("input %q: binary_data_size %d for shape %v of %s (want %d)", t.name, t.binarySize, t.shape, t.datatype, n*size)
		}
		raw = resize(raw, int(t.binarySize))
		if _, err := io.ReadFull(body, raw); err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				return badInput("request body is over the limit of %d bytes", tooBig.Limit)
			}
			return badInput("input %q: the body ends before its %d bytes of binary data: %v", t.name, t.binarySize, err)
		}
		if err := t.decodeRaw(raw); err != nil {
			return err
		}
	}
	var one [1]byte
	if n, _ := io.ReadFull(body, one[:]); n > 0 {
		return badInput("request body has bytes after the last binary input")
	}
	return nil
}

func resize(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}
