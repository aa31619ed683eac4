package server

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/router"
)

func TestClassify(t *testing.T) {
	wrap := func(e error) error {
		return fmt.Errorf("router: %w: shard s1: %w", e, status.Error(codes.Unavailable, "x"))
	}
	for _, tc := range []struct {
		err  error
		grpc codes.Code
		http int
	}{
		{nil, codes.OK, 200},
		{wrap(router.ErrInvalidArgument), codes.InvalidArgument, 400},
		{wrap(router.ErrNotFound), codes.NotFound, 404},
		{wrap(router.ErrDeadlineExceeded), codes.DeadlineExceeded, 504},
		{context.DeadlineExceeded, codes.DeadlineExceeded, 504},
		{wrap(router.ErrResourceExhausted), codes.ResourceExhausted, 429},
		{wrap(router.ErrInternal), codes.Internal, 500},
		{fmt.Errorf("gone: %w", context.Canceled), codes.Canceled, 499},
		{wrap(router.ErrUnavailable), codes.Unavailable, 503},
		{status.Error(codes.ResourceExhausted, "grpc: received message larger than max"), codes.ResourceExhausted, 429},
		{errors.New("anything else"), codes.Unavailable, 503},
	} {
		if got := classify(tc.err); got.grpc != tc.grpc || got.http != tc.http {
			t.Errorf("%v: %v %d, want %v %d", tc.err, got.grpc, got.http, tc.grpc, tc.http)
		}
	}
}
