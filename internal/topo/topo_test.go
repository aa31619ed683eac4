package topo

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/internal/etcdlocal"
	"github.com/cumulus-serving/cumulus/internal/testenv"
)

func startEtcd(t *testing.T) *clientv3.Client {
	e, err := etcdlocal.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// A registration is visible to a watcher, follows Set, and disappears
// when its owner stops.
func TestRegisterAndWatch(t *testing.T) {
	cli := startEtcd(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	snaps := make(chan map[string][]byte, 100)
	go Watch(ctx, cli, ShardsPrefix, func(m map[string][]byte) { snaps <- m })

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
			if got := string(last[ShardKey("a")]); got != want {
				return fmt.Errorf("value %q, want %q", got, want)
			}
			return nil
		})
	}
	rctx, rcancel := context.WithCancel(ctx)
	r, err := Register(rctx, cli, ShardKey("a"), "one", 5)
	if err != nil {
		t.Fatal(err)
	}
	waitFor("one")
	r.Set("two")
	waitFor("two")
	rcancel()
	waitFor("")
}
