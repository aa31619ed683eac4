// Package codec holds Cumulus's byte formats: the compact lookup frames
// routers and shards exchange, the partition file and the version
// manifest. Everything here is a pure function of its input.
//
// Lookup frames (lookup.go) travel over gRPC under the "cumulus"
// content-subtype (grpc.go) without protobuf: keys grouped by partition,
// each section choosing fixed 8-byte or zigzag-delta varint keys,
// whichever is smaller; responses carry a presence bitmap and only the
// values of present keys. Decoders return views into their input and
// reuse their own buffers, so steady-state decoding allocates nothing
// (TestLookupDecodeAllocs).
//
// Partition files (partfile.go) are structure-of-arrays with a CRC-32C
// per 1 MiB block and a trailer; the manifest (manifest.go) records each
// file's size and SHA-256. docs/model-format.md is the full description.
//
// Every decoder wraps ErrCorrupt on bad input and is fuzzed
// (go test -fuzz=Fuzz... ./codec); testdata/fuzz keeps the seed corpus.
package codec
