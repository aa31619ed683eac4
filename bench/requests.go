package bench

import (
	"google.golang.org/protobuf/proto"

	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// requests are built before a run starts, so that no request is built on
// the clock; a run cycles through them.
type requests struct {
	reqs      []*kservepb.ModelInferRequest
	meanBytes int // mean size on the wire
	ids       int // ids per request, shared ones included
}

// prebuild draws n distinct requests for model from g and, for a client
// that encodes requests its own way, has it encode each now. A request it
// cannot encode is counted at its protobuf size; its calls fail, with the
// reason, when the run sends it.
func prebuild(g *Generator, model string, n int, c Inferer) requests {
	r := requests{reqs: make([]*kservepb.ModelInferRequest, n)}
	p, _ := c.(preparer)
	size := 0
	for i := range r.reqs {
		r.reqs[i] = g.Request(model)
		n := proto.Size(r.reqs[i])
		if p != nil {
			if wire, err := p.Prepare(r.reqs[i]); err == nil {
				n = wire
			}
		}
		size += n
	}
	r.meanBytes = size / n
	for i, in := range r.reqs[0].Inputs {
		if in.Name == "ids" || in.Name == "shared_ids" {
			r.ids += len(r.reqs[0].RawInputContents[i]) / 8
		}
	}
	return r
}

// get is the i-th request of the cycle.
func (r requests) get(i int) *kservepb.ModelInferRequest { return r.reqs[i%len(r.reqs)] }
