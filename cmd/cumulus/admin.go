package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/dustin/go-humanize"
	"github.com/spf13/cobra"

	"github.com/cumulus-serving/cumulus/codec"
	"github.com/cumulus-serving/cumulus/internal/topo"
	"github.com/cumulus-serving/cumulus/manager"
)

// adminTokenEnv names the environment variable holding the admin token.
const adminTokenEnv = "CUMULUS_ADMIN_TOKEN"

// adminToken resolves the admin token: --admin-token, else
// --admin-token-file, else $CUMULUS_ADMIN_TOKEN; "" when none is given.
func adminToken(token, file string) (string, error) {
	return bearerToken(token, file, "--admin-token-file", adminTokenEnv)
}

// bearerToken resolves a token: token, else the file (named by fileFlag
// in errors), else $env; "" when none is given. Surrounding white space
// is not part of a token.
func bearerToken(token, file, fileFlag, env string) (string, error) {
	if t := strings.TrimSpace(token); t != "" {
		return t, nil
	}
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("%s: %w", fileFlag, err)
		}
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, nil
		}
		return "", fmt.Errorf("%s: %s is empty", fileFlag, file)
	}
	return strings.TrimSpace(os.Getenv(env)), nil
}

// adminFlags are the flags every process that serves or calls the admin
// API takes.
type adminFlags struct{ addr, token, tokenFile string }

// register declares the flags; addrFlag names the address flag: the
// servers' --admin-addr, the admin CLI's --addr; "" declares none (a
// shard's admin calls are on its --http-addr).
func (f *adminFlags) register(fs interface {
	StringVar(*string, string, string, string)
}, addrFlag string) {
	if addrFlag != "" {
		fs.StringVar(&f.addr, addrFlag, "127.0.0.1:8002", "the manager's admin API address (also /metrics and /healthz)")
	}
	fs.StringVar(&f.token, "admin-token", "", "admin API bearer token (else --admin-token-file, else $"+adminTokenEnv+")")
	fs.StringVar(&f.tokenFile, "admin-token-file", "", "file holding the admin API token")
}

func (f *adminFlags) resolve() (string, error) { return adminToken(f.token, f.tokenFile) }

// adminClient calls the admin API.
type adminClient struct {
	base, token string
	http        *http.Client
}

// call makes one request; a non-2xx answer is an error carrying the
// server's message.
func (c *adminClient) call(method, path string, body any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("admin API: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("admin API: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error string `json:"error"`
		}
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = strings.TrimSpace(string(b))
		}
		return nil, fmt.Errorf("%s: %s", resp.Status, e.Error)
	}
	return b, nil
}

func adminCommand() *cobra.Command {
	var (
		flags  adminFlags
		asJSON bool
		to     uint64
		from   uint64
		limit  int
	)
	cmd := &cobra.Command{
		Use:   "admin",
		Short: "Operate models through the manager's admin API: list, show, roll back, pin, canary, promote, accept, rescan, audit",
		Long: `admin calls the manager's admin API (cumulus manager --admin-addr, or cumulus dev).
The token comes from --admin-token, --admin-token-file or $` + adminTokenEnv + `.`,
		Args: cobra.NoArgs,
		RunE: needSubcommand,
	}
	flags.register(cmd.PersistentFlags(), "addr")
	var tlsf tlsFlags
	tlsf.registerClient(cmd.PersistentFlags(), "this client (to a manager started with --tls-*)")
	cmd.PersistentFlags().BoolVar(&asJSON, "json", false, "print the API's JSON answer as it is")
	client := func() (*adminClient, error) {
		token, err := flags.resolve()
		if err != nil {
			return nil, err
		}
		if token == "" {
			return nil, errors.New("no admin token: give --admin-token, --admin-token-file or $" + adminTokenEnv)
		}
		base := flags.addr
		host := base
		if _, rest, ok := strings.Cut(base, "://"); ok {
			host, _, _ = strings.Cut(rest, "/")
		}
		tr, scheme, err := tlsf.httpTransport(context.Background(), host)
		if err != nil {
			return nil, err
		}
		switch {
		case !strings.Contains(base, "://"):
			base = scheme + "://" + base
		case scheme == "https" && !strings.HasPrefix(base, "https://"):
			return nil, fmt.Errorf("--addr %s with --tls-*: the call (and its token) would go in plaintext; give https:// or no scheme", base)
		}
		return &adminClient{base: strings.TrimRight(base, "/"), token: token, http: &http.Client{Timeout: 30 * time.Second, Transport: tr}}, nil
	}
	// model is a model's path; a name that is not a model name is refused
	// here rather than sent as a path (it could name another call).
	var badName error
	model := func(name string) string {
		if !codec.ValidName(name) {
			badName = fmt.Errorf("invalid model name %q", name)
		}
		return "/admin/v1/models/" + name
	}
	// run makes one call and prints its answer, as JSON or through show.
	run := func(method, path string, body any, show func([]byte) error) error {
		if badName != nil {
			return badName
		}
		c, err := client()
		if err != nil {
			return err
		}
		b, err := c.call(method, path, body)
		if err != nil {
			return err
		}
		if asJSON {
			_, err := os.Stdout.Write(b)
			return err
		}
		return show(b)
	}
	// live is the live version a change acts on: --from, or the model's
	// live version now, read from the API. The manager refuses the change
	// if another has moved it meanwhile (409, naming the live version).
	live := func(c *cobra.Command, name string) (uint64, error) {
		if c.Flags().Changed("from") {
			return from, nil
		}
		path := model(name)
		if badName != nil {
			return 0, badName
		}
		ac, err := client()
		if err != nil {
			return 0, err
		}
		b, err := ac.call(http.MethodGet, path, nil)
		if err != nil {
			return 0, err
		}
		var d manager.ModelDetail
		if err := json.Unmarshal(b, &d); err != nil {
			return 0, fmt.Errorf("admin API answered badly: %w", err)
		}
		return d.Live, nil
	}
	unpin := &cobra.Command{Use: "unpin NAME", Short: "Follow the newest valid version again", Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			v, err := live(c, args[0])
			if err != nil {
				return err
			}
			return run(http.MethodDelete, model(args[0])+"/pin?from="+strconv.FormatUint(v, 10), nil, printChange("unpinned"))
		}}
	pin := &cobra.Command{Use: "pin NAME VERSION", Short: "Serve VERSION until unpinned (staged and committed like any rollout)", Args: cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			v, err := strconv.ParseUint(args[1], 10, 64)
			if err != nil || v == 0 {
				return fmt.Errorf("version %q: want a number ≥ 1", args[1])
			}
			l, err := live(c, args[0])
			if err != nil {
				return err
			}
			return run(http.MethodPut, model(args[0])+"/pin", map[string]uint64{"version": v, "from": l}, printChange(fmt.Sprintf("pinned to %d", v)))
		}}
	for _, c := range []*cobra.Command{unpin, pin} {
		c.Flags().Uint64Var(&from, "from", 0, "the live version this call acts on (default: the live version now); refused if it has moved")
	}
	cmd.AddCommand(unpin, pin,
		&cobra.Command{Use: "models", Short: "List the models: live, staged, pinned and standby versions", Args: cobra.NoArgs,
			RunE: func(*cobra.Command, []string) error {
				return run(http.MethodGet, "/admin/v1/models", nil, printModels)
			}},
		&cobra.Command{Use: "show NAME", Short: "Show one model: every version with its state and reason, the rollout, the shards", Args: cobra.ExactArgs(1),
			RunE: func(_ *cobra.Command, args []string) error {
				return run(http.MethodGet, model(args[0]), nil, printModel)
			}},
		&cobra.Command{Use: "routers", Short: "List the routers: the versions each can score, and why not the others", Args: cobra.NoArgs,
			RunE: func(*cobra.Command, []string) error {
				return run(http.MethodGet, "/admin/v1/routers", nil, printRouters)
			}},
		&cobra.Command{Use: "rescan", Short: "Scan the repository now and validate rejected versions again", Args: cobra.NoArgs,
			RunE: func(*cobra.Command, []string) error {
				return run(http.MethodPost, "/admin/v1/rescan", nil, printModels)
			}},
	)
	rollback := &cobra.Command{Use: "rollback NAME", Short: "Serve the most recent standby version (or --to V) now, and pin it", Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			l, err := live(c, args[0])
			if err != nil {
				return err
			}
			body := map[string]uint64{"from": l}
			if c.Flags().Changed("to") {
				body["to"] = to
			}
			return run(http.MethodPost, model(args[0])+"/rollback", body, printChange("rolled back"))
		}}
	rollback.Flags().Uint64Var(&to, "to", 0, "the standby version to go to (default: the most recent)")
	rollback.Flags().Uint64Var(&from, "from", 0, "the live version this call acts on (default: the live version now); refused if it has moved")
	audit := &cobra.Command{Use: "audit", Short: "List the newest state-changing admin calls", Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return run(http.MethodGet, fmt.Sprintf("/admin/v1/audit?limit=%d", limit), nil, printAudit)
		}}
	audit.Flags().IntVar(&limit, "limit", 50, "how many entries")
	var keep int
	prune := &cobra.Command{Use: "prune NAME", Short: "Remove the directories of versions nothing served, staged, pinned or kept for rollback needs, keeping the --keep newest", Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if !c.Flags().Changed("keep") {
				return errors.New("--keep is required: how many removable versions to keep (the newest); 0 removes every one")
			}
			return run(http.MethodPost, model(args[0])+"/prune", map[string]int{"keep": keep}, func(b []byte) error {
				var r manager.PruneResult
				if err := json.Unmarshal(b, &r); err != nil {
					return fmt.Errorf("admin API answered badly: %w", err)
				}
				if len(r.Removed) == 0 {
					fmt.Printf("%s: nothing to remove\n", r.Model)
					return nil
				}
				fmt.Printf("%s: removed %d version(s): %s\n", r.Model, len(r.Removed), joinVersions(r.Removed))
				return nil
			})
		}}
	prune.Flags().IntVar(&keep, "keep", 0, "removable versions to keep, the newest (required)")
	var reason string
	accept := &cobra.Command{Use: "accept NAME VERSION", Short: "Accept a version a validation gate rejected: it is validated again, and the gates that failed no longer reject it", Args: cobra.ExactArgs(2),
		RunE: func(c *cobra.Command, args []string) error {
			v, err := strconv.ParseUint(args[1], 10, 64)
			if err != nil || v == 0 {
				return fmt.Errorf("version %q: want a number ≥ 1", args[1])
			}
			if strings.TrimSpace(reason) == "" {
				return errors.New("--reason is required: why the version may serve despite its failed gates (it is audited)")
			}
			return run(http.MethodPost, model(args[0])+"/accept", map[string]any{"version": v, "reason": reason}, printChange(fmt.Sprintf("accepted version %d (validated again)", v)))
		}}
	accept.Flags().StringVar(&reason, "reason", "", "why the version may serve (required; audited)")
	var fraction float64
	var off bool
	canary := &cobra.Command{Use: "canary NAME [VERSION]", Short: "Give VERSION --fraction of the model's traffic beside the live version (once staged and gated), or take it away (--off)", Args: cobra.RangeArgs(1, 2),
		Long: `canary gives VERSION a share of the model's unpinned requests, --fraction
(above 0, at most 0.5), once every shard holds it and its gates pass; the
live version is the stable one, and does not move on by itself meanwhile.
A request goes to the canary when xxh64(key)/2^64 < fraction, the key
being its parameters.canary_key, else its id, else random: a key stays on
one arm on every router. model_version "canary" or "stable" names an arm.
promote makes the canary live; --off, a pin or a rollback drop it.`,
		RunE: func(c *cobra.Command, args []string) error {
			l, err := live(c, args[0])
			if err != nil {
				return err
			}
			if off {
				if len(args) != 1 {
					return errors.New("--off takes no VERSION")
				}
				return run(http.MethodDelete, model(args[0])+"/canary?from="+strconv.FormatUint(l, 10), nil, printChange("canary off, the live version pinned"))
			}
			if len(args) != 2 {
				return errors.New("give NAME VERSION (or NAME --off)")
			}
			v, err := strconv.ParseUint(args[1], 10, 64)
			if err != nil || v == 0 {
				return fmt.Errorf("version %q: want a number ≥ 1", args[1])
			}
			if !(fraction > 0 && fraction <= manager.MaxCanaryFraction) {
				return fmt.Errorf("--fraction %v: want above 0 and at most %g", fraction, manager.MaxCanaryFraction)
			}
			return run(http.MethodPut, model(args[0])+"/canary", map[string]any{"version": v, "fraction": fraction, "from": l},
				printChange(fmt.Sprintf("canary %d at %g (it serves once staged and gated)", v, fraction)))
		}}
	canary.Flags().Float64Var(&fraction, "fraction", 0, "the canary's share of the unpinned requests (above 0, at most 0.5)")
	canary.Flags().BoolVar(&off, "off", false, "take the canary away")
	promote := &cobra.Command{Use: "promote NAME", Short: "Make the serving canary the live version", Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			l, err := live(c, args[0])
			if err != nil {
				return err
			}
			return run(http.MethodPost, model(args[0])+"/promote", map[string]uint64{"from": l}, printChange("promoted the canary"))
		}}
	for _, c := range []*cobra.Command{canary, promote} {
		c.Flags().Uint64Var(&from, "from", 0, "the live version this call acts on (default: the live version now); refused if it has moved")
	}
	shards := &cobra.Command{Use: "shards", Short: "List the shards: zone, weight, state (active, cordoned, empty), partitions assigned and held", Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return run(http.MethodGet, "/admin/v1/shards", nil, printShards)
		}}
	cordonCmd := func(use, short, method string) *cobra.Command {
		return &cobra.Command{Use: use + " SHARD", Short: short, Args: cobra.ExactArgs(1),
			RunE: func(_ *cobra.Command, args []string) error {
				if strings.ContainsAny(args[0], "/?#") || args[0] == "" {
					return fmt.Errorf("invalid shard name %q", args[0])
				}
				return run(method, "/admin/v1/shards/"+args[0]+"/cordon", nil, printShards)
			}}
	}
	plan := &cobra.Command{Use: "plan", Short: "Show the partition moves under way or waiting (shards joining, leaving, cordoned), without making any", Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return run(http.MethodGet, "/admin/v1/plan", nil, func(b []byte) error {
				var out struct {
					Moves []manager.Move `json:"moves"`
				}
				if err := json.Unmarshal(b, &out); err != nil {
					return fmt.Errorf("admin API answered badly: %w", err)
				}
				if len(out.Moves) == 0 {
					fmt.Println("nothing to move: every partition is where placement puts it")
					return nil
				}
				w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
				fmt.Fprintln(w, "MODEL\tPARTITION\tFROM\tTO")
				for _, mv := range out.Moves {
					fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", mv.Model, mv.Partition, cmp.Or(strings.Join(mv.From, ","), "-"), strings.Join(mv.To, ","))
				}
				return w.Flush()
			})
		}}
	managers := &cobra.Command{Use: "managers", Short: "List the raft group of managers: each member's role, term and last applied index", Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return run(http.MethodGet, "/admin/v1/managers", nil, printManagers)
		}}
	managers.AddCommand(
		&cobra.Command{Use: "add ID HOST:PORT", Short: "Add a manager to the raft group (through the leader); it must be running with --raft-addr HOST:PORT and an empty --raft-dir", Args: cobra.ExactArgs(2),
			RunE: func(_ *cobra.Command, args []string) error {
				return run(http.MethodPost, "/admin/v1/managers", manager.MemberChange{ID: args[0], Addr: args[1]}, printManagers)
			}},
		&cobra.Command{Use: "remove ID", Short: "Take a manager out of the raft group (through the leader)", Args: cobra.ExactArgs(1),
			RunE: func(_ *cobra.Command, args []string) error {
				if strings.ContainsAny(args[0], "/?#") || args[0] == "" {
					return fmt.Errorf("invalid manager ID %q", args[0])
				}
				return run(http.MethodDelete, "/admin/v1/managers/"+args[0], nil, printManagers)
			}})
	cmd.AddCommand(managers)
	cmd.AddCommand(rollback, audit, prune, accept, canary, promote, shards, plan,
		cordonCmd("cordon", "Give SHARD nothing new and move what it holds elsewhere (it serves until the new replicas hold it, then is empty and can be stopped)", http.MethodPost),
		cordonCmd("uncordon", "Let SHARD take partitions again", http.MethodDelete))
	return cmd
}

func versionOrDash(v uint64) string {
	if v == 0 {
		return "-"
	}
	return strconv.FormatUint(v, 10)
}

func joinVersions(vs []uint64) string {
	if len(vs) == 0 {
		return "-"
	}
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = strconv.FormatUint(v, 10)
	}
	return strings.Join(s, ",")
}

func printRouters(b []byte) error {
	var r struct {
		Routers []topo.RouterInfo `json:"routers"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("admin API answered badly: %w", err)
	}
	if len(r.Routers) == 0 {
		fmt.Println("no routers registered")
		return nil
	}
	for _, ri := range r.Routers {
		fmt.Printf("%s", ri.ID)
		if ri.Addr != "" {
			fmt.Printf("  %s", ri.Addr)
		}
		if ri.Build != "" {
			fmt.Printf("  build %s", ri.Build)
		}
		fmt.Println()
		for _, name := range slices.Sorted(maps.Keys(ri.Scores)) {
			fmt.Printf("  %s: scores %s\n", name, joinVersions(ri.Scores[name]))
		}
		for _, c := range ri.Cannot {
			fmt.Printf("  %s: cannot score version %d: %s\n", c.Model, c.Version, c.Reason)
		}
	}
	return nil
}

func printModels(b []byte) error {
	var out struct {
		Models []manager.ModelSummary `json:"models"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return fmt.Errorf("admin API answered badly: %w", err)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "MODEL\tLIVE\tCANARY\tSTAGED\tPIN\tSTANDBY\tVERSIONS\tREJECTED")
	for _, m := range out.Models {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", m.Name, versionOrDash(m.Live), canaryText(m.Canary), versionOrDash(m.Staged), versionOrDash(m.Pin),
			joinVersions(m.Standby), m.Versions, m.Rejected)
	}
	return w.Flush()
}

// printable is text that came from elsewhere (a validator's stderr, a
// file's name) with its control characters escaped, so that it cannot
// forge lines or drive the terminal.
func printable(s string) string {
	if !strings.ContainsFunc(s, unicode.IsControl) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if unicode.IsControl(r) {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

// canaryText is a canary in a word or three.
func canaryText(c *manager.Canary) string {
	switch {
	case c == nil:
		return "-"
	case c.Serving:
		return fmt.Sprintf("%d at %g", c.Version, c.Fraction)
	}
	return fmt.Sprintf("%d at %g (staging)", c.Version, c.Fraction)
}

func printModel(b []byte) error {
	var d manager.ModelDetail
	if err := json.Unmarshal(b, &d); err != nil {
		return fmt.Errorf("admin API answered badly: %w", err)
	}
	intent := "following the newest valid version"
	if d.Pin != 0 {
		intent = fmt.Sprintf("pinned to %d", d.Pin)
	}
	fmt.Printf("model %s: %d partitions, live %s, %s\n", d.Name, d.Partitions, versionOrDash(d.Live), intent)
	if d.Canary != nil {
		fmt.Printf("canary: %s\n", canaryText(d.Canary))
	}
	if h := d.HeldPushes; h != nil {
		fmt.Printf("pushes: held in delta %d (%s); %s\n", h.Version, humanize.IBytes(uint64(h.Bytes)), h.Why)
	}
	if d.Rollout != nil {
		fmt.Printf("rollout: version %d staged, %d of %d replicas hold it\n", d.Rollout.Version, d.Rollout.Holding, d.Rollout.Replicas)
	}
	if d.OverBudget != "" {
		fmt.Printf("placement: %s\n", printable(d.OverBudget))
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "\nVERSION\tKIND\tPHASE\tSIZE\tGATES\tREASON")
	for _, v := range d.Versions {
		kind := v.Kind
		if v.Parent != 0 {
			kind = fmt.Sprintf("%s of %d", v.Kind, v.Parent)
		}
		size := "-"
		if v.Bytes > 0 {
			size = humanize.IBytes(uint64(v.Bytes))
		}
		gates := []string{}
		for _, g := range v.Gates {
			gates = append(gates, g.Gate+" "+g.Outcome)
		}
		if len(gates) == 0 {
			gates = append(gates, "-")
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", v.Version, kind, v.Phase, size, strings.Join(gates, ", "), printable(v.Reason))
	}
	// Each gate's outcome with its time and reason (a passed golden
	// gate's largest difference, a hold-out gate's log-losses).
	fmt.Fprintln(w, "\nVERSION\tGATE\tOUTCOME\tAT\tTOOK\tREASON")
	for _, v := range d.Versions {
		for _, g := range v.Gates {
			took := "-"
			if g.Took > 0 {
				took = g.Took.Round(time.Millisecond / 10).String()
			}
			fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", v.Version, g.Gate, g.Outcome, g.At.Format(time.DateTime), took, printable(cmp.Or(g.Reason, "-")))
		}
	}
	fmt.Fprintln(w, "\nSHARD\tADDR\tBUILD\tASSIGNED (partitions)\tLOADED (version:partitions)\tMISMATCHED\tERRORS")
	for _, s := range d.Shards {
		var loaded []string
		for v, n := range s.Loaded {
			loaded = append(loaded, fmt.Sprintf("%s:%d", v, n))
		}
		slices.Sort(loaded)
		errs := "-"
		if len(s.Errors) > 0 {
			errs = fmt.Sprintf("%d, newest: %s", len(s.Errors), s.Errors[0])
		}
		build := s.Build
		if build == "" {
			build = "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d (%s)\t%s\t%s\t%s\n", s.ID, s.Addr, build, s.Assigned, ranges(s.Partitions), strings.Join(loaded, " "), joinVersions(s.Mismatched), errs)
	}
	return w.Flush()
}

// ranges writes ascending partition numbers compactly: 0-3,7,9-10.
func ranges(ps []uint32) string {
	if len(ps) == 0 {
		return "-"
	}
	var b strings.Builder
	for i := 0; i < len(ps); {
		j := i
		for j+1 < len(ps) && ps[j+1] == ps[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", ps[i], ps[j])
		} else {
			fmt.Fprintf(&b, "%d", ps[i])
		}
		i = j + 1
	}
	return b.String()
}

func printManagers(b []byte) error {
	var out struct {
		Members []manager.Member `json:"members"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return fmt.Errorf("admin API answered badly: %w", err)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "MANAGER	RAFT	VOTER	ROLE	TERM	APPLIED")
	for _, m := range out.Members {
		role, term, applied := m.Role, strconv.FormatUint(m.Term, 10), strconv.FormatUint(m.Applied, 10)
		if !m.Reported {
			role, term, applied = "(no report: down?)", "-", "-"
		}
		fmt.Fprintf(w, "%s\t%s\t%v\t%s\t%s\t%s\n", printable(m.ID), printable(m.Raft), m.Voter, printable(role), term, applied)
	}
	return w.Flush()
}

func printShards(b []byte) error {
	var out struct {
		Shards []manager.ShardSummary `json:"shards"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return fmt.Errorf("admin API answered badly: %w", err)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "SHARD\tADDR\tZONE\tWEIGHT\tSTATE\tASSIGNED\tBYTES\tBUDGET\tHELD")
	var over []string
	for _, s := range out.Shards {
		budget := "-"
		if s.Budget > 0 {
			budget = humanize.IBytes(uint64(s.Budget))
			if s.Bytes > s.Budget {
				over = append(over, printable(s.ID))
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%.3g\t%s\t%d\t%s\t%s\t%d\n", printable(s.ID), cmp.Or(s.Addr, "(not running)"), cmp.Or(printable(s.Zone), "-"), s.Weight, s.State,
			s.Assigned, humanize.IBytes(uint64(s.Bytes)), budget, s.Held)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if len(over) > 0 {
		fmt.Printf("over budget: %s (the models do not fit the shards' budgets: what is beyond is served from disk; add shards or raise budgets)\n", strings.Join(over, ", "))
	}
	return nil
}

// printChange prints the state after a rollback, pin or unpin.
func printChange(what string) func([]byte) error {
	return func(b []byte) error {
		var d manager.ModelDetail
		if err := json.Unmarshal(b, &d); err != nil {
			return fmt.Errorf("admin API answered badly: %w", err)
		}
		fmt.Printf("%s: %s; live %s", d.Name, what, versionOrDash(d.Live))
		if d.Canary != nil {
			fmt.Printf(", canary %s", canaryText(d.Canary))
		}
		if d.Staged != 0 && (d.Canary == nil || d.Canary.Version != d.Staged) {
			fmt.Printf(", staging %d (live once every replica holds it)", d.Staged)
		}
		fmt.Printf(", standby %s\n", joinVersions(d.Standby))
		return nil
	}
}

func printAudit(b []byte) error {
	var out struct {
		Entries []manager.AuditEntry `json:"entries"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return fmt.Errorf("admin API answered badly: %w", err)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "TIME\tOP\tMODEL\tVERSION\tFROM\tRESULT")
	for _, e := range out.Entries {
		model := e.Model
		if model == "" {
			model = "-"
		}
		result := e.Result
		if e.Reason != "" {
			result += " (reason: " + strconv.Quote(e.Reason) + ")"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", e.Time.Format(time.RFC3339), e.Op, model, versionOrDash(e.Version), e.From, result)
	}
	return w.Flush()
}
