// Package pushpb is the generated Go code of the push API
// (push.proto). Regenerate with go generate; it needs protoc (Debian
// protobuf-compiler) and fetches pinned plugins.
package pushpb

//go:generate bash ../scripts/gen-proto.sh
