package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/cumulus-serving/cumulus/internal/buildinfo"
	"github.com/cumulus-serving/cumulus/internal/lograte"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	root := rootCommand()
	root.SetArgs(args)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "cumulus:", err)
		return 1
	}
	return 0
}

func rootCommand() *cobra.Command {
	var logLevel string
	root := &cobra.Command{
		Use:           "cumulus",
		Short:         "Low-latency serving of huge sparse models (LR, FM, FFM, embedding + MLP)",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			var lvl slog.Level
			if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			// Repeated warnings are rate-limited (a refused call, a retry).
			slog.SetDefault(slog.New(lograte.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))))
			return nil
		},
	}
	// --version prints "cumulus VERSION (rev …) GO" on one line; cobra's
	// default template would insert the word "version".
	root.Version = buildinfo.String()
	root.SetVersionTemplate("{{.DisplayName}} {{.Version}}\n")
	root.PersistentFlags().StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	root.AddCommand(devCommand(), shardCommand(), routerCommand(), managerCommand(), adminCommand(), modelCommand(), predictCommand(), benchCommand())
	return root
}

func etcdClient(ctx context.Context, endpoints string, tlsFiles tlsconf.Files) (*clientv3.Client, error) {
	// The client's own logger reports every retried call at warn level,
	// also the calls cancelled at a normal shutdown; errors reach us as
	// errors and are logged where they matter.
	quiet, _ := zap.NewProductionConfig().Build(zap.IncreaseLevel(zapcore.ErrorLevel))
	cfg := clientv3.Config{Endpoints: strings.Split(endpoints, ","), DialTimeout: 5 * time.Second, Logger: quiet}
	if tlsFiles.Set() {
		// etcd's client speaks plaintext to an http:// endpoint whatever
		// its TLS configuration says.
		for _, e := range cfg.Endpoints {
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
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcd %s: %w", endpoints, err)
	}
	return cli, nil
}

// registerEtcdTLS adds --etcd-cert, --etcd-key and --etcd-ca: etcd's
// client TLS.
func registerEtcdTLS(fs *pflag.FlagSet, f *tlsconf.Files) {
	fs.StringVar(&f.Cert, "etcd-cert", "", "PEM client certificate for etcd (with --etcd-key)")
	fs.StringVar(&f.Key, "etcd-key", "", "PEM key of --etcd-cert")
	fs.StringVar(&f.CA, "etcd-ca", "", "PEM CA certificate(s) etcd's server certificates must be signed by (read at start)")
}

// drainFlag is --drain-timeout: how long a server stopping on SIGTERM or
// SIGINT finishes what is under way before it stops hard.
type drainFlag struct{ timeout time.Duration }

func (f *drainFlag) register(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&f.timeout, "drain-timeout", 20*time.Second,
		"on SIGTERM or SIGINT: how long to finish the requests under way before stopping hard (keep it below Kubernetes' terminationGracePeriodSeconds, 30s by default); a second signal stops at once")
}

// await blocks until the command's context ends (the first SIGTERM or
// SIGINT) and returns the drain's context, which ends after --drain-timeout.
// From then on a second signal stops the process at once.
func (f *drainFlag) await(ctx context.Context) (context.Context, context.CancelFunc) {
	<-ctx.Done()
	signal.Reset(os.Interrupt, syscall.SIGTERM)
	return context.WithTimeout(context.Background(), f.timeout)
}

// needSubcommand is the RunE of commands that only group others: called
// with no subcommand, or an unknown one, it is an error (exit status 1),
// so a mistyped command in a script never passes for success.
func needSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("unknown command %q for %q; see %s --help", args[0], cmd.CommandPath(), cmd.CommandPath())
	}
	return fmt.Errorf("%s needs a subcommand; see %s --help", cmd.CommandPath(), cmd.CommandPath())
}
