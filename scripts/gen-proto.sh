#!/usr/bin/env bash
# Regenerates server/kservepb and pushpb from their .proto files with
# pinned plugin versions. Needs protoc (Debian: protobuf-compiler).
# Run: go generate ./server/kservepb (or ./pushpb): either does both.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(mktemp -d); trap 'rm -rf "$bin"' EXIT
GOBIN=$bin GOFLAGS= go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
GOBIN=$bin GOFLAGS= go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
gen() {
  (cd "$1" && PATH="$bin:$PATH" protoc --go_out=. --go_opt=paths=source_relative \
    --go-grpc_out=. --go-grpc_opt=paths=source_relative "$2")
}
gen server/kservepb grpc_predict_v2.proto
gen pushpb push.proto
