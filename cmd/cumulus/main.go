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

	"github.com/cumulus-serving/cumulus/internal/buildinfo"
	"github.com/cumulus-serving/cumulus/internal/lograte"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
	"github.com/cumulus-serving/cumulus/internal/topo"
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
	root.AddCommand(devCommand(), shardCommand(), routerCommand(), managerCommand(), adminCommand(), modelCommand(), predictCommand(), pushCommand(), benchCommand())
	return root
}

func etcdClient(ctx context.Context, endpoints string, tlsFiles tlsconf.Files) (*clientv3.Client, error) {
	cli, err := topo.Dial(ctx, strings.Split(endpoints, ","), tlsFiles)
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
