package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dustin/go-humanize"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// Hostile inputs are requests built to cost a server as much as it lets
// them: each is built once, before anything is measured, and sent as the
// same bytes every time.

// Hostile is one hostile request: an HTTP JSON infer body or a serialized
// gRPC ModelInferRequest.
type Hostile struct {
	Name string // deep-json, big-json or big-grpc
	Desc string // what it is, in a few words
	Body []byte // the JSON infer body; nil for a gRPC message
	Msg  []byte // the serialized ModelInferRequest; nil for a JSON body
}

// Size is the request's size in bytes: the body, or the message without
// gRPC's 5-byte frame header.
func (h Hostile) Size() int { return len(h.Body) + len(h.Msg) }

// HostileSizes size the hostile inputs; zero values are the issue's.
type HostileSizes struct {
	// Depth is deep-json's nesting of arrays in its data. Default 9,990:
	// with the 3 levels of the request around it, just under the 10,000
	// that JSON decoders commonly allow.
	Depth int
	// JSONBytes is big-json's body size. Default 66,000,000: under the
	// default --max-request-bytes of 64 MiB (67,108,864).
	JSONBytes int
	// GRPCBytes is big-grpc's message size. Default 63 MiB.
	GRPCBytes int
}

func (s HostileSizes) orDefault() HostileSizes {
	if s.Depth == 0 {
		s.Depth = 9_990
	}
	if s.JSONBytes == 0 {
		s.JSONBytes = 66_000_000
	}
	if s.GRPCBytes == 0 {
		s.GRPCBytes = 63 << 20
	}
	return s
}

// HostileInputs builds deep-json, big-json and big-grpc for model.
func HostileInputs(model string, s HostileSizes) []Hostile {
	s = s.orDefault()
	deep := DeepJSON(s.Depth)
	big, n := BigJSON(s.JSONBytes)
	msg, ids := BigGRPC(model, s.GRPCBytes)
	return []Hostile{
		{Name: "deep-json", Body: deep,
			Desc: fmt.Sprintf("JSON infer body whose data is nested %s arrays deep", humanize.Comma(int64(s.Depth)))},
		{Name: "big-json", Body: big,
			Desc: fmt.Sprintf("JSON infer body: %s UINT64 ids of 19 digits, the last one 1.5", humanize.Comma(int64(n)))},
		{Name: "big-grpc", Msg: msg,
			Desc: fmt.Sprintf("gRPC ModelInferRequest: %s ids as raw_input_contents", humanize.Comma(int64(ids)))},
	}
}

// DeepJSON is an infer body whose ids data is one number inside depth
// nested arrays: [[[…1…]]].
func DeepJSON(depth int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"inputs":[{"name":"ids","datatype":"UINT64","shape":[1],"data":`)
	b.WriteString(strings.Repeat("[", depth))
	b.WriteString("1")
	b.WriteString(strings.Repeat("]", depth))
	b.WriteString(`},{"name":"row_splits","datatype":"INT64","shape":[2],"data":[0,1]}]}`)
	return b.Bytes()
}

// BigJSON is an infer body of exactly size bytes (or the least that holds
// one element, if size is smaller): ids is a flat array of n-1 valid
// UINT64s of 19 digits each, then 1.5, not an integer, as its last of n
// elements; spaces before the array's end make up the size. Shapes and
// row_splits come after the data and agree with it, so only the last
// element is wrong.
func BigJSON(size int) (body []byte, n int) {
	const head = `{"inputs":[{"name":"ids","datatype":"UINT64","data":[`
	const bad = "1.5"
	tail := func(n int) string {
		return fmt.Sprintf(`],"shape":[%d]},{"name":"row_splits","datatype":"INT64","shape":[2],"data":[0,%d]}]}`, n, n)
	}
	const width = 20 // 19 digits and a comma
	valid := max(0, (size-len(head)-len(bad)-len(tail(size/width)))/width)
	for valid > 0 && len(head)+width*valid+len(bad)+len(tail(valid+1)) > size {
		valid--
	}
	n = valid + 1
	b := make([]byte, 0, max(size, len(head)+len(bad)+len(tail(n))))
	b = append(b, head...)
	for i := range uint64(valid) {
		// Hashed-looking ids, all 19 digits: 10^18 ≤ id < 9×10^18.
		b = strconv.AppendUint(b, 1e18+(i*0x9e3779b97f4a7c15)%8e18, 10)
		b = append(b, ',')
	}
	b = append(b, bad...)
	t := tail(n)
	for len(b)+len(t) < size {
		b = append(b, ' ')
	}
	return append(b, t...), n
}

// BigGRPC is a serialized ModelInferRequest for model of at most size
// bytes, as close to it as 8-byte ids allow: ids as raw_input_contents
// and row_splits of one row holding them all. Every part is well formed;
// only the size is hostile.
func BigGRPC(model string, size int) (msg []byte, ids int) {
	build := func(raw []byte) *kservepb.ModelInferRequest {
		n := int64(len(raw) / 8)
		return &kservepb.ModelInferRequest{ModelName: model,
			Inputs: []*kservepb.ModelInferRequest_InferInputTensor{
				{Name: "ids", Datatype: "UINT64", Shape: []int64{n}},
				{Name: "row_splits", Datatype: "INT64", Shape: []int64{2}},
			},
			RawInputContents: [][]byte{raw, RawUint64([]uint64{0, uint64(n)})}}
	}
	raw := make([]byte, max(0, size/8)*8)
	for i := range len(raw) / 8 {
		v := uint64(i) * 0x9e3779b97f4a7c15
		for j := range 8 {
			raw[8*i+j] = byte(v >> (8 * j))
		}
	}
	// What the message carries besides the ids; shrinking them by a few
	// bytes does not change it.
	over := proto.Size(build(raw)) - len(raw)
	raw = raw[:max(0, (size-over)/8)*8]
	msg, err := proto.Marshal(build(raw))
	if err != nil {
		panic(fmt.Sprintf("bench: marshalling a ModelInferRequest: %v", err)) // cannot happen
	}
	return msg, len(raw) / 8
}

// HostileTarget is a router's front, where hostile inputs are sent.
type HostileTarget struct {
	HTTPAddr string
	Conn     grpc.ClientConnInterface
	Model    string       // the model in JSON bodies' URL
	HTTP     *http.Client // default http.DefaultClient
}

// Answer is how a server answered one request, as a client saw it.
type Answer struct {
	Code    string // "HTTP 400", a gRPC code ("InvalidArgument"), or "client error"
	Message string // the error message's first 100 characters; "" if none
	Latency time.Duration
}

// Send sends h once and returns the answer. Errors are answers, never
// returned: a request the client could not complete says so in Code.
func (t HostileTarget) Send(ctx context.Context, h Hostile) Answer {
	if h.Msg != nil {
		return t.sendGRPC(ctx, h.Msg)
	}
	return t.sendHTTP(ctx, h.Body)
}

func (t HostileTarget) sendHTTP(ctx context.Context, body []byte) Answer {
	u := "http://" + t.HTTPAddr + "/v2/models/" + url.PathEscape(t.Model) + "/infer"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return Answer{Code: "client error", Message: first100(err.Error())}
	}
	req.Header.Set("Content-Type", "application/json")
	c := t.HTTP
	if c == nil {
		c = http.DefaultClient
	}
	t0 := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return Answer{Code: "client error", Message: first100(err.Error()), Latency: time.Since(t0)}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	a := Answer{Code: fmt.Sprintf("HTTP %d", resp.StatusCode), Latency: time.Since(t0)}
	var e struct {
		Error string `json:"error"`
	}
	switch {
	case json.Unmarshal(b, &e) == nil && e.Error != "":
		a.Message = first100(e.Error)
	case resp.StatusCode != http.StatusOK:
		a.Message = first100(string(b))
	}
	return a
}

func (t HostileTarget) sendGRPC(ctx context.Context, msg []byte) Answer {
	t0 := time.Now()
	err := t.Conn.Invoke(ctx, kservepb.GRPCInferenceService_ModelInfer_FullMethodName, preEncoded(msg),
		new(kservepb.ModelInferResponse), grpc.ForceCodecV2(preEncodedCodec{}), grpc.MaxCallSendMsgSize(math.MaxInt32))
	a := Answer{Latency: time.Since(t0)}
	s := status.Convert(err)
	a.Code, a.Message = s.Code().String(), first100(s.Message())
	return a
}

// first100 is s cut to its first 100 characters.
func first100(s string) string {
	n := 0
	for i := range s {
		if n == 100 {
			return s[:i] + "…"
		}
		n++
	}
	return s
}

// preEncoded is a message serialized before it is sent, so that sending
// it costs no marshalling; preEncodedCodec passes it through as it is.
type preEncoded []byte

// preEncodedCodec is the proto codec, but for a preEncoded message.
type preEncodedCodec struct{}

func (preEncodedCodec) Marshal(v any) (mem.BufferSlice, error) {
	if b, ok := v.(preEncoded); ok {
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	return encoding.GetCodecV2(grpcproto.Name).Marshal(v)
}

func (preEncodedCodec) Unmarshal(data mem.BufferSlice, v any) error {
	return encoding.GetCodecV2(grpcproto.Name).Unmarshal(data, v)
}

func (preEncodedCodec) Name() string { return grpcproto.Name }

// HostileOptions configure MeasureHostile.
type HostileOptions struct {
	Target HostileTarget
	// PID is the server's process, whose CPU time and VmRSS are read
	// from /proc; 0: neither is measured.
	PID int
	// Repeat is how many times each input is sent, one after another.
	// Default 5.
	Repeat int
}

// HostileResult is what sending one hostile input Repeat times cost.
type HostileResult struct {
	Input   Hostile
	Answers []Answer // one per send, in order
	// CPUTicks is the server's CPU time (user+system) over all the
	// sends, in clock ticks of Tick; CPUErr says why it was not read.
	CPUTicks int64
	Tick     time.Duration
	CPUErr   error
	// RSS is the server's VmRSS before the first send and its peak over
	// reads every 10ms until the last was answered.
	RSS RSS
}

// MeasureHostile sends h o.Repeat times, one after another, and reads
// what o.PID spent on them from /proc: CPU time before the first and
// after the last, and VmRSS every 10ms (WatchRSS, with no settling).
func MeasureHostile(ctx context.Context, o HostileOptions, h Hostile) HostileResult {
	if o.Repeat == 0 {
		o.Repeat = 5
	}
	r := HostileResult{Input: h, Tick: ClockTick()}
	send := func() {
		var before int64
		if o.PID != 0 {
			before, r.CPUErr = ReadCPUTicks(o.PID)
		}
		for range o.Repeat {
			r.Answers = append(r.Answers, o.Target.Send(ctx, h))
		}
		if o.PID != 0 && r.CPUErr == nil {
			var after int64
			after, r.CPUErr = ReadCPUTicks(o.PID)
			r.CPUTicks = after - before
		}
	}
	if o.PID == 0 {
		send()
		return r
	}
	r.RSS = WatchRSS(ctx, o.PID, 10*time.Millisecond, 0, send)
	return r
}

// CPUPerRequest is the server's CPU time per send.
func (r HostileResult) CPUPerRequest() time.Duration {
	return time.Duration(r.CPUTicks) * r.Tick / time.Duration(max(1, len(r.Answers)))
}

// Targets the issue set for a hostile input: what one may cost the
// server.
const (
	HostileCPUTarget       = 50 * time.Millisecond // CPU per request
	HostileMemoryTarget    = 2.0                   // peak RSS growth ÷ the input's size
	HostileLatencyP99Ratio = 2.0                   // good traffic's p99 beside them ÷ alone
)

// Print writes the result: the answers, latency, CPU and memory, each
// against its target.
func (r HostileResult) Print(w io.Writer) {
	h := r.Input
	fmt.Fprintf(w, "%-9s %s bytes: %s\n", h.Name, humanize.Comma(int64(h.Size())), h.Desc)
	type answer struct{ code, msg string }
	var order []answer
	count := map[answer]int{}
	lat := make([]time.Duration, 0, len(r.Answers))
	for _, a := range r.Answers {
		k := answer{a.Code, a.Message}
		if count[k] == 0 {
			order = append(order, k)
		}
		count[k]++
		lat = append(lat, a.Latency)
	}
	for _, k := range order {
		fmt.Fprintf(w, "  answer   %d× %s: %s\n", count[k], k.code, k.msg)
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		fmt.Fprintf(w, "  latency  min %s  median %s  max %s (client side)\n",
			ms(lat[0]), ms(lat[len(lat)/2]), ms(lat[len(lat)-1]))
	}
	switch {
	case r.RSS.PID == 0 && r.CPUErr == nil:
		fmt.Fprintf(w, "  cpu, rss not measured: no server pid\n")
		return
	case r.CPUErr != nil:
		fmt.Fprintf(w, "  cpu      not measured: %v\n", r.CPUErr)
	default:
		per := r.CPUPerRequest()
		fmt.Fprintf(w, "  cpu      %s per request: %d ticks over %d sends; a tick is %s, so ±%s per request  [target < %s: %s]\n",
			ms(per), r.CPUTicks, len(r.Answers), r.Tick, ms(r.Tick/time.Duration(max(1, len(r.Answers)))),
			HostileCPUTarget, met(per < HostileCPUTarget))
	}
	if r.RSS.Before == 0 || r.RSS.Peak == 0 {
		fmt.Fprintf(w, "  rss      not measured: %v\n", r.RSS.Err)
		return
	}
	grew := r.RSS.Peak - r.RSS.Before
	ratio := float64(grew) / float64(max(1, h.Size()))
	fmt.Fprintf(w, "  rss      before %s, peak %s over %d reads: %s, %.2f× the input  [target < %g×: %s]\n",
		mib(r.RSS.Before), mib(r.RSS.Peak), r.RSS.Samples, signedBytes(grew), ratio, HostileMemoryTarget, met(ratio < HostileMemoryTarget))
	if r.RSS.Err != nil {
		fmt.Fprintf(w, "  rss      sampling stopped: %v\n", r.RSS.Err)
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/1e6) }

func mib(b int64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }

// signedBytes is b in KiB or MiB, with its sign.
func signedBytes(b int64) string {
	if b > -(1<<20) && b < 1<<20 {
		return fmt.Sprintf("%+dKiB", b>>10)
	}
	return fmt.Sprintf("%+.1fMiB", float64(b)/(1<<20))
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

// HostileTally counts the hostile requests sent beside a load run: by
// input, by answer code. A request still in flight when the run ended
// is counted under "cut short".
type HostileTally map[string]map[string]int

func (t HostileTally) add(input, code string) {
	if t[input] == nil {
		t[input] = map[string]int{}
	}
	t[input][code]++
}

// Sent is the number of hostile requests sent, all inputs.
func (t HostileTally) Sent() int {
	n := 0
	for input := range t {
		n += t.sent(input)
	}
	return n
}

// sent is how many of input were sent.
func (t HostileTally) sent(input string) int {
	n := 0
	for _, c := range t[input] {
		n += c
	}
	return n
}

// Print writes one line per input, in the order given.
func (t HostileTally) Print(w io.Writer, inputs []Hostile) {
	for _, h := range inputs {
		fmt.Fprintf(w, "  %-9s sent %d: %s\n", h.Name, t.sent(h.Name), countList(t[h.Name]))
	}
}

// Beside runs the closed-loop load o while one goroutine sends inputs to
// t in turn, one at a time, back to back, until the load ends; the
// request in flight then is cancelled. It returns the load's result and
// what was sent beside it.
func Beside(ctx context.Context, o LoadOptions, t HostileTarget, inputs []Hostile) (Result, HostileTally) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tally := HostileTally{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		// The first is sent whenever the load ends, so that a tally is
		// never empty.
		for i := 0; len(inputs) > 0; i++ {
			h := inputs[i%len(inputs)]
			a := t.Send(ctx, h)
			if ctx.Err() != nil {
				tally.add(h.Name, "cut short")
				return
			}
			tally.add(h.Name, a.Code)
		}
	}()
	res := Run(ctx, o)
	cancel()
	wg.Wait()
	return res, tally
}
