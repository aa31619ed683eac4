package testenv

import (
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cumulus-serving/cumulus/internal/etcdlocal"
)

// Etcd starts an embedded etcd for the test and returns a client; both
// stop when the test ends.
func Etcd(t testing.TB) *clientv3.Client {
	t.Helper()
	e, err := etcdlocal.Start(t.TempDir(), nil)
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
