package server

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/cumulus-serving/cumulus/internal/admit"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// kserveGRPC implements the KServe v2 gRPC service on a Predictor.
type kserveGRPC struct {
	kservepb.UnimplementedGRPCInferenceServiceServer
	s *Server
}

func (k *kserveGRPC) ServerLive(context.Context, *kservepb.ServerLiveRequest) (*kservepb.ServerLiveResponse, error) {
	return &kservepb.ServerLiveResponse{Live: true}, nil
}

func (k *kserveGRPC) ServerReady(context.Context, *kservepb.ServerReadyRequest) (*kservepb.ServerReadyResponse, error) {
	return &kservepb.ServerReadyResponse{Ready: k.s.ready()}, nil
}

func (k *kserveGRPC) ModelReady(_ context.Context, r *kservepb.ModelReadyRequest) (*kservepb.ModelReadyResponse, error) {
	ready, err := k.s.modelReady(r.Name, r.Version)
	if err != nil {
		return nil, grpcError(err)
	}
	return &kservepb.ModelReadyResponse{Ready: ready}, nil
}

func (k *kserveGRPC) ServerMetadata(context.Context, *kservepb.ServerMetadataRequest) (*kservepb.ServerMetadataResponse, error) {
	return &kservepb.ServerMetadataResponse{Name: "cumulus", Version: Version, Extensions: extensions}, nil
}

func (k *kserveGRPC) ModelMetadata(_ context.Context, r *kservepb.ModelMetadataRequest) (*kservepb.ModelMetadataResponse, error) {
	md, err := k.s.metadata(r.Name, r.Version)
	if err != nil {
		return nil, grpcError(err)
	}
	resp := &kservepb.ModelMetadataResponse{Name: md.Name, Versions: md.Versions, Platform: md.Platform}
	for _, t := range md.Inputs {
		resp.Inputs = append(resp.Inputs, &kservepb.ModelMetadataResponse_TensorMetadata{Name: t.Name, Datatype: t.Datatype, Shape: t.Shape})
	}
	for _, t := range md.Outputs {
		resp.Outputs = append(resp.Outputs, &kservepb.ModelMetadataResponse_TensorMetadata{Name: t.Name, Datatype: t.Datatype, Shape: t.Shape})
	}
	return resp, nil
}

// inferenceService is KServe's service with ModelInfer received before
// it is admitted: grpc-go reads a unary request only when the handler
// asks (dec), so the handler decides what a request holds while its
// message arrives. Under overload (every slot taken, the queue full) a
// request is refused before its message is read, costing neither its
// bytes nor its decoding; otherwise the message is received, as bytes,
// holding only its share of reception (reception.go) and only for its
// receive time, then it waits for a request slot, and only then is it
// decoded (requestCodec.decode). The request's time (RequestTimeout)
// counts from arrival and covers all of it.
func (s *Server) inferenceService() *grpc.ServiceDesc {
	desc := kservepb.GRPCInferenceService_ServiceDesc
	desc.Methods = slices.Clone(desc.Methods)
	for i, m := range desc.Methods {
		if m.MethodName == "ModelInfer" {
			desc.Methods[i].Handler = s.admitModelInfer
		}
	}
	return &desc
}

type arrivalKey struct{}

func (s *Server) admitModelInfer(srv any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
	t0 := time.Now()
	deadline := t0.Add(s.opts.RequestTimeout)
	stream := ctx // ends when the client gives up (holdCut)
	ctx, cancel := context.WithDeadline(context.WithValue(ctx, arrivalKey{}, t0), deadline)
	defer cancel()
	var req *kservepb.ModelInferRequest
	var err error
	if s.adm.slots.Refusing(1, s.recv.admitting()) {
		err = s.refusal(ctx, "grpc", "requests", admit.ErrOverloaded, t0)
	} else {
		var msg receivedGRPC
		if msg, err = s.receiveGRPC(ctx, dec, t0, deadline); errors.Is(err, errReceiveTooSlow) {
			s.holdCut(stream, t0, msg.ended)
		} else if err == nil {
			var slot admit.Ticket
			if slot, err = s.adm.slots.Acquire(ctx, 1); err != nil {
				err = s.refusal(ctx, "grpc", "requests", err, t0)
			} else {
				req, err = s.codec.decode(msg.m)
			}
			msg.release() // decoded, or refused: its bytes go back now
			defer slot.Release()
		}
	}
	if err != nil {
		s.observe("grpc", err)
		if _, ok := status.FromError(err); ok && errors.Unwrap(err) == nil {
			return nil, err // gRPC's own, as it is
		}
		return nil, s.grpcFailure(ctx, "", requestID(""), err)
	}
	serve := func(ctx context.Context, r any) (any, error) {
		return srv.(kservepb.GRPCInferenceServiceServer).ModelInfer(ctx, r.(*kservepb.ModelInferRequest))
	}
	if ic == nil {
		return serve(ctx, req)
	}
	return ic(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: kservepb.GRPCInferenceService_ModelInfer_FullMethodName}, serve)
}

// receiveGRPC receives the request's message within its receive time,
// counted in reception from the client's address: at receiveOverhead,
// beside its bytes as they arrive (counted by the connection's h2watch),
// and at its size once it has. The reception share is given back with
// the message (receivedGRPC.release).
func (s *Server) receiveGRPC(ctx context.Context, dec func(any) error, t0, deadline time.Time) (receivedGRPC, error) {
	var addr string
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	x, err := s.recv.begin(addr, receiveOverhead)
	var refused errReceiving
	if errors.As(err, &refused) {
		return receivedGRPC{}, s.receiveRefusal("grpc", refused, t0)
	}
	rd := s.receiveDeadline(t0, -1, deadline)
	rctx, cancel := context.WithDeadline(ctx, rd)
	defer cancel()
	m, ended, err := receive(rctx, dec)
	x.arrived()
	if err == nil {
		if size := int64(m.size()); size > 0 {
			if err = x.take(size); errors.As(err, &refused) {
				m.free()
				err = s.receiveRefusal("grpc", refused, t0)
			}
		}
	} else if ctx.Err() == nil && rctx.Err() != nil {
		err = errReceiveTimeout("the request message", -1, rd.Sub(t0))
	}
	if err != nil {
		x.done()
		return receivedGRPC{ended: ended}, err
	}
	return receivedGRPC{m: m, x: x}, nil
}

// receivedGRPC is a message received whole and its share of reception;
// or, for one cut off, when its read ends (receive).
type receivedGRPC struct {
	m     *receivedMessage
	x     *receiving
	ended <-chan struct{}
}

// release frees the message, if it was not decoded, and gives back its
// share of reception.
func (r receivedGRPC) release() {
	if r.m != nil {
		r.m.free()
	}
	r.x.done()
}

// receive reads the request's message, as bytes (requestCodec), giving
// up when ctx ends (returning from the handler then ends the stream, and
// with it the read). gRPC's own refusals (a message over the receive
// limit, one that is not protobuf) keep their status. A read given up
// on goes on until the stream ends or its message arrives whole (grpc-go
// has opened the stream's window for all of it), and then frees what it
// read; ended is closed then.
func receive(ctx context.Context, dec func(any) error) (*receivedMessage, <-chan struct{}, error) {
	m := &receivedMessage{}
	done, left, end := make(chan error), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(end)
		err := dec(m)
		select {
		case done <- err:
		case <-left:
			if err == nil {
				m.free()
			}
		}
	}()
	select {
	case err := <-done:
		return m, end, err
	case <-ctx.Done():
		close(left)
		return nil, end, router.ContextError(ctx, "the request message")
	}
}

// arrival is when the request in ctx arrived (admitModelInfer).
func arrival(ctx context.Context) time.Time {
	t, _ := ctx.Value(arrivalKey{}).(time.Time)
	return t
}

func (k *kserveGRPC) ModelInfer(ctx context.Context, r *kservepb.ModelInferRequest) (*kservepb.ModelInferResponse, error) {
	resp, err := k.infer(ctx, r)
	k.s.observe("grpc", err)
	if err != nil {
		return nil, k.s.grpcFailure(ctx, r.ModelName, requestID(r.Id), err)
	}
	return resp, nil
}

func (k *kserveGRPC) infer(ctx context.Context, r *kservepb.ModelInferRequest) (*kservepb.ModelInferResponse, error) {
	if err := k.s.knownModel(r.ModelName); err != nil {
		return nil, err
	}
	inputs, err := grpcInputs(r)
	if err != nil {
		return nil, err
	}
	req, err := buildRequest(r.ModelName, r.ModelVersion, inputs)
	if err != nil {
		return nil, err
	}
	req.CanaryKey = r.Id
	if p := r.Parameters["canary_key"]; p != nil {
		k, ok := p.ParameterChoice.(*kservepb.InferParameter_StringParam)
		if !ok {
			return nil, badInput("parameters.canary_key must be a string_param")
		}
		req.CanaryKey = cmp.Or(k.StringParam, r.Id)
	}
	// The slot was taken before decoding; the weight is known now.
	t0 := time.Now()
	b, err := k.s.adm.bytes.Acquire(ctx, requestBytes(req))
	if err != nil {
		return nil, k.s.refusal(ctx, "grpc", "bytes", err, t0)
	}
	defer b.Release()
	if p := r.Parameters["timeout"]; p != nil {
		us, ok := p.ParameterChoice.(*kservepb.InferParameter_Int64Param)
		if !ok || us.Int64Param < 0 || us.Int64Param > math.MaxInt64/1000 {
			return nil, badInput("parameters.timeout must be an int64_param of microseconds, 0 for none")
		}
		if us.Int64Param > 0 { // counted from arrival, like the server's own bound
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, arrival(ctx).Add(time.Duration(us.Int64Param)*time.Microsecond))
			defer cancel()
		}
	}
	res, err := k.s.opts.Predictor.Predict(ctx, req)
	if err != nil {
		return nil, err
	}
	out := &kservepb.ModelInferResponse_InferOutputTensor{Name: outScores, Datatype: "FP32", Shape: []int64{int64(len(res.Scores))}}
	resp := &kservepb.ModelInferResponse{ModelName: res.Model, ModelVersion: strconv.FormatUint(res.Version, 10), Id: r.Id,
		Outputs: []*kservepb.ModelInferResponse_InferOutputTensor{out}}
	if len(r.RawInputContents) > 0 {
		b := make([]byte, 4*len(res.Scores))
		for i, s := range res.Scores {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(s))
		}
		resp.RawOutputContents = [][]byte{b}
	} else {
		out.Contents = &kservepb.InferTensorContents{Fp32Contents: res.Scores}
	}
	return resp, nil
}

// grpcInputs decodes a request's input tensors, from typed contents or
// from raw_input_contents, and checks its outputs.
func grpcInputs(r *kservepb.ModelInferRequest) ([]tensor, error) {
	raw := len(r.RawInputContents) > 0
	if raw && len(r.RawInputContents) != len(r.Inputs) {
		return nil, badInput("%d raw_input_contents for %d inputs", len(r.RawInputContents), len(r.Inputs))
	}
	inputs := make([]tensor, len(r.Inputs))
	for i, in := range r.Inputs {
		t := tensor{name: in.Name, datatype: in.Datatype, shape: in.Shape}
		if raw {
			if in.Contents != nil {
				return nil, badInput("input %q has both contents and raw_input_contents", in.Name)
			}
			if err := t.decodeRaw(r.RawInputContents[i]); err != nil {
				return nil, err
			}
		} else if err := typedContents(&t, in.Contents); err != nil {
			return nil, err
		}
		inputs[i] = t
	}
	for _, o := range r.Outputs {
		if o.Name != outScores {
			return nil, badInput("unknown output %q (the output is %q)", short(o.Name), outScores)
		}
	}
	return inputs, nil
}

func typedContents(t *tensor, c *kservepb.InferTensorContents) error {
	if c == nil {
		c = &kservepb.InferTensorContents{}
	}
	switch t.datatype {
	case "INT64":
		t.isInt, t.ints = true, make([]uint64, len(c.Int64Contents))
		for i, x := range c.Int64Contents {
			t.ints[i] = uint64(x)
		}
	case "UINT64":
		t.isInt, t.ints = true, c.Uint64Contents
	case "INT32":
		t.isInt, t.ints = true, make([]uint64, len(c.IntContents))
		for i, x := range c.IntContents {
			t.ints[i] = uint64(int64(x))
		}
	case "FP32":
		t.floats = c.Fp32Contents
	default:
		return t.unsupported()
	}
	return nil
}

// grpcFailure is the status an infer call fails with: its reason and
// request id (requestid.go), the id also in the x-request-id trailer; a
// refusal as overload (the front's or a shard's) also gets the retry
// pushback trailer.
func (s *Server) grpcFailure(ctx context.Context, model, id string, err error) error {
	st := grpcStatus(err, fmt.Sprintf("%s (request id %s)", s.told(ctx, "grpc", model, id, err), id))
	trailer := metadata.Pairs(strings.ToLower(headerRequestID), id)
	if st.Code() == codes.ResourceExhausted {
		trailer.Set("grpc-retry-pushback-ms", strconv.Itoa(retryPushbackMS))
	}
	grpc.SetTrailer(ctx, trailer)
	return st.Err()
}

// requestBytes is what a decoded request holds in memory.
func requestBytes(r *router.Request) int64 {
	return int64(8*(len(r.IDs)+len(r.SharedIDs)+len(r.RowSplits)) + 4*(len(r.Values)+len(r.SharedValues)))
}

// grpcError maps router error codes to gRPC codes, with the error's
// reason.
func grpcError(err error) error { return grpcStatus(err, router.Reason(err)).Err() }

// grpcStatus is err's status, with message. A refusal as overload
// carries google.rpc.RetryInfo.
func grpcStatus(err error, message string) *status.Status {
	st := status.New(classify(err).grpc, message)
	if st.Code() == codes.ResourceExhausted {
		if withRetry, derr := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retryPushbackMS * time.Millisecond)}); derr == nil {
			st = withRetry
		}
	}
	return st
}
