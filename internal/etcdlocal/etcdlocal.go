// Package etcdlocal runs a single-member etcd inside the process, on
// loopback ports the kernel picks: the store behind `cumulus dev` and the
// integration tests. Production points at an etcd cluster instead.
package etcdlocal

import (
	"fmt"
	"net/url"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/cumulus-serving/cumulus/internal/tlsconf"
)

// Etcd is a running embedded etcd.
type Etcd struct {
	// Endpoint is the client URL, e.g. http://127.0.0.1:41234 (https://
	// with TLS).
	Endpoint string
	e        *embed.Etcd
}

// Start starts etcd with its data in dir and waits until it serves.
// With tls, clients connect over TLS with tls's certificate and must
// present one its CA signed (the member's peer port stays plaintext on
// loopback: there is one member).
func Start(dir string, tls *tlsconf.Files) (*Etcd, error) {
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.Name = "cumulus-dev"
	// etcd logs its own normal shutdown at error level; its real failures
	// reach us as client errors, which the callers log.
	cfg.LogLevel = "fatal"
	local := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	client := local
	if tls != nil {
		client.Scheme = "https"
		cfg.ClientTLSInfo = transport.TLSInfo{CertFile: tls.Cert, KeyFile: tls.Key, TrustedCAFile: tls.CA, ClientCertAuth: true}
	}
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}
	cfg.ListenPeerUrls = []url.URL{local}
	cfg.AdvertisePeerUrls = []url.URL{local}
	cfg.InitialCluster = cfg.Name + "=" + local.String()
	cfg.ListenMetricsUrls = nil
	// Without compaction etcd keeps every revision until its 2 GiB quota,
	// then refuses writes: a dev cluster taking a delta every few seconds
	// (each rewrites the model's state, map record and the shards'
	// reports) got there in about 700 deltas. Keep five minutes of
	// history; compacted pages are reused, so the file stops growing.
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = "5m"
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcdlocal: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcdlocal: %w", err)
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("etcdlocal: etcd not ready after 30s")
	}
	return &Etcd{Endpoint: client.Scheme + "://" + e.Clients[0].Addr().String(), e: e}, nil
}

// Close stops etcd.
func (e *Etcd) Close() { e.e.Close() }
