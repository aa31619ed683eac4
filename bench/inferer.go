package bench

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc"

	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// Inferer is what a run needs of a client: KServe's ModelInfer.
// kservepb.GRPCInferenceServiceClient has it, and so has RESTClient, so
// the loops do not care which protocol carries a call. A run calls it
// from many goroutines at once, with requests shared read-only; errors
// are gRPC statuses, whose codes the runs count.
type Inferer interface {
	ModelInfer(ctx context.Context, req *kservepb.ModelInferRequest, opts ...grpc.CallOption) (*kservepb.ModelInferResponse, error)
}

// preparer is an Inferer that encodes requests its own way (RESTClient).
// A run prepares each of its requests once, before its clock starts, so
// that no call pays for encoding, as gRPC's protos are built beforehand
// too. Prepare returns the request's size on the wire.
type preparer interface {
	Prepare(req *kservepb.ModelInferRequest) (int, error)
}

// RoundRobin spreads calls over several Inferers (for gRPC, one per
// connection: a single HTTP/2 connection carrying every call queues
// them behind one another's bytes, which a ranking service with many
// connections would not see).
type RoundRobin struct {
	clients []Inferer
	next    atomic.Uint64
}

// NewRoundRobin calls clients in turn; it needs at least one.
func NewRoundRobin(clients ...Inferer) *RoundRobin { return &RoundRobin{clients: clients} }

// ModelInfer implements Inferer.
func (r *RoundRobin) ModelInfer(ctx context.Context, req *kservepb.ModelInferRequest, opts ...grpc.CallOption) (*kservepb.ModelInferResponse, error) {
	return r.clients[int(r.next.Add(1)%uint64(len(r.clients)))].ModelInfer(ctx, req, opts...)
}
