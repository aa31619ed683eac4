package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/manager"
	"github.com/cumulus-serving/cumulus/pushpb"
)

// pushTokenEnv names the environment variable holding the push token.
const pushTokenEnv = "CUMULUS_PUSH_TOKEN"

// pushTokenFlags are the push token's flags, for the servers and the
// client alike.
type pushTokenFlags struct{ token, tokenFile string }

func (f *pushTokenFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.token, "push-token", "", "push API bearer token (else --push-token-file, else $"+pushTokenEnv+")")
	fs.StringVar(&f.tokenFile, "push-token-file", "", "file holding the push API token")
}

func (f *pushTokenFlags) resolve() (string, error) {
	return bearerToken(f.token, f.tokenFile, "--push-token-file", pushTokenEnv)
}

// pushServeFlags configure a manager's push API (manager and dev).
type pushServeFlags struct {
	unpacked bool
	addr     string
	tok      pushTokenFlags
	window   time.Duration
	ttl      time.Duration
	maxProd  int
	maxBytes byteSize
	pending  byteSize
	recv     byteSize
}

func (f *pushServeFlags) register(cmd *cobra.Command, defaultAddr string) {
	fs := cmd.Flags()
	what := "the push API's address: trainers push rows there (gRPC cumulus.push.v1.Push and POST /push/v1/models/NAME); served by the leading manager"
	if defaultAddr == "" {
		what += " (default: off)"
	}
	fs.StringVar(&f.addr, "push-addr", defaultAddr, what)
	f.tok.register(fs)
	fs.DurationVar(&f.window, "push-window", time.Second, "how long pushes gather before they are sealed into a delta")
	fs.DurationVar(&f.ttl, "push-producer-ttl", 24*time.Hour, "a push producer idle this long is forgotten (it numbers from 1 again)")
	fs.IntVar(&f.maxProd, "max-push-producers", 1024, "push producers kept per model")
	f.maxBytes = 16 << 20
	fs.Var(&f.maxBytes, "max-push-bytes", "largest push batch (its encoding)")
	fs.Var(&f.recv, "max-push-receiving-bytes", "bytes of push batches received and decoded at once, over every connection: past it an HTTP batch gets 429 and a gRPC stream waits (default 4 × --max-push-bytes)")
	f.pending = 256 << 20
	fs.BoolVar(&f.unpacked, "push-unpacked", false, "seal each window as a file per partition it touches (manifest format 2), which shards of builds before format 3 read, rather than as one file: while upgrading a cluster from such builds (shards first)")
	fs.Var(&f.pending, "max-pending-push-bytes", "per model: the most its pushes may weigh while a pin or a canary holds them (one pending delta, served once the hold ends); past it, pushes are refused (429)")
}

// options are the push API's options (ok false: not served). A push
// token that is the admin token is refused: a trainer must not be able
// to roll back, nor an operator's token to push.
func (f *pushServeFlags) options(adminToken string, reg prometheus.Registerer) (opts manager.PushOptions, ok bool, err error) {
	if f.addr == "" {
		return opts, false, nil
	}
	token, err := f.tok.resolve()
	switch {
	case err != nil:
		return opts, false, err
	case token == "":
		return opts, false, errors.New("--push-addr needs a push token: give --push-token, --push-token-file or $" + pushTokenEnv)
	case token == adminToken:
		return opts, false, errors.New("the push token is the admin token: give the push API a token of its own (a trainer must not be able to roll back)")
	}
	return manager.PushOptions{Addr: f.addr, Token: token, Window: f.window, MaxBatchBytes: int64(f.maxBytes), MaxPendingBytes: int64(f.pending), MaxReceiving: int64(f.recv), Registry: reg, Unpacked: f.unpacked}, true, nil
}

// policy sets the manager's bounds on its push producers' marks.
func (f *pushServeFlags) policy(o *manager.Options) {
	o.PushProducerTTL, o.MaxPushProducers = f.ttl, f.maxProd
}

func pushCommand() *cobra.Command {
	var (
		addrs, model, producer string
		deletes                string
		first                  uint64
		rows                   int
		retryFor               time.Duration
		tok                    pushTokenFlags
		tlsf                   tlsFlags
	)
	cmd := &cobra.Command{
		Use:   "push --addr ADDR --model NAME [--deletes IDS] [FILE|-]",
		Short: "Push rows to a model through the managers' push API, in batches",
		Long: `push reads FILE (or standard input) as a TSV model, as 'cumulus model delta
--upserts' does (docs/model-format.md), and pushes its rows to the leading
manager's push API in batches of --batch-rows, as producer --producer
numbering its batches from --first-sequence; --deletes IDS, a file of
feature ids one per line, removes them in batches after the rows (FILE
may then be left out).
Each batch is answered once
the delta holding it is published; a batch the leader could not seal, or
sent to a manager that does not lead, is sent again (to the next --addr)
for up to --retry-for: the leader's sequences make it count once.
The token comes from --push-token, --push-token-file or $` + pushTokenEnv + `.`,
		Args: cobra.RangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 && deletes == "" {
				return errors.New("give a FILE of rows (or - for standard input), --deletes, or both")
			}
			token, err := tok.resolve()
			if err != nil {
				return err
			}
			if token == "" {
				return errors.New("no push token: give --push-token, --push-token-file or $" + pushTokenEnv)
			}
			if !codec.ValidName(model) {
				return fmt.Errorf("--model %q is not a model name", model)
			}
			if producer == "" {
				host, _ := os.Hostname()
				producer = fmt.Sprintf("push-%s-%d-%s", host, os.Getpid(), rand.Text()[:6])
			}
			if !codec.ValidProducer(producer) {
				return fmt.Errorf("--producer %q: give 1 to 128 of [A-Za-z0-9._:-]", producer)
			}
			if rows < 1 || first < 1 {
				return errors.New("--batch-rows and --first-sequence must be at least 1")
			}
			s := &loader.Sparse{}
			if len(args) == 1 {
				in := io.Reader(os.Stdin)
				if args[0] != "-" {
					f, err := os.Open(args[0])
					if err != nil {
						return err
					}
					defer f.Close()
					in = f
				}
				if s, err = loader.ParseTSV(in); err != nil {
					return fmt.Errorf("%s: %w", args[0], err)
				}
			}
			var dels []uint64
			if deletes != "" {
				if dels, err = readIDs(deletes); err != nil {
					return err
				}
			}
			if s.HasBias {
				return fmt.Errorf("%s names a bias: pushes carry rows only; publish a new bias with 'cumulus model delta --bias'", args[0])
			}
			w := 1 // no rows: no width
			if len(s.Keys) > 0 {
				w = s.Width()
			}
			var batches []*pushpb.Batch
			for i := 0; i < len(s.Keys); i += rows {
				j := min(i+rows, len(s.Keys))
				batches = append(batches, &pushpb.Batch{Model: model, Producer: producer, Sequence: first + uint64(len(batches)),
					Ids: s.Keys[i:j], Values: s.Values[i*w : j*w]})
			}
			for i := 0; i < len(dels); i += rows {
				batches = append(batches, &pushpb.Batch{Model: model, Producer: producer, Sequence: first + uint64(len(batches)),
					Deletes: dels[i:min(i+rows, len(dels))]})
			}
			if len(batches) == 0 {
				return errors.New("nothing to push: no rows, no deletions")
			}
			p := &pusher{addrs: strings.Split(addrs, ","), token: token, tlsf: tlsf, retryFor: retryFor}
			if fi, err := os.Stderr.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
				p.bar = progressbar.NewOptions(len(batches), progressbar.OptionSetDescription("batches"), progressbar.OptionSetWriter(os.Stderr),
					progressbar.OptionShowCount(), progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionFullWidth())
			}
			version, err := p.push(cmd.Context(), batches)
			if p.bar != nil {
				p.bar.Finish()
				fmt.Fprintln(os.Stderr)
			}
			if err != nil {
				return err
			}
			fmt.Printf("pushed %d rows and %d deletions in %d batches to %s as producer %s (sequences %d to %d)", len(s.Keys), len(dels), len(batches), model, producer, first, first+uint64(len(batches))-1)
			if p.duplicates > 0 {
				fmt.Printf("; %d of them were sealed before (duplicates: not applied again)", p.duplicates)
			}
			if version != 0 {
				fmt.Printf("; newest delta: version %d (published; served once it is live: cumulus admin show %s)", version, model)
			}
			fmt.Println()
			return nil
		},
	}
	cmd.Flags().StringVar(&addrs, "addr", "127.0.0.1:8003", "push API address of the managers (comma-separated: tried in turn until one leads)")
	cmd.Flags().StringVar(&model, "model", "", "the model to push to (required)")
	cmd.Flags().StringVar(&deletes, "deletes", "", "file of feature ids to delete, one per line")
	cmd.Flags().StringVar(&producer, "producer", "", "this producer's ID (default: push-HOST-PID-RANDOM); give the same one to resume its sequence")
	cmd.Flags().Uint64Var(&first, "first-sequence", 1, "sequence of the first batch")
	cmd.Flags().IntVar(&rows, "batch-rows", 10_000, "rows per batch")
	cmd.Flags().DurationVar(&retryFor, "retry-for", 30*time.Second, "keep sending batches that were not sealed for this long")
	tok.register(cmd.Flags())
	tlsf.registerClient(cmd.Flags(), "this client (to managers started with --tls-*)")
	cmd.MarkFlagRequired("model")
	return cmd
}

// pusher sends batches over one gRPC stream at a time, moving to the
// next address and sending again what was not answered when a stream
// fails or a batch is answered Unavailable.
type pusher struct {
	addrs    []string
	token    string
	tlsf     tlsFlags
	retryFor time.Duration
	bar      *progressbar.ProgressBar
	// acked, if set, is called with each batch answered OK.
	acked func(*pushpb.Ack)
	// duplicates counts the batches answered as sealed before.
	duplicates int
}

// maxUnanswered bounds the batches a pusher has sent and not had
// answered.
const maxUnanswered = 32

func (p *pusher) push(ctx context.Context, batches []*pushpb.Batch) (newest uint64, err error) {
	deadline := time.Now().Add(p.retryFor)
	next := 0 // batches[:next] are answered
	for try := 0; next < len(batches); try++ {
		addr := p.addrs[try%len(p.addrs)]
		done, v, err := p.stream(ctx, addr, batches[next:])
		next += done
		newest = max(newest, v)
		if err == nil || next == len(batches) {
			continue // all answered (an error closing the stream after the last answer changes nothing)
		}
		if c := status.Code(err); c != codes.Unavailable && c != codes.Canceled || time.Now().After(deadline) || ctx.Err() != nil {
			return newest, fmt.Errorf("%s: %w", addr, tlsHint(err, p.tlsf))
		}
		fmt.Fprintf(os.Stderr, "push: %s: %v; sending from sequence %d again\n", addr, status.Convert(err).Message(), batches[next].Sequence)
		select {
		case <-ctx.Done():
			return newest, ctx.Err()
		case <-time.After(min(100*time.Millisecond*time.Duration(try+1), 250*time.Millisecond)):
			// Short: a new leader takes over within a second or two, and
			// the addresses are tried in turn.
		}
	}
	return newest, nil
}

// stream sends batches over one stream, returning how many of them, from
// the first, were answered OK.
func (p *pusher) stream(ctx context.Context, addr string, batches []*pushpb.Batch) (answered int, newest uint64, err error) {
	creds, err := p.tlsf.grpcCreds(ctx, addr)
	if err != nil {
		return 0, 0, err
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+p.token))
	defer cancel()
	st, err := pushpb.NewPushClient(conn).Send(ctx)
	if err != nil {
		return 0, 0, err
	}
	window := make(chan struct{}, maxUnanswered)
	sendErr := make(chan error, 1)
	go func() {
		for _, b := range batches {
			select {
			case window <- struct{}{}:
			case <-ctx.Done():
				sendErr <- ctx.Err()
				return
			}
			if err := st.Send(b); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- st.CloseSend()
	}()
	for answered < len(batches) {
		ack, err := st.Recv()
		if err != nil {
			return answered, newest, err
		}
		<-window
		if ack.Code != 0 {
			return answered, newest, status.Error(codes.Code(ack.Code), fmt.Sprintf("batch %d: %s", ack.Sequence, ack.Error))
		}
		if ack.Sequence != batches[answered].Sequence {
			return answered, newest, fmt.Errorf("push: answer for sequence %d, expected %d", ack.Sequence, batches[answered].Sequence)
		}
		answered++
		newest = max(newest, ack.Version)
		if ack.Duplicate {
			p.duplicates++
		}
		if p.bar != nil {
			p.bar.Add(1)
		}
		if p.acked != nil {
			p.acked(ack)
		}
	}
	if err := <-sendErr; err != nil && err != io.EOF {
		return answered, newest, err
	}
	return answered, newest, nil
}
