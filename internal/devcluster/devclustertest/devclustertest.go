// Package devclustertest starts dev clusters for tests and benchmarks.
// It is apart from devcluster so that the cumulus binary, which uses
// devcluster for \`cumulus dev\`, does not link the testing package.
package devclustertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/internal/devcluster"
	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/topo"
)

// Start starts a cluster for a test or benchmark, waits up to 30 seconds
// for it to be ready, and stops it when the test ends.
func Start(tb testing.TB, o devcluster.Options) *devcluster.Cluster {
	tb.Helper()
	if o.DataDir == "" {
		// The test's own directory: removed when it ends, and a removal
		// that fails fails the test, so nothing is left behind unseen.
		o.DataDir = tb.TempDir()
	}
	c, err := devcluster.Start(context.Background(), o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		tb.Fatal(err)
	}
	return c
}

// WaitReplicated waits, up to 30 seconds, until every partition of each model's live
// version has n shards that the serving map assigns it to and that
// report it with the identity the map expects.
func WaitReplicated(t testing.TB, cli *clientv3.Client, n int) {
	t.Helper()
	c := topo.DefaultCluster
	testenv.Eventually(t, 30*time.Second, func() error {
		resp, err := cli.Get(context.Background(), c.Prefix(), clientv3.WithPrefix())
		if err != nil {
			return err
		}
		shardKV, modelKV := map[string][]byte{}, map[string][]byte{}
		for _, x := range resp.Kvs {
			switch k := string(x.Key); {
			case strings.HasPrefix(k, c.ShardsPrefix()):
				shardKV[k] = x.Value
			case strings.HasPrefix(k, c.ModelsPrefix()):
				modelKV[k] = x.Value
			}
		}
		shards := topo.Shards(shardKV, c)
		as := topo.Assignments(modelKV, c)
		if len(as) == 0 {
			return errors.New("no model in the serving map yet")
		}
		for name, a := range as {
			info := a.Info(a.Live)
			if info == nil {
				return fmt.Errorf("%s: no live version yet", name)
			}
			for p, reps := range a.Replicas {
				holders := 0
				for _, id := range reps {
					if shards[id].HoldsIn(&a, a.Live, uint32(p)) {
						holders++
					}
				}
				if holders < n {
					return fmt.Errorf("%s partition %d: %d of %v hold version %d", name, p, holders, reps, a.Live)
				}
			}
		}
		return nil
	})
}
