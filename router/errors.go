package router

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The error codes that survive to clients. Every error Predict returns
// wraps exactly one (or context.Canceled, when the caller went away);
// front ends map them to gRPC codes and HTTP statuses and never look at
// message text.
var (
	// ErrInvalidArgument: the request is malformed; retrying will not help.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrNotFound: no such model (or pinned version) is served.
	ErrNotFound = errors.New("not found")
	// ErrUnavailable: the model is known but cannot be answered now
	// (partitions without a reachable replica, shards going away).
	// Retrying, here or on another router, may help.
	ErrUnavailable = errors.New("unavailable")
	// ErrDeadlineExceeded: the request's deadline passed before it was
	// answered (a shard call, or the wait for one).
	ErrDeadlineExceeded = errors.New("deadline exceeded")
	// ErrResourceExhausted: the router or a shard is at its bound of work
	// in flight and refused the request; retry after a pause.
	ErrResourceExhausted = errors.New("resource exhausted")
	// ErrInternal: a shard failed in a way that is nobody's input's fault
	// (it refused a request the router built, or failed internally).
	ErrInternal = errors.New("internal")
)

// shardError classifies a failed shard call, keeping the shard's own
// code where it means something to the caller: a missed deadline is
// DeadlineExceeded (never Unavailable), an overloaded shard
// ResourceExhausted, an internal failure Internal; a shard that could not
// be reached or does not hold what was asked is Unavailable. Its reason
// (what a client is told) names the partitions, never the shard.
func shardError(ctx context.Context, shardID string, parts []uint32, err error) error {
	if ctx.Err() != nil {
		ce := ContextError(ctx, "the shards")
		return WithReason(Reason(ce), fmt.Errorf("%w (shard %s)", ce, shardID))
	}
	kind := ErrUnavailable
	switch status.Code(err) {
	case codes.DeadlineExceeded:
		kind = ErrDeadlineExceeded
	case codes.ResourceExhausted:
		kind = ErrResourceExhausted
	case codes.InvalidArgument:
		// The router built this request: a shard refusing it is a bug or
		// version skew, not the caller's fault.
		kind = ErrInternal
	case codes.Internal, codes.Unknown, codes.DataLoss, codes.Unimplemented:
		kind = ErrInternal
	}
	return WithReason(partsReason(kind, parts), fmt.Errorf("router: %w: shard %s: %w", kind, shardID, err))
}

// partsReason is what a client is told of a shard call of kind that
// failed for parts.
func partsReason(kind error, parts []uint32) string {
	switch kind {
	case ErrDeadlineExceeded:
		return "deadline exceeded at the shards"
	case ErrResourceExhausted:
		return "shards overloaded; retry later"
	case ErrInternal:
		return "internal error at the shards"
	}
	switch len(parts) {
	case 0:
		return "shards unavailable"
	case 1:
		return fmt.Sprintf("partition %d unavailable", parts[0])
	}
	var shown []string
	for _, p := range parts[:min(len(parts), 4)] {
		shown = append(shown, strconv.Itoa(int(p)))
	}
	s := "partitions " + strings.Join(shown, ", ")
	if len(parts) > 4 {
		s += fmt.Sprintf(" and %d more", len(parts)-4)
	}
	return s + " unavailable"
}

// ContextError is the error of a request whose context ended while it
// waited for what: ErrDeadlineExceeded if its deadline passed, else
// context.Canceled (the caller went away).
func ContextError(ctx context.Context, what string) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("router: %w: deadline passed waiting for %s", ErrDeadlineExceeded, what)
	}
	return fmt.Errorf("router: request cancelled waiting for %s: %w", what, context.Canceled)
}

// A client is told the code of an error and its reason, never its
// detail: an error from a shard call names the shard, its address and
// the transport's message (a TLS refusal, a dial error), which the
// router logs under the request's id (see server), and its reason names
// only what failed (WithReason). Errors Cumulus composes of what it
// knows of the request (a model not served, a bound reached, a deadline
// passed waiting for the shards) are their own reason.

// reasoned is an error with the reason a client is told of it.
type reasoned struct {
	reason string
	err    error
}

func (e *reasoned) Error() string { return e.err.Error() }
func (e *reasoned) Unwrap() error { return e.err }

// WithReason is err, told to clients as reason.
func WithReason(reason string, err error) error { return &reasoned{reason: reason, err: err} }

// Reason is what a client is told of err: the reason it was given
// (WithReason; the outermost), else err itself.
func Reason(err error) string {
	var r *reasoned
	if errors.As(err, &r) {
		return r.reason
	}
	return err.Error()
}

// Detailed reports whether err holds more than its reason: a detail a
// client is not told, to log.
func Detailed(err error) bool {
	var r *reasoned
	return errors.As(err, &r)
}
