package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

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
	code := http.StatusServiceUnavailable
	switch {
	case errors.Is(err, router.ErrInvalidArgument):
		code = http.StatusBadRequest
	case errors.Is(err, router.ErrNotFound):
		code = http.StatusNotFound
	}
	writeJSON(w, code, map[string]string{"error": err.Error()})
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

// jsonInput is one input tensor of a KServe JSON request. data may be
// flat or nested in row-major order.
type jsonInput struct {
	Name     string          `json:"name"`
	Shape    []int64         `json:"shape"`
	Datatype string          `json:"datatype"`
	Data     json.RawMessage `json:"data"`
}

type jsonRequest struct {
	ID      string      `json:"id,omitempty"`
	Inputs  []jsonInput `json:"inputs"`
	Outputs []struct {
		Name string `json:"name"`
	} `json:"outputs,omitempty"`
}

type jsonOutput struct {
	Name     string    `json:"name"`
	Shape    []int64   `json:"shape"`
	Datatype string    `json:"datatype"`
	Data     []float32 `json:"data"`
}

type jsonResponse struct {
	ModelName    string       `json:"model_name"`
	ModelVersion string       `json:"model_version"`
	ID           string       `json:"id,omitempty"`
	Outputs      []jsonOutput `json:"outputs"`
}

func (s *Server) httpInfer(w http.ResponseWriter, r *http.Request) {
	t0 := time.Now()
	resp, err := s.inferJSON(r)
	s.latencies.WithLabelValues("http").Observe(time.Since(t0).Seconds())
	s.observe("http", err)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) inferJSON(r *http.Request) (*jsonResponse, error) {
	if err := s.knownModel(r.PathValue("name")); err != nil {
		return nil, err
	}
	var body jsonRequest
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, int64(s.opts.MaxRequestBytes)))
	if err := dec.Decode(&body); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, badInput("request body is over the limit of %d bytes", s.opts.MaxRequestBytes)
		}
		return nil, badInput("request body is not valid JSON: %v", err)
	}
	for _, o := range body.Outputs {
		if o.Name != outScores {
			return nil, badInput("unknown output %q (the output is %q)", o.Name, outScores)
		}
	}
	inputs := make([]tensor, len(body.Inputs))
	for i, in := range body.Inputs {
		t := tensor{name: in.Name, datatype: in.Datatype, shape: in.Shape}
		if err := jsonData(&t, in.Data); err != nil {
			return nil, err
		}
		inputs[i] = t
	}
	req, err := buildRequest(r.PathValue("name"), r.PathValue("version"), inputs)
	if err != nil {
		return nil, err
	}
	res, err := s.opts.Predictor.Predict(r.Context(), req)
	if err != nil {
		return nil, err
	}
	return &jsonResponse{ModelName: res.Model, ModelVersion: strconv.FormatUint(res.Version, 10), ID: body.ID,
		Outputs: []jsonOutput{{Name: outScores, Shape: []int64{int64(len(res.Scores))}, Datatype: "FP32", Data: res.Scores}}}, nil
}

// jsonData decodes a tensor's data, flat or nested.
func jsonData(t *tensor, raw json.RawMessage) error {
	if len(raw) == 0 {
		return badInput("input %q has no data", t.name)
	}
	var err error
	switch t.datatype {
	case "INT64", "INT32":
		var v []int64
		if err = unmarshalFlat(raw, &v); err == nil {
			t.isInt, t.ints = true, make([]uint64, len(v))
			for i, x := range v {
				t.ints[i] = uint64(x)
			}
		}
	case "UINT64":
		t.isInt = true
		err = unmarshalFlat(raw, &t.ints)
	case "FP32":
		err = unmarshalFlat(raw, &t.floats)
	default:
		return badInput("input %q: datatype %q is not supported (use INT64, UINT64, INT32 or FP32)", t.name, t.datatype)
	}
	if err != nil {
		return badInput("input %q: data is not a %s array: %v", t.name, t.datatype, err)
	}
	return nil
}

// unmarshalFlat decodes a JSON array of numbers, flattening nested arrays
// (the protocol allows row-major nesting).
func unmarshalFlat[T int64 | uint64 | float32](raw json.RawMessage, out *[]T) error {
	if err := json.Unmarshal(raw, out); err == nil {
		return nil
	}
	var nested []json.RawMessage
	if err := json.Unmarshal(raw, &nested); err != nil {
		return err
	}
	*out = (*out)[:0]
	for _, n := range nested {
		var part []T
		if err := unmarshalFlat(n, &part); err != nil {
			var one T
			if err := json.Unmarshal(n, &one); err != nil {
				return fmt.Errorf("element %s: %w", n, err)
			}
			part = []T{one}
		}
		*out = append(*out, part...)
	}
	return nil
}
