package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/cumulus-serving/cumulus/internal/hedge"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/shard"
)

// hedgeFlags are the router's policy against slow shards, for router,
// dev and bench.
type hedgeFlags struct {
	on     bool
	delay  time.Duration
	budget float64
	choice string
}

func (f *hedgeFlags) register(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.on, "hedge", true, "send a shard call not answered after the hedge delay to another replica as well; the first answer wins")
	cmd.Flags().DurationVar(&f.delay, "hedge-delay", 0, "fixed hedge delay (default 0: the p95 latency of the replicas that could take the call over, at least 2ms)")
	cmd.Flags().Float64Var(&f.budget, "hedge-budget", 0.05, "most hedges, as a fraction of shard calls over the last 10s")
	cmd.Flags().StringVar(&f.choice, "replica-choice", "least-loaded", "how a partition's replica is chosen: least-loaded (fewest calls outstanding) or rotation")
}

// hedgeFlagsChanged reports whether any hedging flag was given.
func hedgeFlagsChanged(cmd *cobra.Command) bool {
	for _, f := range []string{"hedge", "hedge-delay", "hedge-budget", "replica-choice"} {
		if cmd.Flags().Changed(f) {
			return true
		}
	}
	return false
}

// apply sets o's hedging from the flags.
func (f *hedgeFlags) apply(o *router.Options) error {
	c, ok := hedge.ParseChoice(f.choice)
	if !ok {
		return fmt.Errorf("--replica-choice %q: want least-loaded or rotation", f.choice)
	}
	if f.delay < 0 {
		return fmt.Errorf("--hedge-delay %v: must not be negative", f.delay)
	}
	if !(f.budget > 0 && f.budget <= 1) {
		return fmt.Errorf("--hedge-budget %v: want a fraction in (0, 1]; --hedge=false sends none", f.budget)
	}
	o.Hedge = router.HedgeOptions{Off: !f.on, Delay: f.delay, Budget: f.budget, Choice: c}
	return nil
}

// faultFlag is --fault: faults a shard injects into its lookups.
type faultFlag struct{ f *shard.Faults }

func (f *faultFlag) String() string { return f.f.String() }
func (f *faultFlag) Set(s string) (err error) {
	f.f, err = shard.ParseFaults(s)
	return err
}
func (f *faultFlag) Type() string { return "spec" }

const faultUsage = "inject faults into lookups, for tests and drills: ';'-separated KIND[=ARG],fraction=F, each drawn per lookup: delay=50ms,fraction=0.01 (answer late), error=unavailable,fraction=0.1 (fail with that gRPC code, lower_snake), stall,fraction=0.001 (never answer), diskdelay=5ms (each read from disk of a partition over the memory budget waits first, as a slow disk)"
