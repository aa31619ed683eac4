package topo

import (
	"context"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/cumulus-serving/cumulus/internal/tlsconf"
)

// Dial makes an etcd client for endpoints, over TLS with tlsFiles when
// any is named (then every endpoint must be https://: etcd's client
// speaks plaintext to an http:// one whatever its TLS configuration
// says). The client's own logger keeps to errors: it reports every
// retried call at warn level, also the calls cancelled at a normal
// shutdown, and errors reach callers as errors.
func Dial(ctx context.Context, endpoints []string, tlsFiles tlsconf.Files) (*clientv3.Client, error) {
	quiet, _ := zap.NewProductionConfig().Build(zap.IncreaseLevel(zapcore.ErrorLevel))
	cfg := clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: quiet}
	if tlsFiles.Set() {
		for _, e := range endpoints {
			if !strings.HasPrefix(e, "https://") {
				return nil, fmt.Errorf("etcd endpoint %s: --etcd-cert, --etcd-key and --etcd-ca need https:// endpoints (an http:// one would be plaintext)", e)
			}
		}
		src, err := tlsconf.Load(ctx, tlsFiles)
		if err == nil {
			cfg.TLS, err = src.ClientAnyName()
		}
		if err != nil {
			return nil, fmt.Errorf("etcd: %w", err)
		}
	}
	return clientv3.New(cfg)
}
