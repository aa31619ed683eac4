// Package server is the network front of a router: the KServe v2 Open
// Inference Protocol over gRPC (with server reflection and gRPC health)
// and over HTTP (JSON, and the binary tensor extension), plus /metrics.
// It holds no business logic: inputs become a router.Request
// (tensors.go), errors map from router codes to gRPC codes and HTTP
// statuses (classify).
//
// Tensor contract: ids INT64|UINT64 [nnz], optional values FP32 [nnz],
// row_splits INT64|INT32 [batch+1], optional shared_ids / shared_values
// applied to every row; output scores FP32 [batch]. Typed contents and
// raw_input_contents are both accepted; raw requests get raw responses.
//
// What a request may cost is decided before it is paid for. A request is
// received before it is admitted: while its bytes arrive it holds only
// its share of reception (reception.go: bytes in all and per client
// address, and a receive time), an HTTP body in pooled chunks filled as
// its bytes come (body.go), so slow senders hold no request slot and an
// announced length buys no memory. Then admission (admission.go,
// internal/admit): a slot, and once decoded the request's bytes; when
// admission would refuse at once, a request is refused before it is
// read at all (grpc.go admitModelInfer, http.go inferHTTP). A gRPC
// message's elements are counted before it is decoded (grpccodec.go); a
// JSON body is decoded token by token with every limit checked per
// element (jsonbody.go). Each request's time counts from its arrival.
// Memory: a body's chunks go back to their pool once it is decoded; a
// request's decoded tensors are its own; the router owns the Request
// while Predict runs. The front owns one goroutine per gRPC request while
// its message is read (receive), which ends with the stream.
//
// Tests: server_test.go and front_test.go run real sockets against a dev
// cluster or a predictor that holds requests on purpose (gate);
// slow_test.go holds slow senders (bench.RunSlow) open beside a good
// client; the fuzz
// targets (fuzz_test.go, corpora in testdata/fuzz) check decoders against
// decoders written another way.
//
// Readiness (/v2/health/ready, gRPC health, ServerReady) is the router's,
// and false while the front drains (Drain): it then stops accepting, tells
// gRPC clients to go elsewhere (GOAWAY) and lets requests under way finish.
//
// kservepb is generated from grpc_predict_v2.proto: go generate ./server/kservepb.
package server
