package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/cumulus-serving/cumulus/bench"
)

type overBudgetFlags struct {
	params, batch, batches, warm int
	ratio                        float64
	seed                         uint64
	overhead                     byteSize
}

func benchOverBudgetCommand() *cobra.Command {
	var f overBudgetFlags
	f.overhead = 48 << 20
	cmd := &cobra.Command{
		Use:   "overbudget",
		Short: "Lookup latency from a partition several times larger than the memory it may use",
		Long: `overbudget writes one partition of --params LR features, times batched lookups
on it held resident (the baseline), then evicts it from the page cache and
times the same lookups from a child process that serves it from a mapped
file inside a cgroup whose memory limit is the partition's size / --ratio
(plus --overhead for the process itself), so the kernel must keep only
the hot pages; then again with a hot tier (the budget's worth of the
hottest records, learned from the warm batches) above the mapping. Needs
root and the cgroup v1 memory controller.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir, err := os.MkdirTemp("", "cumulus-overbudget-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			path := filepath.Join(dir, "part.bin")
			fmt.Fprintf(os.Stderr, "writing a partition of %d features\n", f.params)
			size, err := bench.WriteBenchPartition(path, f.params, f.seed)
			if err != nil {
				return err
			}
			base, err := bench.MappedLookups(path, f.params, f.seed, bench.Resident, 0, f.batch, f.batches, 5)
			if err != nil {
				return err
			}
			if err := bench.DropFromPageCache(path); err != nil {
				return err
			}
			budget := int64(float64(size) / f.ratio)
			// Each constrained run gets a fresh cgroup and a cold page cache.
			constrained := func(mode string) ([]bench.LookupLatency, int64, error) {
				if err := bench.DropFromPageCache(path); err != nil {
					return nil, 0, err
				}
				cg, err := bench.NewMemoryCgroup(budget + int64(f.overhead))
				if err != nil {
					return nil, 0, err
				}
				defer cg.Remove()
				exe, _ := os.Executable()
				child := exec.CommandContext(cmd.Context(), exe, "bench", "overbudget-child", "--file", path, "--cgroup", cg.Dir,
					"--mode", mode, "--hot-bytes", strconv.FormatInt(budget, 10),
					"--params", strconv.Itoa(f.params), "--seed", strconv.FormatUint(f.seed, 10),
					"--batch", strconv.Itoa(f.batch), "--batches", strconv.Itoa(f.batches), "--warm", strconv.Itoa(f.warm))
				var out bytes.Buffer
				child.Stdout, child.Stderr = &out, os.Stderr
				if err := child.Run(); err != nil {
					return nil, 0, fmt.Errorf("overbudget child (%s): %w", mode, err)
				}
				ls, err := bench.DecodeLatencies(out.Bytes())
				return ls, cg.MaxUsage(), err
			}
			mapped, peakMapped, err := constrained("mapped")
			if err != nil {
				return err
			}
			tiered, peakTiered, err := constrained("hot")
			if err != nil {
				return err
			}
			fmt.Printf("partition %s (%d features); budget %s = 1/%.1f of it; cgroup limit %s; cgroup peak charge: mapped %s, hot tier %s\n",
				humanize.IBytes(uint64(size)), f.params, humanize.IBytes(uint64(budget)), f.ratio,
				humanize.IBytes(uint64(budget+int64(f.overhead))), humanize.IBytes(uint64(peakMapped)), humanize.IBytes(uint64(peakTiered)))
			fmt.Printf("%-30s %-9s %10s %12s %12s\n", "mode", "keys", "ns/key", "batch p50", "batch p99")
			frac := "1/" + strconv.FormatFloat(f.ratio, 'g', 3, 64) + " budget"
			for _, run := range []struct {
				name string
				ls   []bench.LookupLatency
			}{{"resident, no limit", base}, {"mapped, " + frac, mapped}, {"hot tier + mapped, " + frac, tiered}} {
				for _, l := range run.ls {
					fmt.Printf("%-30s %-9s %10.1f %12s %12s\n", run.name, l.Dist, l.NsPerKey, l.P50.Round(time.Microsecond), l.P99.Round(time.Microsecond))
				}
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&f.params, "params", 30_000_000, "features in the partition")
	cmd.Flags().Float64Var(&f.ratio, "ratio", 3, "partition size / memory budget")
	cmd.Flags().IntVar(&f.batch, "batch", 20_000, "keys per batch")
	cmd.Flags().IntVar(&f.batches, "batches", 200, "batches timed per distribution")
	cmd.Flags().IntVar(&f.warm, "warm", 100, "batches run first, untimed, so the page cache settles")
	cmd.Flags().Uint64Var(&f.seed, "seed", 1, "random seed")
	cmd.Flags().Var(&f.overhead, "overhead", "memory allowed to the measuring process beyond the budget")
	return cmd
}

// benchOverBudgetChild runs inside the memory cgroup.
func benchOverBudgetChild() *cobra.Command {
	var f overBudgetFlags
	var file, cgroup, mode string
	var hotBytes int64
	cmd := &cobra.Command{
		Use:    "overbudget-child",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := (&bench.Cgroup{Dir: cgroup}).Join(); err != nil {
				return err
			}
			t := bench.Mapped
			if mode == "hot" {
				t = bench.HotTier
			}
			ls, err := bench.MappedLookups(file, f.params, f.seed, t, hotBytes, f.batch, f.batches, f.warm)
			if err != nil {
				return err
			}
			return bench.EncodeLatencies(os.Stdout, ls)
		},
	}
	cmd.Flags().StringVar(&file, "file", "", "partition file")
	cmd.Flags().StringVar(&cgroup, "cgroup", "", "memory cgroup to join")
	cmd.Flags().StringVar(&mode, "mode", "mapped", "mapped or hot")
	cmd.Flags().Int64Var(&hotBytes, "hot-bytes", 0, "hot tier size")
	cmd.Flags().IntVar(&f.params, "params", 0, "")
	cmd.Flags().Uint64Var(&f.seed, "seed", 1, "")
	cmd.Flags().IntVar(&f.batch, "batch", 20_000, "")
	cmd.Flags().IntVar(&f.batches, "batches", 200, "")
	cmd.Flags().IntVar(&f.warm, "warm", 100, "")
	return cmd
}
