package router

import "errors"

// The error codes that survive to clients. Every error Predict returns
// wraps exactly one; front ends map them to gRPC codes and HTTP statuses
// and never look at message text.
var (
	// ErrInvalidArgument: the request is malformed; retrying will not help.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrNotFound: no such model (or pinned version) is served.
	ErrNotFound = errors.New("not found")
	// ErrUnavailable: the model is known but cannot be answered now
	// (partitions without a ready replica, shard failures, deadline).
	ErrUnavailable = errors.New("unavailable")
)
