package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/loader"
)

func benchRequestCommand() *cobra.Command {
	var repo, model, workload string
	var seed uint64
	cmd := &cobra.Command{
		Use:   "request",
		Short: "Write one request of a workload, serialized, for other load tools (ghz --binary-file)",
		Long: `request writes to stdout one KServe v2 ModelInferRequest of --workload
for a model 'cumulus model gen' made (its newest version in --repo),
serialized as protobuf: what ghz's --binary-file and grpcurl take.

  cumulus bench request --repo models --model bench > rank200.bin
  ghz --insecure --call inference.GRPCInferenceService/ModelInfer \
      --binary-file rank200.bin -c 4 -n 6000 127.0.0.1:8001`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if repo == "" || model == "" {
				return errors.New("--repo and --model are required")
			}
			w, ok := bench.Workloads[workload]
			if !ok {
				return fmt.Errorf("unknown workload %q (have rank200, small)", workload)
			}
			r := loader.Repo{Dir: repo}
			v, err := r.Latest(model)
			if err != nil {
				return err
			}
			m, err := r.Manifest(model, v)
			if err != nil {
				return err
			}
			g, err := bench.ForModel(w, m, seed)
			if err != nil {
				return err
			}
			b, err := proto.Marshal(g.Request(model))
			if err != nil {
				return err
			}
			_, err = os.Stdout.Write(b)
			return err
		},
	}
	cmd.Flags().StringVar(&repo, "repo", "", "model repository directory (required)")
	cmd.Flags().StringVar(&model, "model", "", "model name (required; made by cumulus model gen)")
	cmd.Flags().StringVar(&workload, "workload", "rank200", "rank200 or small")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "seed of the ids drawn")
	return cmd
}
