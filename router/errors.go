package router

import (
	"context"
	"errors"
	"fmt"

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
// be reached or does not hold what was asked is Unavailable.
func shardError(ctx context.Context, shardID string, err error) error {
	if ctx.Err() != nil {
		return ContextError(ctx, fmt.Sprintf("shard %s", shardID))
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
	return fmt.Errorf("router: %w: shard %s: %w", kind, shardID, err)
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
