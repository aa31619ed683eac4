package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/pushpb"
)

func benchPushCommand() *cobra.Command {
	var (
		pushAddr, routers string
		tok               pushTokenFlags
		o                 bench.PushOptions
	)
	cmd := &cobra.Command{
		Use:   "push --push-addr ADDR --routers GRPC,... --model NAME",
		Short: "Measure online updates: push batches at a rate and time each until it is answered and served by every router",
		Long: `push streams --rate batches a second of --keys rows each from --producers
producers to a push API (an LR model's rows: one value each) for
--duration. Each batch carries a probe feature of its own; every router in
--routers (gRPC) is asked for the pending probes' scores every few
milliseconds, and a batch counts as served once every router scores its
probe as σ(bias + its weight). It prints the answer and served times from
when each batch was sent.

Targets (issue 31): 10 batches a second of 1,000 keys, each served by
every router ≤ 2s after it was sent (p99); ≥ 1,000,000 keys a second with
the answer's p99 ≤ 2s.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			token, err := tok.resolve()
			if err != nil {
				return err
			}
			conn, err := grpc.NewClient(pushAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return err
			}
			defer conn.Close()
			o.Client, o.Token = pushpb.NewPushClient(conn), token
			var closeRouters func()
			if o.Routers, closeRouters, err = routerClients(routers); err != nil {
				return err
			}
			defer closeRouters()
			fmt.Printf("pushing %d producer(s) × %.0f batches/s × %d keys to %s for %s; %d router(s)\n", max(o.Producers, 1), o.Rate, o.Keys, o.Model, o.Duration, len(o.Routers))
			r, err := bench.Push(cmd.Context(), o, os.Stdout)
			s := r.Summarize()
			ms := func(d time.Duration) string { return d.Round(time.Millisecond).String() }
			fmt.Printf("batches: %d sent, %d answered, %d refused; %d deltas; %.0f keys/s answered\n", s.Batches, s.Answered, s.Refused, r.Versions, s.KeysPerSecond)
			fmt.Printf("answered after: p50 %s, p99 %s, max %s\n", ms(s.AnswerP50), ms(s.AnswerP99), ms(s.AnswerMax))
			fmt.Printf("served by every router after: p50 %s, p99 %s, max %s; %d of %d served, %d not within 2s\n", ms(s.ServedP50), ms(s.ServedP99), ms(s.ServedMax), s.Served, s.Batches, s.Late)
			if s.FirstError != "" {
				fmt.Printf("first refusal: %s\n", s.FirstError)
			}
			return err
		},
	}
	cmd.Flags().StringVar(&pushAddr, "push-addr", "127.0.0.1:8003", "the leading manager's push API")
	cmd.Flags().StringVar(&routers, "routers", "127.0.0.1:8001", "routers' gRPC addresses, comma-separated")
	cmd.Flags().StringVar(&o.Model, "model", "", "an LR model (required)")
	cmd.Flags().IntVar(&o.Producers, "producers", 1, "producers, each its own stream")
	cmd.Flags().Float64Var(&o.Rate, "rate", 10, "batches a second per producer")
	cmd.Flags().IntVar(&o.Keys, "keys", 1000, "rows per batch")
	cmd.Flags().Uint64Var(&o.KeySpace, "key-space", 10_000_000, "ids are drawn from [0, key-space)")
	cmd.Flags().DurationVar(&o.Duration, "duration", time.Minute, "how long to push")
	tok.register(cmd.Flags())
	cmd.MarkFlagRequired("model")
	return cmd
}
