package router

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestShardErrorReasons: a failed shard call is classified by the
// shard's code, and its reason names the partitions, never the shard or
// the transport's message, which stay in the error's detail.
func TestShardErrorReasons(t *testing.T) {
	refused := status.Error(codes.Unavailable, "connection error: dial tcp 10.0.0.9:7100: connect: connection refused")
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	for _, c := range []struct {
		ctx    context.Context
		err    error
		parts  []uint32
		kind   error
		reason string
	}{
		{context.Background(), refused, []uint32{12}, ErrUnavailable, "partition 12 unavailable"},
		{context.Background(), refused, []uint32{1, 3}, ErrUnavailable, "partitions 1, 3 unavailable"},
		{context.Background(), refused, []uint32{1, 2, 3, 4, 5, 6}, ErrUnavailable, "partitions 1, 2, 3, 4 and 2 more unavailable"},
		{context.Background(), status.Error(codes.DeadlineExceeded, "x"), []uint32{1}, ErrDeadlineExceeded, "deadline exceeded at the shards"},
		{context.Background(), status.Error(codes.ResourceExhausted, "x"), []uint32{1}, ErrResourceExhausted, "shards overloaded; retry later"},
		{context.Background(), status.Error(codes.InvalidArgument, "x"), []uint32{1}, ErrInternal, "internal error at the shards"},
		{expired, refused, []uint32{1}, ErrDeadlineExceeded, "router: deadline exceeded: deadline passed waiting for the shards"},
	} {
		err := shardError(c.ctx, "s7", c.parts, c.err)
		if !errors.Is(err, c.kind) || Reason(err) != c.reason || !Detailed(err) || !strings.Contains(err.Error(), "s7") {
			t.Errorf("%v for %v: %v (reason %q), want %v (reason %q)", c.err, c.parts, err, Reason(err), c.kind, c.reason)
		}
	}
	plain := ContextError(expired, "admission")
	if Detailed(plain) || Reason(plain) != plain.Error() {
		t.Errorf("an error of Cumulus's own making is its own reason: %v", plain)
	}
}
