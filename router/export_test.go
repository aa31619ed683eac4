package router

import (
	"context"
	"fmt"
	"sync"

	"github.com/cumulus-serving/cumulus/shard"
)

// formats records the format of each lookup request it passes on; the
// calls of a request run concurrently.
type formats struct {
	shard.Service
	mu   *sync.Mutex
	seen map[byte]int
}

func (f *formats) Lookup(ctx context.Context, req []byte) ([]byte, error) {
	f.mu.Lock()
	f.seen[req[1]]++
	f.mu.Unlock()
	return f.Service.Lookup(ctx, req)
}

// Recycle passes answers back to the wrapped service, as the router
// does to a shard's: FetchRecords's records are read through the pool.
func (f *formats) Recycle(b []byte) {
	if r, ok := f.Service.(interface{ Recycle([]byte) }); ok {
		r.Recycle(b)
	}
}

// FetchRecords fetches ids' records from the shards of model's live
// version as a request would, and returns ids and each one's values
// (width each, as the scorer would read them), and the lookup request
// formats sent (codec: 1 float32 values, 2 records as stored). With older, the shards'
// offers of stored encodings are withdrawn first, as an older shard
// makes none, and restored after. For tests outside the package; nothing
// else may use the router meanwhile (the backends' services are swapped
// for recording ones).
func FetchRecords(ctx context.Context, r *Router, model string, ids []uint64, older bool) ([]uint64, []float32, map[byte]int, error) {
	mr := r.tab.Load().models[model]
	if mr == nil || mr.live == nil {
		return nil, nil, nil, fmt.Errorf("model %q has no live version", model)
	}
	vr := mr.live
	seen, mu := map[byte]int{}, new(sync.Mutex)
	var wrapped []*backend
	for _, reps := range vr.replicas {
		for _, b := range reps {
			if _, ok := b.svc.(*formats); ok {
				continue
			}
			svc, offered := b.svc, b.stored.Load()
			b.svc = &formats{Service: svc, mu: mu, seen: seen}
			wrapped = append(wrapped, b)
			defer func() { b.svc = svc; b.stored.Store(offered) }()
		}
	}
	// An older shard's withdrawn offers are restored by any registration
	// event the router takes in meanwhile (a shard's load report): a
	// fetch that sent records-as-stored requests anyway is made again.
	for attempt := 0; ; attempt++ {
		if older {
			for _, b := range wrapped {
				b.stored.Store(0)
			}
		}
		clear(seen)
		w := getWork()
		w.dedup(&Request{IDs: ids})
		w.partition(vr)
		if err := r.fanOut(ctx, vr, w); err != nil {
			w.release()
			return nil, nil, nil, err
		}
		// Each id's record, where the request's numbering put it.
		width := vr.width()
		vals := make([]float32, len(ids)*width)
		for i, u := range w.pos {
			copy(vals[i*width:(i+1)*width], w.vals[int(u)*width:])
		}
		uniq := ids
		w.release()
		if !older || seen[2] == 0 || attempt == 20 {
			return uniq, vals, seen, nil
		}
	}
}
