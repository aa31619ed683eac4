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
	"github.com/cumulus-serving/cumulus/shard"
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
		Long: `overbudget writes one partition of --params LR features and times batched
lookups on it, for Zipf 1.1 and uniform keys, four ways:

  resident  all of it in memory, no limit: the baseline;
  mapped    searched through a file mapping, page faults and all (how
            shards served partitions over budget before they read from
            disk);
  disk      as a shard serves a partition over its budget: the directory
            resident, a batch's records read through io_uring (preads
            where the kernel refuses it), a value cache admitting by
            frequency, learned from the warm batches;
  disk, pread  the same with a goroutine in pread a read
            (--disk-reads pread).

The last three run in a child process inside a memory cgroup whose limit is
the partition's size / --ratio (the budget) plus --overhead for the
process itself, with the page cache dropped first: a run the kernel kills
for memory fails the bench. Needs root and the cgroup v1 memory
controller.`,
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
					"--mode", mode, "--budget", strconv.FormatInt(budget, 10),
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
			disk, peakDisk, err := constrained("disk")
			if err != nil {
				return err
			}
			diskPread, peakPread, err := constrained("disk-pread")
			if err != nil {
				return err
			}
			fmt.Printf("partition %s (%d features); budget %s = 1/%g of it; cgroup limit %s; cgroup peak charge (page cache included): mapped %s, disk %s, disk with pread %s; disk reads: %s\n",
				humanize.IBytes(uint64(size)), f.params, humanize.IBytes(uint64(budget)), f.ratio,
				humanize.IBytes(uint64(budget+int64(f.overhead))), humanize.IBytes(uint64(peakMapped)), humanize.IBytes(uint64(peakDisk)), humanize.IBytes(uint64(peakPread)), shard.DiskReadsMode())
			fmt.Printf("%-37s %-9s %10s %12s %12s %9s\n", "mode", "keys", "ns/key", "batch p50", "batch p99", "p99/res.")
			frac := "1/" + strconv.FormatFloat(f.ratio, 'g', 3, 64) + " budget"
			for _, run := range []struct {
				name string
				ls   []bench.LookupLatency
			}{{"resident, no limit", base}, {"mapped, " + frac, mapped}, {"disk + cache, " + frac, disk}, {"disk + cache, pread, " + frac, diskPread}} {
				for i, l := range run.ls {
					fmt.Printf("%-37s %-9s %10.1f %12s %12s %8.2f×\n", run.name, l.Dist, l.NsPerKey, l.P50.Round(time.Microsecond), l.P99.Round(time.Microsecond),
						float64(l.P99)/float64(base[i].P99))
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
	var budget int64
	cmd := &cobra.Command{
		Use:    "overbudget-child",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := (&bench.Cgroup{Dir: cgroup}).Join(); err != nil {
				return err
			}
			t := bench.Mapped
			switch mode {
			case "disk":
				t = bench.Disk
			case "disk-pread":
				t = bench.DiskPread
			}
			ls, err := bench.MappedLookups(file, f.params, f.seed, t, budget, f.batch, f.batches, f.warm)
			if err != nil {
				return err
			}
			return bench.EncodeLatencies(os.Stdout, ls)
		},
	}
	cmd.Flags().StringVar(&file, "file", "", "partition file")
	cmd.Flags().StringVar(&cgroup, "cgroup", "", "memory cgroup to join")
	cmd.Flags().StringVar(&mode, "mode", "mapped", "mapped, disk or disk-pread")
	cmd.Flags().Int64Var(&budget, "budget", 0, "memory budget: the directory and value cache (disk)")
	cmd.Flags().IntVar(&f.params, "params", 0, "")
	cmd.Flags().Uint64Var(&f.seed, "seed", 1, "")
	cmd.Flags().IntVar(&f.batch, "batch", 20_000, "")
	cmd.Flags().IntVar(&f.batches, "batches", 200, "")
	cmd.Flags().IntVar(&f.warm, "warm", 100, "")
	return cmd
}
