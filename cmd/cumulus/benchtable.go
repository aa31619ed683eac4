package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/cumulus-serving/cumulus/bench"
)

func benchTableCommand() *cobra.Command {
	var o bench.StoreOptions
	cmd := &cobra.Command{
		Use:   "table",
		Short: "Compare the shard table with a Go map and Redis MGET: bytes/param and batched ns/key",
		Long: `table builds, in one process and one run, the shard's compact table and a
Go map[uint64]float32 over the same --params hashed feature ids, and loads
--redis-params of them into a redis-server it starts on loopback. It times
batched lookups of --batch keys drawn Zipf(1.1) and uniformly over the
features, and prints memory per parameter, time per key, batch p50/p99 and
the ratios against the table. The table and the map take turns over the
same batches --rounds times, so a noisy spell on a shared machine falls on
both; each reports its median round. Redis runs once, after them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rs, err := bench.CompareStores(cmd.Context(), o, os.Stderr)
			if len(rs) > 0 {
				bench.PrintStores(os.Stdout, rs, o.Batch)
			}
			return err
		},
	}
	cmd.Flags().IntVar(&o.Params, "params", 10_000_000, "features in the table and the Go map")
	cmd.Flags().IntVar(&o.RedisParams, "redis-params", 1_000_000, "features loaded into Redis")
	cmd.Flags().BoolVar(&o.NoRedis, "no-redis", false, "skip the Redis baseline")
	cmd.Flags().IntVar(&o.Batch, "batch", 20_000, "keys per batched lookup")
	cmd.Flags().IntVar(&o.Batches, "batches", 200, "batches timed per store and distribution")
	cmd.Flags().IntVar(&o.Rounds, "rounds", 5, "turns the table and the Go map take over the batches; each reports its median round")
	cmd.Flags().Uint64Var(&o.Seed, "seed", 1, "random seed")
	return cmd
}
