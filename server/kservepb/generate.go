// Package kservepb is the generated Go code of the KServe v2 gRPC
// protocol (grpc_predict_v2.proto). Regenerate with go generate; it needs
// protoc (Debian protobuf-compiler) and fetches pinned plugins.
package kservepb

//go:generate bash ../../scripts/gen-proto.sh
