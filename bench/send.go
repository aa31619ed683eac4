package bench

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// MaxRetries is how many times a request answered Unavailable is sent
// again when a run retries.
const MaxRetries = 3

// retryBackoff is the pause before the first resend, doubled before each
// next one: what answers Unavailable (a shard or router restarting) is
// rarely back within microseconds, and three resends in a row at once
// would measure nothing but the client's speed.
const retryBackoff = 5 * time.Millisecond

// send makes one predict call under ctx. With retry, a call answered
// Unavailable is sent again under the same ctx, so the same deadline, up
// to MaxRetries times; resent counts the resends. The error is the last
// answer's: a request whose deadline ends while it waits to be resent
// keeps its Unavailable.
func send(ctx context.Context, c Inferer, req *kservepb.ModelInferRequest, retry bool, opts ...grpc.CallOption) (resent int, err error) {
	for {
		_, err = c.ModelInfer(ctx, req, opts...)
		if !retry || resent == MaxRetries || status.Code(err) != codes.Unavailable {
			return resent, err
		}
		t := time.NewTimer(retryBackoff << resent)
		select {
		case <-ctx.Done():
			t.Stop()
			return resent, err
		case <-t.C:
		}
		resent++
	}
}
