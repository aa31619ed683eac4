// Package devclustertest starts dev clusters for tests and benchmarks.
// It is apart from devcluster so that the cumulus binary, which uses
// devcluster for \`cumulus dev\`, does not link the testing package.
package devclustertest

import (
	"context"
	"testing"
	"time"

	"github.com/cumulus-serving/cumulus/internal/devcluster"
)

// Start starts a cluster for a test or benchmark, waits up to 30 seconds
// for it to be ready, and stops it when the test ends.
func Start(tb testing.TB, o devcluster.Options) *devcluster.Cluster {
	tb.Helper()
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
