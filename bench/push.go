package bench

import (
	"context"
	crand "crypto/rand"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/cumulus-serving/cumulus/pushpb"
	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// PushOptions configure a push run: Producers streams, each sending Rate
// batches a second of Keys rows for Duration, to a push API; Routers
// are watched for every batch's probe.
type PushOptions struct {
	Client    pushpb.PushClient
	Token     string
	Model     string
	Routers   []Inferer
	Producers int           // default 1
	Rate      float64       // batches a second per producer; default 10
	Keys      int           // rows per batch, the probe included; default 1,000
	KeySpace  uint64        // ids drawn from [0, KeySpace); default 10,000,000
	Duration  time.Duration // default 60s
	// Timeout: a batch not answered and served by every router this long
	// after it was sent counts as failed. Default 30s.
	Timeout time.Duration
	Seed    uint64
}

// PushBatchTimes are one batch's times from when it was sent.
type PushBatchTimes struct {
	Answered time.Duration
	Served   time.Duration // by every router (0: not seen in time)
	Err      string
}

// PushResult is a push run's outcome.
type PushResult struct {
	Batches  []PushBatchTimes
	Keys     int64 // rows in answered batches
	Elapsed  time.Duration
	Versions int // distinct deltas answered
}

// pushProbeBase is where probe ids start: each batch carries one probe
// feature of its own (a run's base above it, plus its index), whose score tells when a
// router serves the batch (outside any generated model's ids).
const pushProbeBase = 1 << 62

type probe struct {
	id   uint64
	w    float32
	sent time.Time
	idx  int
}

// Push runs the push load and waits for every batch to be answered and
// served (or to time out).
func Push(ctx context.Context, o PushOptions, progress io.Writer) (PushResult, error) {
	o.Producers = max(o.Producers, 1)
	if o.Rate <= 0 {
		o.Rate = 10
	}
	if o.Keys <= 0 {
		o.Keys = 1000
	}
	if o.KeySpace == 0 {
		o.KeySpace = 10_000_000
	}
	if o.Duration <= 0 {
		o.Duration = time.Minute
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	bias, err := pushBias(ctx, o.Routers[0], o.Model)
	if err != nil {
		return PushResult{}, err
	}
	perProducer := int(o.Rate * o.Duration.Seconds())
	total := perProducer * o.Producers
	res := PushResult{Batches: make([]PushBatchTimes, total)}
	var mu sync.Mutex
	var probes []probe // sent, not yet served by every router
	served := make([][]bool, len(o.Routers))
	for r := range served {
		served[r] = make([]bool, total)
	}
	versions := map[uint64]bool{}
	ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+o.Token)
	run := crand.Text()[:8] // producers of their own: a run numbers from 1
	// Probe ids of its own too: a repository pushed to before holds the
	// last run's probes, with the same weights.
	probes0 := pushProbeBase + (uint64(time.Now().UnixNano())%(1<<20))<<24
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, o.Producers)
	for p := range o.Producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := o.Client.Send(ctx)
			if err != nil {
				errs <- err
				return
			}
			sent := make([]time.Time, perProducer)
			done := make(chan struct{})
			go func() {
				defer close(done)
				for i := range perProducer {
					ack, err := st.Recv()
					if err != nil {
						errs <- fmt.Errorf("producer %d: %w", p, err)
						return
					}
					idx := p*perProducer + i
					mu.Lock()
					res.Batches[idx].Answered = time.Since(sent[ack.Sequence-1])
					if ack.Code != 0 {
						res.Batches[idx].Err = ack.Error
					} else {
						res.Keys += int64(o.Keys)
						versions[ack.Version] = true
					}
					mu.Unlock()
				}
			}()
			rng := rand.New(rand.NewPCG(o.Seed, uint64(p)))
			tick := time.NewTicker(time.Duration(float64(time.Second) / o.Rate))
			defer tick.Stop()
			for i := range perProducer {
				idx := p*perProducer + i
				b := &pushpb.Batch{Model: o.Model, Producer: fmt.Sprintf("bench-%s-%d", run, p), Sequence: uint64(i + 1),
					Ids: make([]uint64, o.Keys), Values: make([]float32, o.Keys)}
				pr := probe{id: probes0 + uint64(idx), w: float32(idx%4096+1) / 64, idx: idx}
				b.Ids[0], b.Values[0] = pr.id, pr.w
				for k := 1; k < o.Keys; k++ {
					b.Ids[k], b.Values[k] = rng.Uint64N(o.KeySpace), float32(rng.NormFloat64()*0.01)
				}
				pr.sent = time.Now()
				mu.Lock()
				sent[i] = pr.sent
				probes = append(probes, pr)
				mu.Unlock()
				if err := st.Send(b); err != nil {
					errs <- fmt.Errorf("producer %d: %w", p, err)
					return
				}
				select {
				case <-tick.C:
				case <-ctx.Done():
					return
				}
			}
			st.CloseSend()
			<-done
		}()
	}
	// Watch the routers: every pending probe, each round, as rows of one
	// request per router.
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		sendersDone := make(chan struct{})
		go func() { wg.Wait(); close(sendersDone) }()
		finished := false
		for {
			select {
			case <-sendersDone:
				finished = true
			default:
			}
			mu.Lock()
			pending := slices.Clone(probes)
			mu.Unlock()
			if finished && len(pending) == 0 {
				return
			}
			now := time.Now()
			for r, router := range o.Routers {
				scores, err := probeScores(ctx, router, o.Model, pending)
				if err != nil {
					continue
				}
				for i, pr := range pending {
					if math.Abs(float64(scores[i])-sigmoid(bias+float64(pr.w))) < 1e-6 {
						served[r][pr.idx] = true
					}
				}
			}
			mu.Lock()
			probes = slices.DeleteFunc(probes, func(pr probe) bool {
				all := true
				for r := range o.Routers {
					all = all && served[r][pr.idx]
				}
				switch {
				case all:
					res.Batches[pr.idx].Served = now.Sub(pr.sent)
					return true
				case now.Sub(pr.sent) > o.Timeout:
					return true
				}
				return false
			})
			mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	wg.Wait()
	<-watchDone
	res.Elapsed = time.Since(start)
	res.Versions = len(versions)
	select {
	case err := <-errs:
		return res, err
	default:
	}
	return res, ctx.Err()
}

func sigmoid(x float64) float64 { return 1 / (1 + math.Exp(-x)) }

// pushBias reads a model's bias from a router: the score of a row with
// no feature it holds.
func pushBias(ctx context.Context, client Inferer, model string) (float64, error) {
	s, err := probeScores(ctx, client, model, []probe{{id: pushProbeBase - 1}})
	if err != nil {
		return 0, err
	}
	return math.Log(float64(s[0]) / (1 - float64(s[0]))), nil
}

// probeScores asks client for each probe's score, one row each.
func probeScores(ctx context.Context, client Inferer, model string, ps []probe) ([]float32, error) {
	ids := make([]uint64, len(ps))
	splits := make([]uint64, len(ps)+1)
	for i, p := range ps {
		ids[i], splits[i+1] = p.id, uint64(i+1)
	}
	req := &kservepb.ModelInferRequest{ModelName: model}
	for _, t := range []struct {
		name, dt string
		raw      []byte
	}{{"ids", "UINT64", RawUint64(ids)}, {"row_splits", "INT64", RawUint64(splits)}} {
		req.Inputs = append(req.Inputs, &kservepb.ModelInferRequest_InferInputTensor{Name: t.name, Datatype: t.dt, Shape: []int64{int64(len(t.raw) / 8)}})
		req.RawInputContents = append(req.RawInputContents, t.raw)
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	resp, err := client.ModelInfer(cctx, req)
	if err != nil {
		return nil, err
	}
	s, err := Scores(resp)
	if err == nil && len(s) != len(ps) {
		err = fmt.Errorf("bench: %d scores for %d rows", len(s), len(ps))
	}
	return s, err
}

// PushSummary summarizes a push run.
type PushSummary struct {
	Batches, Answered, Refused, Served, Late int // Late: served (or not) later than 2s after sent
	KeysPerSecond                            float64
	AnswerP50, AnswerP99, AnswerMax          time.Duration
	ServedP50, ServedP99, ServedMax          time.Duration
	FirstError                               string
}

// Summarize is the run's distribution of answer and served times.
func (r PushResult) Summarize() PushSummary {
	s := PushSummary{Batches: len(r.Batches), KeysPerSecond: float64(r.Keys) / r.Elapsed.Seconds()}
	var answered, served []time.Duration
	for _, b := range r.Batches {
		switch {
		case b.Err != "":
			s.Refused++
			if s.FirstError == "" {
				s.FirstError = b.Err
			}
		case b.Answered > 0:
			s.Answered++
			answered = append(answered, b.Answered)
		}
		if b.Served > 0 {
			s.Served++
			served = append(served, b.Served)
		}
		if b.Served == 0 || b.Served > 2*time.Second {
			s.Late++
		}
	}
	slices.Sort(answered)
	slices.Sort(served)
	if len(answered) > 0 {
		s.AnswerP50, s.AnswerP99, s.AnswerMax = quantile(answered, 0.5), quantile(answered, 0.99), answered[len(answered)-1]
	}
	if len(served) > 0 {
		s.ServedP50, s.ServedP99, s.ServedMax = quantile(served, 0.5), quantile(served, 0.99), served[len(served)-1]
	}
	return s
}
