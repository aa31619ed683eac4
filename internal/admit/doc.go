// Package admit bounds the work a server has in flight, so that past its
// capacity it refuses requests at once instead of queueing them until
// every caller's deadline has passed.
//
// A Gate holds a weighted semaphore (golang.org/x/sync/semaphore) and a
// short queue in front of it, bounded twice: a waiter gives up after the
// queue time, and a request is refused without waiting at all when as
// many are already waiting as the gate can serve within the queue time,
// judged from how long recent holders held their weight. So under
// sustained overload refusals are answered in microseconds, and the
// requests admitted wait at most the queue time.
//
// Why not a library's limiter: golang.org/x/time/rate bounds a rate, not
// work in flight, and adaptive limiters (Netflix's concurrency-limits has
// no kept Go port) learn a bound we can state.
//
// Refusing answers, without admitting anything, whether Acquire would
// refuse at once: the router's front asks before it reads a request, so
// that under overload a refusal costs neither the request's bytes nor its
// decoding.
//
// Used by server/ (the router's front: a gate for requests, one for their
// bytes) and shard/ (the same for lookups). A Gate owns no goroutines;
// Acquire blocks its caller at most the queue time. Tests: admit_test.go,
// deterministic (an hour's queue time where a test would otherwise hang).
package admit
