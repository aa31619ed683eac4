// Package server is the network front of a router: the KServe v2 Open
// Inference Protocol over gRPC (with server reflection and gRPC health)
// and over HTTP/JSON, plus /metrics. It holds no business logic: inputs
// become a router.Request (tensors.go), errors map from router codes to
// gRPC codes and HTTP statuses.
//
// Tensor contract: ids INT64|UINT64 [nnz], optional values FP32 [nnz],
// row_splits INT64 [batch+1], optional shared_ids / shared_values applied
// to every row; output scores FP32 [batch]. Typed contents and
// raw_input_contents are both accepted; raw requests get raw responses.
//
// Readiness (/v2/health/ready, gRPC health, ServerReady) is the router's,
// and false while the front drains (Drain): it then stops accepting, tells
// gRPC clients to go elsewhere (GOAWAY) and lets requests under way finish.
//
// kservepb is generated from grpc_predict_v2.proto: go generate ./server/kservepb.
package server
