package bench

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/go-json-experiment/json/jsontext"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// RESTOptions configure a RESTClient.
type RESTOptions struct {
	// Addr is the router's HTTP address, host:port; required.
	Addr string
	// Binary sends the inputs and receives the scores as raw bytes after
	// a JSON header (KServe's binary tensor extension); default false:
	// all JSON.
	Binary bool
}

// Validate reports options a client cannot use.
func (o RESTOptions) Validate() error {
	if o.Addr == "" {
		return errors.New("bench: RESTOptions.Addr is required: give the router's HTTP address")
	}
	return nil
}

// RESTClient sends ModelInfer calls as KServe v2 REST infer requests,
// JSON or binary, so that a run can compare the protocols on the same
// requests. It takes requests with raw_input_contents (little-endian, as
// Generator builds them) and no parameters; it answers as gRPC would:
// the scores as raw_output_contents (binary) or fp32 contents (JSON), and
// errors as gRPC statuses (see restCode), a 429's Retry-After as a
// grpc-retry-pushback-ms trailer. The request's deadline travels as its
// timeout parameter. Safe for concurrent use.
type RESTClient struct {
	base   string // http://addr/v2/models/
	binary bool
	http   *http.Client
	// prepared holds the bodies of requests given to Prepare, by request.
	prepared sync.Map // *kservepb.ModelInferRequest → *restBody
}

// NewRESTClient makes a client of the router at o.Addr. It keeps every
// connection it opens for reuse, so a run opens at most as many as it
// has calls in flight; Close closes them.
func NewRESTClient(o RESTOptions) (*RESTClient, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	t := &http.Transport{
		MaxIdleConnsPerHost: math.MaxInt32, // MaxIdleConns 0: no bound either
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &RESTClient{base: "http://" + o.Addr + "/v2/models/", binary: o.Binary, http: &http.Client{Transport: t}}, nil
}

// Close closes the client's idle connections.
func (c *RESTClient) Close() { c.http.CloseIdleConnections() }

// restBody is a request encoded for REST, all but what varies by call:
// the opening brace of its JSON and the timeout parameter after it.
type restBody struct {
	url    string
	tail   []byte // the body after its opening '{'
	header int    // binary: the bytes of tail that end the JSON header
}

// Prepare encodes req once for every later call with it, which then
// costs no encoding; req must not change afterwards. It returns the
// body's size (without a timeout parameter). A request not prepared is
// encoded on each call.
func (c *RESTClient) Prepare(req *kservepb.ModelInferRequest) (int, error) {
	b, err := c.encode(req)
	if err != nil {
		return 0, err
	}
	c.prepared.Store(req, b)
	return 1 + len(b.tail), nil
}

// ModelInfer sends req and waits for the answer or the end of ctx. Of
// opts, it honours grpc.Trailer, for a refusal's pushback.
func (c *RESTClient) ModelInfer(ctx context.Context, req *kservepb.ModelInferRequest, opts ...grpc.CallOption) (*kservepb.ModelInferResponse, error) {
	b, err := c.body(req)
	if err != nil {
		return nil, err
	}
	head := make([]byte, 0, 48)
	head = append(head, '{')
	if d, ok := ctx.Deadline(); ok {
		left := time.Until(d)
		if left <= 0 {
			return nil, status.Error(codes.DeadlineExceeded, "bench: the deadline passed before the request was sent")
		}
		head = append(head, `"parameters":{"timeout":`...)
		head = strconv.AppendInt(head, max(1, left.Microseconds()), 10)
		head = append(head, "},"...)
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, b.url, nil)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "bench: %v", err)
	}
	hr.GetBody = func() (io.ReadCloser, error) {
		return io.NopCloser(io.MultiReader(bytes.NewReader(head), bytes.NewReader(b.tail))), nil
	}
	hr.Body, _ = hr.GetBody()
	hr.ContentLength = int64(len(head) + len(b.tail))
	if c.binary {
		hr.Header.Set(headerLength, strconv.Itoa(len(head)+b.header))
		hr.Header.Set("Content-Type", "application/octet-stream")
	} else {
		hr.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(hr)
	if err != nil {
		return nil, transportError(ctx, err)
	}
	body, err := readBody(resp)
	if err != nil {
		return nil, transportError(ctx, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, restError(resp, body, opts)
	}
	return decodeResponse(resp.Header.Get(headerLength), body, c.binary)
}

// body is req's prepared body, or req encoded now.
func (c *RESTClient) body(req *kservepb.ModelInferRequest) (*restBody, error) {
	if b, ok := c.prepared.Load(req); ok {
		return b.(*restBody), nil
	}
	return c.encode(req)
}

// headerLength is the binary tensor extension's header: the length of
// the JSON that starts a body, before the tensors' bytes.
const headerLength = "Inference-Header-Content-Length"

// encode writes req as a KServe v2 REST body, but for its opening brace.
func (c *RESTClient) encode(req *kservepb.ModelInferRequest) (*restBody, error) {
	switch {
	case len(req.Parameters) > 0:
		return nil, status.Error(codes.Unimplemented, "bench: the REST client does not send request parameters but the deadline's timeout")
	case len(req.RawInputContents) == 0 && len(req.Inputs) > 0:
		return nil, status.Error(codes.Unimplemented, "bench: the REST client sends raw_input_contents only")
	case len(req.RawInputContents) != len(req.Inputs):
		return nil, status.Errorf(codes.InvalidArgument, "bench: %d raw_input_contents for %d inputs", len(req.RawInputContents), len(req.Inputs))
	}
	u := c.base + url.PathEscape(req.ModelName)
	if req.ModelVersion != "" {
		u += "/versions/" + url.PathEscape(req.ModelVersion)
	}
	b := &restBody{url: u + "/infer"}
	size := 64
	for _, raw := range req.RawInputContents {
		size += 64 + len(raw)
		if !c.binary {
			size += 2 * len(raw) // up to 20 digits and a comma for 8 bytes
		}
	}
	t := make([]byte, 0, size)
	var err error
	t = append(t, `"inputs":[`...)
	for i, in := range req.Inputs {
		if i > 0 {
			t = append(t, ',')
		}
		if t, err = appendInput(t, in, req.RawInputContents[i], c.binary); err != nil {
			return nil, err
		}
	}
	t = append(t, ']')
	if req.Id != "" {
		t = append(t, `,"id":`...)
		if t, err = quote(t, req.Id); err != nil {
			return nil, err
		}
	}
	var outputs []string
	for _, o := range req.Outputs {
		outputs = append(outputs, o.Name)
	}
	if c.binary && len(outputs) == 0 {
		outputs = []string{"scores"}
	}
	if len(outputs) > 0 {
		t = append(t, `,"outputs":[`...)
		for i, name := range outputs {
			if i > 0 {
				t = append(t, ',')
			}
			t = append(t, `{"name":`...)
			if t, err = quote(t, name); err != nil {
				return nil, err
			}
			if c.binary {
				t = append(t, `,"parameters":{"binary_data":true}`...)
			}
			t = append(t, '}')
		}
		t = append(t, ']')
	}
	t = append(t, '}')
	if c.binary {
		b.header = len(t)
		for _, raw := range req.RawInputContents {
			t = append(t, raw...)
		}
	}
	b.tail = t
	return b, nil
}

// appendInput writes one input tensor: its data as JSON numbers, or, in
// binary, the size of the raw bytes that follow the header.
func appendInput(t []byte, in *kservepb.ModelInferRequest_InferInputTensor, raw []byte, bin bool) ([]byte, error) {
	var err error
	t = append(t, `{"name":`...)
	if t, err = quote(t, in.Name); err != nil {
		return nil, err
	}
	t = append(t, `,"datatype":`...)
	if t, err = quote(t, in.Datatype); err != nil {
		return nil, err
	}
	t = append(t, `,"shape":[`...)
	for j, d := range in.Shape {
		if j > 0 {
			t = append(t, ',')
		}
		t = strconv.AppendInt(t, d, 10)
	}
	t = append(t, ']')
	if bin {
		t = append(t, `,"parameters":{"binary_data_size":`...)
		t = strconv.AppendInt(t, int64(len(raw)), 10)
		return append(t, `}}`...), nil
	}
	t = append(t, `,"data":[`...)
	if t, err = appendData(t, in.Name, in.Datatype, raw); err != nil {
		return nil, err
	}
	return append(t, `]}`...), nil
}

// appendData writes little-endian raw contents as JSON numbers, flat.
func appendData(t []byte, name, datatype string, raw []byte) ([]byte, error) {
	var size int
	switch datatype {
	case "INT64", "UINT64":
		size = 8
	case "INT32", "FP32":
		size = 4
	default:
		return nil, status.Errorf(codes.InvalidArgument, "bench: input %q: the REST client writes INT64, UINT64, INT32 or FP32 as JSON, not %q", name, datatype)
	}
	if len(raw)%size != 0 {
		return nil, status.Errorf(codes.InvalidArgument, "bench: input %q: %d raw bytes are not whole %s elements", name, len(raw), datatype)
	}
	for i := 0; i < len(raw); i += size {
		if i > 0 {
			t = append(t, ',')
		}
		switch datatype {
		case "INT64":
			t = strconv.AppendInt(t, int64(binary.LittleEndian.Uint64(raw[i:])), 10)
		case "UINT64":
			t = strconv.AppendUint(t, binary.LittleEndian.Uint64(raw[i:]), 10)
		case "INT32":
			t = strconv.AppendInt(t, int64(int32(binary.LittleEndian.Uint32(raw[i:]))), 10)
		case "FP32":
			f := math.Float32frombits(binary.LittleEndian.Uint32(raw[i:]))
			if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
				return nil, status.Errorf(codes.InvalidArgument, "bench: input %q: element %d is %v, which JSON cannot carry", name, i/size, f)
			}
			t = strconv.AppendFloat(t, float64(f), 'g', -1, 32)
		}
	}
	return t, nil
}

func quote(t []byte, s string) ([]byte, error) {
	t, err := jsontext.AppendQuote(t, s)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "bench: %q is not valid UTF-8", s)
	}
	return t, nil
}

// maxResponseBytes bounds a response body read.
const maxResponseBytes = 64 << 20

// readBody reads a response's body to its end, so that its connection
// is kept, and closes it.
func readBody(resp *http.Response) ([]byte, error) {
	defer resp.Body.Close()
	if n := resp.ContentLength; n >= 0 && n <= maxResponseBytes {
		b := make([]byte, n)
		if _, err := io.ReadFull(resp.Body, b); err != nil {
			return nil, err
		}
		_, err := io.Copy(io.Discard, resp.Body)
		return b, err
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err == nil && len(b) > maxResponseBytes {
		err = fmt.Errorf("response body over %d bytes", maxResponseBytes)
	}
	return b, err
}

// transportError is the status of a call that got no answer: ctx's end,
// or, as gRPC answers when it cannot reach a server, Unavailable.
func transportError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return status.Error(status.FromContextError(ctx.Err()).Code(), "bench: "+err.Error())
	}
	return status.Error(codes.Unavailable, "bench: "+err.Error())
}

// restCode is the gRPC code of an HTTP status, as the server maps its
// errors to both.
func restCode(httpStatus int) codes.Code {
	switch httpStatus {
	case http.StatusOK:
		return codes.OK
	case http.StatusBadRequest:
		return codes.InvalidArgument
	case http.StatusNotFound:
		return codes.NotFound
	case http.StatusTooManyRequests:
		return codes.ResourceExhausted
	case http.StatusServiceUnavailable:
		return codes.Unavailable
	case http.StatusGatewayTimeout:
		return codes.DeadlineExceeded
	case http.StatusInternalServerError:
		return codes.Internal
	}
	return codes.Unknown
}

// restError is the status of an answer other than 200: KServe's
// {"error": "..."} body as its message. A 429's Retry-After goes to the
// caller's grpc.Trailer as grpc-retry-pushback-ms, as the gRPC front
// sends its pushback.
func restError(resp *http.Response, body []byte, opts []grpc.CallOption) error {
	code := restCode(resp.StatusCode)
	if code == codes.ResourceExhausted {
		if ms, ok := retryAfterMS(resp.Header.Get("Retry-After")); ok {
			for _, o := range opts {
				if t, ok := o.(grpc.TrailerCallOption); ok {
					*t.TrailerAddr = metadata.Pairs("grpc-retry-pushback-ms", strconv.FormatInt(ms, 10))
				}
			}
		}
	}
	var e struct {
		Error string `json:"error"`
	}
	msg := string(body)
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		msg = e.Error
	}
	if len(msg) > 1024 {
		msg = msg[:1024] + "…"
	}
	return status.Errorf(code, "bench: HTTP %d: %s", resp.StatusCode, msg)
}

// retryAfterMS reads a Retry-After header, seconds or a date, as
// milliseconds from now.
func retryAfterMS(v string) (int64, bool) {
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil && s >= 0 && s < math.MaxInt64/1000 {
		return s * 1000, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, time.Until(t).Milliseconds()), true
	}
	return 0, false
}

// restResponse is a KServe v2 infer response, or, in binary, its JSON
// header.
type restResponse struct {
	ModelName    string `json:"model_name"`
	ModelVersion string `json:"model_version"`
	ID           string `json:"id"`
	Outputs      []struct {
		Name       string    `json:"name"`
		Datatype   string    `json:"datatype"`
		Shape      []int64   `json:"shape"`
		Data       []float32 `json:"data"`
		Parameters struct {
			BinaryDataSize *int64 `json:"binary_data_size"`
		} `json:"parameters"`
	} `json:"outputs"`
}

// decodeResponse turns a 200 answer into what gRPC would have answered:
// binary outputs as raw_output_contents, JSON data as fp32 contents. hdr
// is the answer's Inference-Header-Content-Length; a binary answer
// without it is all JSON.
func decodeResponse(hdr string, body []byte, bin bool) (*kservepb.ModelInferResponse, error) {
	bad := func(format string, args ...any) error {
		return status.Errorf(codes.Internal, "bench: REST response: "+format, args...)
	}
	head, rest := body, []byte(nil)
	if bin && hdr != "" {
		n, err := strconv.Atoi(hdr)
		if err != nil || n < 0 || n > len(body) {
			return nil, bad("%s %q for a body of %d bytes", headerLength, hdr, len(body))
		}
		head, rest = body[:n], body[n:]
	}
	var r restResponse
	if err := json.Unmarshal(head, &r); err != nil {
		return nil, bad("%v", err)
	}
	resp := &kservepb.ModelInferResponse{ModelName: r.ModelName, ModelVersion: r.ModelVersion, Id: r.ID}
	for _, o := range r.Outputs {
		out := &kservepb.ModelInferResponse_InferOutputTensor{Name: o.Name, Datatype: o.Datatype, Shape: o.Shape}
		resp.Outputs = append(resp.Outputs, out)
		if n := o.Parameters.BinaryDataSize; n != nil {
			if *n < 0 || *n > int64(len(rest)) {
				return nil, bad("output %q: binary_data_size %d with %d bytes left", o.Name, *n, len(rest))
			}
			resp.RawOutputContents = append(resp.RawOutputContents, rest[:*n:*n])
			rest = rest[*n:]
			continue
		}
		out.Contents = &kservepb.InferTensorContents{Fp32Contents: o.Data}
	}
	switch {
	case len(rest) > 0:
		return nil, bad("%d bytes after the last binary output", len(rest))
	case len(resp.RawOutputContents) > 0 && len(resp.RawOutputContents) != len(resp.Outputs):
		return nil, bad("some outputs binary, some JSON")
	}
	return resp, nil
}
