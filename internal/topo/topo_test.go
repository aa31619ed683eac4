package topo

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/internal/testenv"
)

// A registration is visible to a watcher, follows Set, and disappears
// when its owner stops.
func TestRegisterAndWatch(t *testing.T) {
	cli := testenv.Etcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	snaps := make(chan map[string][]byte, 100)
	go Watch(ctx, cli, DefaultCluster.ShardsPrefix(), func(m map[string][]byte, _ int64) { snaps <- m })

	latest := func() map[string][]byte {
		var m map[string][]byte
		for {
			select {
			case m = <-snaps:
			default:
				return m
			}
		}
	}
	var last map[string][]byte
	waitFor := func(want string) {
		testenv.Eventually(t, 10*time.Second, func() error {
			if m := latest(); m != nil {
				last = m
			}
			if got := string(last[DefaultCluster.ShardKey("a")]); got != want {
				return fmt.Errorf("value %q, want %q", got, want)
			}
			return nil
		})
	}
	rctx, rcancel := context.WithCancel(ctx)
	r, err := Register(rctx, cli, DefaultCluster.ShardKey("a"), "one", 5)
	if err != nil {
		t.Fatal(err)
	}
	waitFor("one")
	r.Set("two")
	waitFor("two")
	rcancel()
	waitFor("")
}
