package manager

import (
	"context"
	"errors"
	"testing"

	"github.com/cumulus-serving/cumulus/internal/testenv"
	"github.com/cumulus-serving/cumulus/internal/topo"
)

// TestStaleWriterRefused: of two writers that read the same state, the
// second to write is refused and the map keeps the first's record.
func TestStaleWriterRefused(t *testing.T) {
	cli := testenv.Etcd(t)
	ctx := context.Background()
	a := &store{cli: cli, cluster: topo.DefaultCluster, writer: "a"}
	b := &store{cli: cli, cluster: topo.DefaultCluster, writer: "b"}
	for _, st := range []*store{a, b} {
		if _, err := st.load(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.commit(ctx, change{maps: map[string][]byte{"m": []byte(`"a's"`)}}); err != nil {
		t.Fatal(err)
	}
	if err := b.commit(ctx, change{maps: map[string][]byte{"m": []byte(`"b's"`)}}); !errors.Is(err, ErrStale) {
		t.Fatalf("stale write: %v, want ErrStale", err)
	}
	resp, err := cli.Get(ctx, topo.DefaultCluster.ModelKey("m"))
	if err != nil || string(resp.Kvs[0].Value) != `"a's"` {
		t.Fatalf("map after the refused write: %q %v", resp.Kvs[0].Value, err)
	}
	// Having read again, b writes.
	if _, err := b.load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.commit(ctx, change{maps: map[string][]byte{"m": []byte(`"b's"`)}}); err != nil {
		t.Fatal(err)
	}
}
