// Package bench holds Cumulus's workloads and load generator.
//
// Workloads (rank200, small) draw feature ids Zipf-distributed over the
// ranks of a model made by `cumulus model gen`, whose manifest records how
// ranks map to ids (codec.GenInfo). Run drives closed-loop load at a
// KServe endpoint with raw tensor contents: Concurrency callers, one
// request in flight each, for a bounded Duration or request count, and
// reports QPS, p50/p99/p999 latency and request size.
//
// OpenLoop offers load at a fixed rate instead, evenly spaced, whether or
// not earlier requests were answered, each under its own deadline from
// when it was due; latency counts from then as well, so a server (or a
// client) that falls behind shows in it. It owns one goroutine per
// request in flight, bounded; a request due at the bound is counted as
// client-dropped, never skipped. Every offered request ends as exactly
// one of OK, refused (ResourceExhausted, whose own latency is reported
// apart), an error by gRPC code, or client-dropped. Both loops can resend
// requests answered Unavailable (send.go), counting the resends.
// Requests are built before the clock starts (requests.go) and shared
// read-only by the callers.
//
// The loops send through an Inferer (inferer.go): KServe's gRPC client,
// or RESTClient (rest.go), which carries the same ModelInfer over KServe
// v2 REST, as JSON or with the binary tensor extension, and answers as
// gRPC would (scores, gRPC status codes, pushback), so the protocols are
// compared on the same requests. It encodes a run's requests once,
// before the clock starts, as the gRPC side builds its protos then; per
// call it writes only the deadline's timeout parameter. Its connections
// are kept for reuse, one per call in flight.
//
// WatchRSS reads a process's VmRSS from /proc around a run: before, the
// peak during, and after a settling time.
//
// Hostile inputs (hostile.go) are requests built once to cost a server
// as much as it lets them: a deeply nested JSON body, a JSON body just
// under the size limit that is wrong only in its last element, a gRPC
// message far over the receive limit. MeasureHostile sends one
// repeatedly and reads the server's CPU time (ReadCPUTicks) and VmRSS
// from /proc around the sends; Beside runs a closed-loop load while one
// goroutine, which it owns and waits for, sends them back to back.
//
// Slow senders (slow.go) hold requests in a server's reception: RunSlow
// keeps Streams requests open, each announcing a length and sending one
// byte every Every, raw HTTP/2 streams for gRPC (x/net's framer and
// hpack, since grpc-go's client cannot send part of a message) or
// HTTP/1.1 requests with a Content-Length, and opens one again whenever
// one is answered. It owns a goroutine per HTTP connection and two per
// HTTP/2 connection, and the function it returns waits for them once its
// context ends.
//
// Benchmarks are measurements, never tests: nothing in the test suite
// depends on timing. Peer baselines (Go map, Redis) join here with the
// storage-engine work.
package bench
