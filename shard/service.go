package shard

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/admit"
	scratchlist "github.com/cumulus-serving/cumulus/internal/scratch"
)

// LookupMethod is the full gRPC method name of the shard's one RPC. It
// carries codec lookup frames, not protobuf.
const LookupMethod = "/cumulus.shard.v1.Shard/Lookup"

// Service answers batched lookups. It is implemented by the shard itself
// (in process), by Client (over gRPC), and by test fakes; hedging and
// stats wrap it once.
type Service interface {
	// Lookup takes an encoded lookup request and returns the encoded
	// response. Errors are gRPC status errors: InvalidArgument for a
	// malformed request, FailedPrecondition when the shard does not hold
	// the pinned version or a partition (try another replica).
	Lookup(ctx context.Context, req []byte) ([]byte, error)
	// Extra returns the extra file of role (codec.RoleDense) of a version
	// the shard holds, as it verified it on loading: FailedPrecondition if
	// it does not hold it.
	Extra(ctx context.Context, model string, version uint64, role string) ([]byte, error)
}

// ExtraMethod is the full gRPC method name of Extra. It carries codec
// frames: an extra-file request (codec.AppendExtraRequest), the file.
const ExtraMethod = "/cumulus.shard.v1.Shard/Extra"

// Extra returns the dense part of a version this shard holds.
func (s *Shard) Extra(ctx context.Context, model string, version uint64, role string) ([]byte, error) {
	if role != codec.RoleDense {
		return nil, status.Errorf(codes.InvalidArgument, "shard %s: no extra files of role %q are served", s.opts.ID, role)
	}
	ver := s.snap.Load().get(model, version)
	if ver == nil || ver.dense == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "shard %s: does not hold the %s part of model %q version %d", s.opts.ID, role, model, version)
	}
	return ver.dense.b, nil
}

// Extra asks the shard for an extra file.
func (c *Client) Extra(ctx context.Context, model string, version uint64, role string) ([]byte, error) {
	return invokeExtra(ctx, c.conn, model, version, role)
}

// Extra asks the shard for an extra file, in a call of its own (not on
// the lookup stream: a file may be large, and rare).
func (c *MuxClient) Extra(ctx context.Context, model string, version uint64, role string) ([]byte, error) {
	return invokeExtra(ctx, c.conn, model, version, role)
}

func invokeExtra(ctx context.Context, conn *grpc.ClientConn, model string, version uint64, role string) ([]byte, error) {
	in, out := codec.Frame(codec.AppendExtraRequest(nil, model, version, role)), codec.Frame(nil)
	if err := conn.Invoke(ctx, ExtraMethod, &in, &out, grpc.CallContentSubtype(codec.GRPCCodecName)); err != nil {
		return nil, err
	}
	return out, nil
}

type scratch struct {
	req     codec.LookupRequest
	idx     []int32
	idx2    []int32
	layer   []int32
	pending []int32
	pkeys   []uint64
	ws, ws2 []float32
	found   []uint64
	vals    []byte // found keys' values, as the response carries them
	stored  bool   // vals carries records as stored (codec.FlagStored)
	cold    []byte // values read from disk (or its cache), a record's value bytes each
	miss    []int32
	hits    int        // keys of partitions served from disk answered by their caches
	reads   int        // and read from disk
	turns   *ColdReads // the shard's turns at the disk; nil: no bound
	ahead   readAhead  // keys of partitions served from disk, read together
	sec     int        // the section being looked up, in ahead; −1: none
}

// StoredEncodings are the encodings whose records this shard sends as
// stored when asked, as its registration says (topo.ShardInfo.Encodings).
var StoredEncodings = []string{"fp16", "int8"}

// appendRecord appends record r of t to the response: as stored, less
// its key, or as float32s.
func (sc *scratch) appendRecord(t *Table, r int) { sc.appendValue(t, t.valAt(r)) }

// appendValue appends a record's value bytes v, of a table of t's
// format, to the response: as stored, or as float32s.
func (sc *scratch) appendValue(t *Table, v []byte) {
	if sc.stored {
		sc.vals = append(sc.vals, v...)
		return
	}
	sc.vals = codec.AppendValues(sc.vals, v, t.width, t.enc)
}

// lookupStack answers keys from a partition's stack: the view of its
// deltas first, if it has one (v; layers are then what lies below the
// deltas), then each layer in turn — deltas newest first when the stack
// has no view, then the base, which may be served from disk. The first
// to have a key decides, and a tombstone there means the feature was
// deleted.
// i is the index of keys[0] in the whole request; it returns the index
// after the last key, or ctx's error if ctx ends before or while a layer
// served from disk is read.
func (sc *scratch) lookupStack(ctx context.Context, v *view, layers []*Table, keys []uint64, w, i int) (int, error) {
	if v != nil && len(layers) == 1 && !layers[0].Mapped {
		return sc.lookupView(v, layers[0], keys, w, i), nil
	}
	n := len(keys)
	sc.idx, sc.idx2, sc.layer = resize(sc.idx, n), resize(sc.idx2, n), resize(sc.layer, n)
	sc.pending = resize(sc.pending, n)
	var ws []float32 // LR: each found key's weight, read while its record is in cache
	if w == 1 {
		sc.ws, sc.ws2 = resize(sc.ws, n), resize(sc.ws2, n)
		ws = sc.ws
	}
	var over []*Table // the view's tables, by layer
	sc.pending = sc.pending[:0]
	sc.cold = sc.cold[:0]
	if v != nil {
		over = v.find(keys, sc.layer, sc.idx, ws)
		for j, l := range sc.layer {
			if l >= 0 {
				sc.layer[j] = l + int32(len(layers))
			} else {
				sc.pending = append(sc.pending, int32(j))
			}
		}
	} else {
		for j := range sc.layer {
			sc.layer[j] = -1
			sc.pending = append(sc.pending, int32(j))
		}
	}
	// Each layer sees only the keys the layers above it did not have: a
	// base served from disk is asked (and learns its cache from) only
	// the keys no delta wrote.
	for li, t := range layers {
		if len(sc.pending) == 0 {
			break
		}
		sc.pkeys = sc.pkeys[:0]
		for _, j := range sc.pending {
			sc.pkeys = append(sc.pkeys, keys[j])
		}
		found := sc.idx2[:len(sc.pkeys)]
		var pw []float32
		if ws != nil {
			pw = sc.ws2[:len(sc.pkeys)]
		}
		if t.Mapped {
			// Served from disk: the values land in sc.cold, and a found
			// key's index is its value's place there.
			if err := ctx.Err(); err != nil {
				return 0, err
			}
			t.Sample(sc.pkeys)
			at := len(sc.cold) / t.vlen
			sc.cold = slices.Grow(sc.cold, len(sc.pkeys)*t.vlen)[:(at+len(sc.pkeys))*t.vlen]
			if out, vals, ok := sc.ahead.section(sc.sec, t.vlen); ok && li == len(layers)-1 && len(out) == len(found) {
				// Read ahead (readAhead): these very keys, their hits
				// and reads counted there.
				copy(found, out)
				copy(sc.cold[at*t.vlen:], vals)
			} else {
				var err error
				sc.miss, err = t.readCold(ctx, sc.pkeys, found, sc.cold[at*t.vlen:], sc.miss, sc.turns)
				sc.hits += len(sc.pkeys) - len(sc.miss)
				sc.reads += len(sc.miss)
				if err != nil {
					return 0, err
				}
			}
			for q, r := range found {
				if r >= 0 {
					found[q] = r + int32(at)
					if pw != nil {
						pw[q] = math.Float32frombits(binary.LittleEndian.Uint32(sc.cold[(at+q)*t.vlen:]))
					}
				}
			}
		} else {
			t.find(sc.pkeys, found, pw)
		}
		kept := 0
		for q, j := range sc.pending {
			if r := found[q]; r >= 0 {
				sc.layer[j], sc.idx[j] = int32(li), r
				if ws != nil {
					ws[j] = pw[q]
				}
			} else {
				sc.pending[kept] = j
				kept++
			}
		}
		sc.pending = sc.pending[:kept]
	}
	for j := range keys {
		if li := int(sc.layer[j]); li >= 0 {
			if ws != nil {
				if !codec.IsTombstone(ws[j]) {
					sc.vals = binary.LittleEndian.AppendUint32(sc.vals, math.Float32bits(ws[j]))
					sc.found[i>>6] |= 1 << (i & 63)
				}
				i++
				continue
			}
			r := int(sc.idx[j])
			var t *Table
			var val []byte
			switch {
			case li >= len(layers): // a delta, through the view: r is its record
				t = over[li-len(layers)]
				val = t.valAt(r)
			case layers[li].Mapped: // read from disk: r is its value's place in sc.cold
				t = layers[li]
				val = sc.cold[r*t.vlen : (r+1)*t.vlen]
			default:
				t = layers[li]
				val = t.valAt(r)
			}
			if !codec.IsTombstone(math.Float32frombits(binary.LittleEndian.Uint32(val))) {
				sc.appendValue(t, val)
				sc.found[i>>6] |= 1 << (i & 63)
			}
		}
		i++
	}
	return i, nil
}

// readAhead looks up, before the lookup's sections are answered one
// after another, the keys of every section that reach a base served
// from disk, when more than one section has such a base: in its cache,
// and the misses of all of them read from disk together (sc.ahead),
// not each partition's after the one before; lookupStack takes what
// it found. At a thousand partitions a lookup asks a shard for hundreds
// of them, and read a partition at a time it waited a disk's latency
// for each. Keys a delta above the base holds are not read; a section
// whose deltas are served from disk as well is left to lookupStack.
func (sc *scratch) readAhead(ctx context.Context, ver *version) error {
	a := &sc.ahead
	bases, vlen := 0, 0
	for _, sec := range sc.req.Sections {
		if t := diskBase(ver, sec.Partition); t != nil {
			bases++
			vlen = t.vlen
		}
	}
	if bases < 2 {
		return nil
	}
	a.secAt, a.secN = resize(a.secAt, len(sc.req.Sections)), resize(a.secN, len(sc.req.Sections))
	for s, sec := range sc.req.Sections {
		a.secAt[s] = -1
		base := diskBase(ver, sec.Partition)
		if base == nil || base.vlen != vlen {
			continue
		}
		// The keys no delta above the base holds, as lookupStack finds
		// them, in the same order.
		keys := sec.Keys
		sc.pending = resize(sc.pending, len(keys))[:0]
		layers := ver.layers[sec.Partition]
		if v := ver.views[sec.Partition]; v != nil {
			layers = layers[v.deltas:]
			sc.layer, sc.idx = resize(sc.layer, len(keys)), resize(sc.idx, len(keys))
			v.find(keys, sc.layer, sc.idx, nil)
			for j, l := range sc.layer {
				if l < 0 {
					sc.pending = append(sc.pending, int32(j))
				}
			}
		} else {
			for j := range keys {
				sc.pending = append(sc.pending, int32(j))
			}
		}
		sc.pkeys = sc.pkeys[:0]
		for _, j := range sc.pending {
			sc.pkeys = append(sc.pkeys, keys[j])
		}
		for _, t := range layers[:len(layers)-1] {
			sc.idx2 = resize(sc.idx2, len(sc.pkeys))
			t.find(sc.pkeys, sc.idx2, nil)
			kept := 0
			for q, r := range sc.idx2 {
				if r < 0 {
					sc.pkeys[kept] = sc.pkeys[q]
					kept++
				}
			}
			sc.pkeys = sc.pkeys[:kept]
		}
		reads := len(a.reads)
		a.add(s, base, sc.pkeys)
		sc.reads += len(a.reads) - reads
		sc.hits += len(sc.pkeys) - (len(a.reads) - reads)
	}
	return a.read(ctx, sc.turns)
}

// diskBase is the base of partition p's stack in ver if it is served
// from disk and no layer above it is; nil otherwise.
func diskBase(ver *version, p uint32) *Table {
	if p >= uint32(len(ver.layers)) || len(ver.layers[p]) == 0 {
		return nil
	}
	layers := ver.layers[p]
	if v := ver.views[p]; v != nil {
		layers = layers[v.deltas:]
	}
	if len(layers) == 0 {
		return nil
	}
	for _, t := range layers[:len(layers)-1] {
		if t.Mapped {
			return nil
		}
	}
	if base := layers[len(layers)-1]; base.Mapped {
		return base
	}
	return nil
}

// lookupSection appends the values of one section's keys found in ver's
// stack for its partition, which ver holds, to sc.vals and marks them in
// sc.found; i is the index of the section's first key in the request. It
// returns the index after its last key, or ctx's error if ctx ends before
// or while a layer served from disk is read.
func (sc *scratch) lookupSection(ctx context.Context, ver *version, sec codec.Section, w, i int) (int, error) {
	layers := ver.layers[sec.Partition]
	if v := ver.views[sec.Partition]; v != nil || len(layers) > 1 || layers[0].Mapped {
		if v != nil {
			layers = layers[v.deltas:]
		}
		return sc.lookupStack(ctx, v, layers, sec.Keys, w, i)
	}
	t := layers[0]
	sc.idx = resize(sc.idx, len(sec.Keys))
	if w == 1 {
		// LR: the weight is read while the record is in cache.
		sc.ws = resize(sc.ws, len(sec.Keys))
		t.FindWeights(sec.Keys, sc.idx, sc.ws)
		for j, r := range sc.idx {
			if r >= 0 {
				sc.found[i>>6] |= 1 << (i & 63)
				sc.vals = binary.LittleEndian.AppendUint32(sc.vals, math.Float32bits(sc.ws[j]))
			}
			i++
		}
		return i, nil
	}
	t.Find(sec.Keys, sc.idx)
	return sc.gather(t, nil, nil, nil, sc.idx, i), nil
}

// gatherAhead is how many keys before its copy a found record is
// prefetched. A wide record is several lines scattered over a table far
// larger than the caches: copied one after another, each waits out its
// own misses; prefetched this far ahead, a dozen records' misses are
// under way at once (BenchmarkWide).
const gatherAhead = 12

// gather appends the found records of a section's keys to the response
// and marks them found, i being the index of the first key in the
// request; it returns the index after the last. Key j's record is
// idx[j] of over[layer[j]] where layer[j] ≥ 0 (a delta, through a view:
// a tombstone there reads as absent), else baseIdx[j] of base (−1:
// absent). layer is nil when only base answers.
func (sc *scratch) gather(base *Table, over []*Table, layer, idx, baseIdx []int32, i int) int {
	record := func(j int) (*Table, int32) {
		if layer != nil && layer[j] >= 0 {
			return over[layer[j]], idx[j]
		}
		return base, baseIdx[j]
	}
	found, each := 0, 4*base.width
	if sc.stored {
		each = base.vlen
	}
	for j := range baseIdx {
		if t, r := record(j); r >= 0 {
			found++
			if j < gatherAhead {
				t.prefetchVal(int(r))
			}
		}
	}
	sc.vals = slices.Grow(sc.vals, found*each)
	for j := range baseIdx {
		if j+gatherAhead < len(baseIdx) {
			if t, r := record(j + gatherAhead); r >= 0 {
				t.prefetchVal(int(r))
			}
		}
		t, r := record(j)
		if r >= 0 && (t == base || !codec.IsTombstone(t.Weight(int(r)))) {
			sc.appendRecord(t, int(r))
			sc.found[i>>6] |= 1 << (i & 63)
		}
		i++
	}
	return i
}

// lookupView is lookupStack for the common stack: deltas read through
// a view over a resident base. Every key is looked up in both, the base
// with the same batched search as a full version's, and the view's
// answer, where it has one, wins: the few keys the deltas hold cost a
// base lookup too, and the many they do not hold cost no gathering.
func (sc *scratch) lookupView(v *view, base *Table, keys []uint64, w, i int) int {
	n := len(keys)
	sc.idx, sc.idx2, sc.layer = resize(sc.idx, n), resize(sc.idx2, n), resize(sc.layer, n)
	if w == 1 {
		sc.ws, sc.ws2 = resize(sc.ws, n), resize(sc.ws2, n)
		base.FindWeights(keys, sc.idx2, sc.ws2)
		v.find(keys, sc.layer, sc.idx, sc.ws)
		for j, l := range sc.layer {
			x, ok := sc.ws2[j], sc.idx2[j] >= 0
			if l >= 0 {
				x, ok = sc.ws[j], !codec.IsTombstone(sc.ws[j])
			}
			if ok {
				sc.vals = binary.LittleEndian.AppendUint32(sc.vals, math.Float32bits(x))
				sc.found[i>>6] |= 1 << (i & 63)
			}
			i++
		}
		return i
	}
	base.Find(keys, sc.idx2)
	over := v.find(keys, sc.layer, sc.idx, nil)
	return sc.gather(base, over, sc.layer, sc.idx, sc.idx2, i)
}

func (s *Shard) countFault(kind string) { s.metrics.faults.WithLabelValues(kind).Inc() }

// scratches keeps lookup scratch across garbage collections (see
// internal/scratch).
var scratches = scratchlist.New(8, func() *scratch { return new(scratch) }, func(sc *scratch) bool {
	a := &sc.ahead
	return cap(sc.vals) <= 1<<24 && cap(sc.cold) <= 1<<24 && cap(a.vals) <= 1<<24 && cap(a.keys) <= 1<<21 && cap(a.out) <= 1<<22 && cap(a.reads) <= 1<<20
})

// Lookup implements Service on what the shard holds now. It stops, with
// the context's error, between partitions and before reading a mapped
// (cold) layer once the caller has given up.
func (s *Shard) Lookup(ctx context.Context, req []byte) ([]byte, error) {
	return s.lookup(ctx, req, nil)
}

// lookup is Lookup, its response appended to prefix (a lookup stream's
// reply header): the response is built once, where it is sent from.
func (s *Shard) lookup(ctx context.Context, req, prefix []byte) ([]byte, error) {
	if s.begun.Add(1) == 1 {
		// Routers send it lookups: loads from now on take their turns
		// (Options.LoadRate).
		s.opts.Repo.Throttle.SetServing(true)
	}
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	bound := "lookups"
	slot, err := s.slots.Acquire(ctx, 1)
	if err == nil {
		defer slot.Release()
		bound = "lookup bytes"
		var b admit.Ticket
		if b, err = s.bytes.Acquire(ctx, int64(len(req))); err == nil {
			defer b.Release()
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		s.metrics.refused.Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "shard %s: at its bound of %s in flight (--max-inflight, --max-inflight-bytes)", s.opts.ID, bound)
	}
	if s.opts.BeforeLookup != nil {
		s.opts.BeforeLookup(ctx)
	}
	if err := s.faults.Load().apply(ctx, s.countFault); err != nil {
		return nil, err
	}
	sc := scratches.Get()
	defer scratches.Put(sc)
	sc.turns, sc.hits, sc.reads = s.faults.Load().diskReads(s.cold, s), 0, 0
	if err := sc.req.Decode(req); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	snap := s.acquire()
	defer snap.done()
	ver := snap.get(string(sc.req.Model), sc.req.Version)
	if ver == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "shard %s: does not hold model %q version %d", s.opts.ID, sc.req.Model, sc.req.Version)
	}
	n := sc.req.NumKeys()
	w := ver.m.Width()
	sc.found = sc.found[:0]
	for range (n + 63) / 64 {
		sc.found = append(sc.found, 0)
	}
	// Values go straight into the response, after its header and bitmap,
	// room made for every key found (up to 4 MiB: keys not found must not
	// cost memory up front), in a pooled buffer: a lookup stream's writer
	// sends it as a codec.PooledFrame, which gives it back once written.
	var at int
	// (At most 4 MiB up front: the pool's classes are powers of two, and
	// a little more would take 8.)
	buf := append(codec.GetFrameBuffer(min(len(prefix)+16+(n+7)/8+4*n*w, 4<<20)), prefix...)
	if sc.stored = sc.req.Stored; sc.stored {
		sc.vals, at = codec.StartStoredResponse(buf, n, w, ver.m.Enc())
	} else {
		sc.vals, at = codec.StartLookupResponse(buf, n, w)
	}
	defer func() { sc.vals = nil }() // the response is the caller's
	defer sc.ahead.reset()
	// Counted also for a lookup that fails: on a slow disk, those that
	// miss their deadline are the reads to see.
	defer func() {
		if sc.hits+sc.reads > 0 {
			s.metrics.cacheHits.Add(float64(sc.hits))
			s.metrics.diskReads.Add(float64(sc.reads))
		}
	}()
	for _, sec := range sc.req.Sections { // before anything is read from disk
		if sec.Partition >= uint32(len(ver.layers)) || ver.layers[sec.Partition] == nil {
			return nil, status.Errorf(codes.FailedPrecondition, "shard %s: does not hold partition %d of %q version %d", s.opts.ID, sec.Partition, sc.req.Model, sc.req.Version)
		}
	}
	if err := sc.readAhead(ctx, ver); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	i := 0
	defer func() { sc.sec = -1 }()
	for k, sec := range sc.req.Sections {
		sc.sec = k
		if err := ctx.Err(); err != nil {
			return nil, status.FromContextError(err).Err()
		}
		var err error
		if i, err = sc.lookupSection(ctx, ver, sec, w, i); err != nil {
			return nil, status.FromContextError(err).Err()
		}
	}
	s.metrics.keys.Add(float64(n))
	codec.FinishLookupResponse(sc.vals, at, n, sc.found)
	return sc.vals, nil
}

// serviceDesc registers a Service on a gRPC server without protobuf: the
// codec frames pass through as they are.
var serviceDesc = grpc.ServiceDesc{
	ServiceName: "cumulus.shard.v1.Shard",
	HandlerType: (*Service)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Lookup",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var req codec.Frame
			if err := dec(&req); err != nil {
				return nil, err
			}
			resp, err := srv.(Service).Lookup(ctx, req)
			if err != nil {
				return nil, err
			}
			f := codec.Frame(resp)
			return &f, nil
		},
	}, {
		MethodName: "Extra",
		Handler: func(srv any, ctx context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var req codec.Frame
			if err := dec(&req); err != nil {
				return nil, err
			}
			model, version, role, err := codec.ParseExtraRequest(req)
			if err != nil {
				return nil, status.Error(codes.InvalidArgument, err.Error())
			}
			resp, err := srv.(Service).Extra(ctx, model, version, role)
			if err != nil {
				return nil, err
			}
			f := codec.Frame(resp)
			return &f, nil
		},
	}},
	Streams: []grpc.StreamDesc{{
		StreamName: "LookupStream", ServerStreams: true, ClientStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			if s, ok := srv.(interface{ serveStream(grpc.ServerStream) error }); ok {
				return s.serveStream(stream)
			}
			return status.Error(codes.Unimplemented, "this server answers lookups one call at a time (Lookup)")
		},
	}},
	Metadata: "cumulus/shard",
}

// RegisterService serves svc's lookups on a gRPC server.
func RegisterService(s *grpc.Server, svc Service) { s.RegisterService(&serviceDesc, svc) }

// Client is a Service over a gRPC connection.
type Client struct{ conn *grpc.ClientConn }

// NewClient wraps a connection to a shard.
func NewClient(conn *grpc.ClientConn) *Client { return &Client{conn: conn} }

// Lookup implements Service.
func (c *Client) Lookup(ctx context.Context, req []byte) ([]byte, error) {
	in, out := codec.Frame(req), codec.Frame(nil)
	if err := c.conn.Invoke(ctx, LookupMethod, &in, &out, grpc.CallContentSubtype(codec.GRPCCodecName)); err != nil {
		return nil, err
	}
	return out, nil
}

// String names the peer, for errors and logs.
func (c *Client) String() string { return fmt.Sprintf("shard at %s", c.conn.Target()) }

// resize returns s with length n, reusing its array when large enough.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return append(s[:cap(s)], make([]T, n-cap(s))...)
	}
	return s[:n]
}

// StackScratch is reusable memory for StackWeights, and how it reads
// tables served from disk: Reads (nil: unbounded, as the process reads
// by default).
type StackScratch struct {
	sc    scratch
	Reads *ColdReads
}

// StackWeights looks keys up in a stack of LR tables (newest or hottest
// first) the way a shard does, for tools and benchmarks: w[j] is keys[j]'s
// weight and found[j] whether it is present.
func StackWeights(layers []*Table, keys []uint64, w []float32, found []bool, s *StackScratch) {
	sc := &s.sc
	sc.vals, sc.turns = sc.vals[:0], s.Reads
	sc.found = resize(sc.found, (len(keys)+63)/64)
	clear(sc.found)
	sc.lookupStack(context.Background(), nil, layers, keys, 1, 0)
	k := 0
	for j := range keys {
		found[j] = sc.found[j>>6]>>(j&63)&1 == 1
		w[j] = 0
		if found[j] {
			w[j] = math.Float32frombits(binary.LittleEndian.Uint32(sc.vals[4*k:]))
			k++
		}
	}
}
