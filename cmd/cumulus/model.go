package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/cumulus-serving/cumulus/internal/golden"
	"github.com/cumulus-serving/cumulus/loader"
	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/router"
)

func modelCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "model", Short: "Import, generate and inspect models in a model repository", Args: cobra.NoArgs, RunE: needSubcommand}
	cmd.AddCommand(modelImportCommand(), modelGenCommand(), modelInspectCommand(), modelDeltaCommand(), modelCompactCommand())
	return cmd
}

func modelImportCommand() *cobra.Command {
	var format, name, repo, positive, encoding, dense, goldenFile string
	var partitions uint32
	cmd := &cobra.Command{
		Use:   "import MODEL_FILE",
		Short: "Import a LIBLINEAR or TSV model as the next version of --name",
		Long: `import publishes a model file as the next version of --name.
--format liblinear reads a LIBLINEAR logistic regression; --format tsv
Cumulus's text format (docs/model-format.md), of any type. A dnn model's
dense layers come from --dense, a safetensors file of F32 tensors named
[PREFIX.]N.weight and [PREFIX.]N.bias, as state_dict() of a PyTorch
nn.Sequential(Linear, ReLU, ..., Linear) holds them.
--golden publishes golden requests with the version (golden.jsonl): a
file of KServe v2 JSON infer bodies, one per line, each with the scores
the version must give, "want": [one per row]; a line without "want" gets
the scores of the imported model (its reference scorer, full precision:
with --encoding fp16 or int8, the manager's --golden-tolerance must allow
for the encoding's error). The manager's golden gate checks the staged
version's served scores against them.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer f.Close()
			var s *loader.Sparse
			switch format {
			case "liblinear":
				s, err = loader.ImportLIBLINEAR(f, positive)
			case "tsv":
				s, err = loader.ParseTSV(f)
			default:
				return fmt.Errorf("--format %q: want liblinear or tsv", format)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			if s.Dense, err = readDense(dense, s.Shape); err != nil {
				return err
			}
			spec := loader.Spec{Name: name, Partitions: partitions, Encoding: encoding, Source: fmt.Sprintf("import --format %s %s", format, args[0])}
			if goldenFile != "" {
				if spec.Golden, err = readGolden(goldenFile, name); err != nil {
					return err
				}
			}
			m, err := loader.Repo{Dir: repo}.PublishSpec(spec, s)
			if err != nil {
				return err
			}
			fmt.Printf("published %s version %d: %s, %d features, %d partitions\n", m.Name, m.Version, m.Shape, m.Params, m.Partitions)
			return nil
		},
	}
	cmd.Flags().StringVar(&format, "format", "", "liblinear or tsv (required)")
	cmd.Flags().StringVar(&name, "name", "", "model name (required)")
	cmd.Flags().StringVar(&repo, "repo", "", "model repository directory (required)")
	cmd.Flags().StringVar(&positive, "positive-label", "1", "liblinear: the label whose probability is the score")
	cmd.Flags().StringVar(&dense, "dense", "", "dnn: the dense layers, a safetensors file")
	cmd.Flags().StringVar(&goldenFile, "golden", "", "golden requests to publish with the version: KServe v2 JSON bodies, one per line, with \"want\" scores")
	cmd.Flags().Uint32Var(&partitions, "partitions", 8, "number of partitions")
	cmd.Flags().StringVar(&encoding, "encoding", "fp32", "fm: factor storage, fp32, fp16 or int8")
	for _, f := range []string{"format", "name", "repo"} {
		cmd.MarkFlagRequired(f)
	}
	return cmd
}

// readGolden reads a golden request file for model name: lines with
// "want" keep it, the others are scored by the version published.
func readGolden(path, name string) (*golden.Set, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	set, err := golden.Parse(b, name, router.Limits{})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	set.KeepWant = true
	return set, nil
}

// parentGolden is version parent's golden requests, to be scored again
// on a delta over it; nil when it has none.
func parentGolden(r loader.Repo, name string, parent uint64) (loader.Goldens, error) {
	m, err := r.Manifest(name, parent)
	if err != nil {
		return nil, err
	}
	b, err := r.Golden(m)
	if b == nil || err != nil {
		return nil, err
	}
	set, err := golden.Parse(b, name, router.Limits{})
	if err != nil {
		return nil, fmt.Errorf("%s version %d's golden requests: %w", name, parent, err)
	}
	return set, nil
}

// readDense reads the dense layers at path ("" for none) for a model of
// shape s: a dnn needs them, other types take none.
func readDense(path string, s model.Shape) (*model.Dense, error) {
	switch {
	case path == "" && s.HasDense():
		return nil, fmt.Errorf("a %s model needs its dense layers: give --dense FILE.safetensors", s.Type)
	case path == "":
		return nil, nil
	case !s.HasDense():
		return nil, fmt.Errorf("--dense: an %s model has no dense layers", s.Type)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	d, err := s.ReadDense(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}

func modelGenCommand() *cobra.Command {
	var spec loader.GenSpec
	var shape shapeFlags
	var repo, ids string
	var deltas, deltaKeys int
	cmd := &cobra.Command{
		Use:   "gen",
		Short: "Generate a synthetic model (Zipf traffic ranks mapped to ids) for demos and benchmarks",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch ids {
			case "hashed":
			case "dense":
				spec.Dense = true
			default:
				return fmt.Errorf("--ids %q: want hashed or dense", ids)
			}
			s, err := shape.spec(spec.Name, spec.Params, spec.Seed)
			if err != nil {
				return err
			}
			if err := loader.CheckGenDeltas(deltas, deltaKeys, spec.Params); err != nil {
				return fmt.Errorf("--deltas %d --delta-keys %d: %w", deltas, deltaKeys, err)
			}
			spec.Shape, spec.Layers = s.Shape, s.Layers
			if spec.Width() == 1 {
				spec.Encoding = "" // no factors to encode
			}
			bar := progressbar.NewOptions64(spec.Params, progressbar.OptionSetDescription("features"),
				progressbar.OptionSetWriter(os.Stderr), progressbar.OptionShowCount(), progressbar.OptionThrottle(100_000_000),
				progressbar.OptionSetPredictTime(true), progressbar.OptionFullWidth())
			spec.Progress = func(n int64) { bar.Add64(n) }
			m, err := loader.Repo{Dir: repo}.Generate(spec)
			if err != nil {
				return err
			}
			bar.Finish()
			fmt.Fprintln(os.Stderr)
			var size int64
			for _, f := range m.Files {
				size += f.Size
			}
			fmt.Printf("published %s version %d: %s, %d features, %d partitions, %d bytes\n", m.Name, m.Version, m.Shape, m.Params, m.Partitions, size)
			if deltas > 0 {
				ds, err := loader.Repo{Dir: repo}.GenerateDeltas(spec.Name, deltas, deltaKeys, spec.Seed)
				if err != nil {
					return err
				}
				fmt.Printf("published %d deltas of %d keys on it: versions %d to %d\n", len(ds), deltaKeys, ds[0].Version, ds[len(ds)-1].Version)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&spec.Name, "name", "", "model name (required)")
	shape.register(cmd, "")
	cmd.Flags().Int64Var(&spec.Params, "params", 1_000_000, "number of features")
	cmd.Flags().Uint32Var(&spec.Partitions, "partitions", 8, "number of partitions")
	cmd.Flags().Uint64Var(&spec.Seed, "seed", 1, "random seed")
	cmd.Flags().Uint64Var(&spec.ValueSeed, "value-seed", 0, "draw the values from this seed instead (0: --seed): the same features with other values, as a next full version")
	cmd.Flags().StringVar(&spec.Encoding, "encoding", "fp32", "factor storage (fm, ffm): fp32, fp16 or int8")
	cmd.Flags().StringVar(&ids, "ids", "hashed", "hashed (64-bit ids, as hashed features are) or dense (0..params-1)")
	cmd.Flags().StringVar(&repo, "repo", "", "model repository directory (required)")
	cmd.Flags().IntVar(&deltas, "deltas", 0, "then publish this many deltas on it, each on the one before (a long chain, for benchmarks)")
	cmd.Flags().IntVar(&deltaKeys, "delta-keys", 1000, "with --deltas: features each delta changes, drawn uniformly from the model's")
	cmd.MarkFlagRequired("name")
	cmd.MarkFlagRequired("repo")
	return cmd
}

func modelInspectCommand() *cobra.Command {
	var repo string
	cmd := &cobra.Command{
		Use:   "inspect NAME [VERSION]",
		Short: "Print a version's manifest, file sizes and checksum status (default: the latest version)",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			r := loader.Repo{Dir: repo}
			var v uint64
			var err error
			if len(args) == 2 {
				v, err = strconv.ParseUint(args[1], 10, 64)
			} else {
				v, err = r.Latest(args[0])
			}
			if err != nil {
				return err
			}
			m, err := r.Manifest(args[0], v)
			if err != nil {
				return err
			}
			b, _ := json.MarshalIndent(m, "", "  ")
			fmt.Println(string(b))
			bad := 0
			for _, f := range m.Files {
				p := f.Partition
				status := "ok"
				pt, err := r.ReadPartition(m, p)
				if err == nil {
					err = pt.VerifyBlocks(1) // ReadPartition trusts a matching SHA-256; this names the block
				}
				if err != nil {
					status, bad = "DAMAGED: "+err.Error(), bad+1
				}
				fmt.Printf("partition %d  %s  %d keys  %d bytes  %s\n", p, f.Path, f.Keys, f.Size, status)
			}
			if n := int(m.Partitions) - len(m.Files); n > 0 {
				fmt.Printf("%d partitions unchanged: as version %d has them\n", n, m.Parent)
			}
			if bad > 0 {
				return fmt.Errorf("%d of %d partition files are damaged", bad, len(m.Files))
			}
			fmt.Println("checksums: all ok")
			return nil
		},
	}
	cmd.Flags().StringVar(&repo, "repo", "", "model repository directory (required)")
	cmd.MarkFlagRequired("repo")
	return cmd
}

func modelCompactCommand() *cobra.Command {
	var repo string
	var version uint64
	var deltas bool
	cmd := &cobra.Command{
		Use:   "compact NAME",
		Short: "Write the newest chain of deltas as one new full version, with identical scores",
		Long: `compact merges a version's chain — its full version and the deltas on it —
into a new full version with a new number, which rolls out like any other.
Records are copied as they are encoded (never quantized again) and deleted
features dropped, so every score is bit-identical. By default it compacts
the newest version that passes the local checks; it refuses if another
version is published while it runs (the compacted version would hide it).
With --deltas it merges only the deltas, into one delta on the full version
(deletions kept): it costs what the deltas hold, not the model.
The manager does this by itself when a chain reaches --compact-after deltas
(merging the deltas while they weigh at most a quarter of the model).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			start := time.Now()
			r := loader.Repo{Dir: repo}
			compact := r.Compact
			if deltas {
				if version == 0 {
					var err error
					if version, _, err = r.DeltaParent(args[0]); err != nil {
						return err
					}
				}
				compact = r.CompactDeltas
			}
			m, err := compact(args[0], version)
			if err != nil {
				return err
			}
			fmt.Printf("%s: version %d (%s, %d keys in %d partitions written) in %s: %s\n", m.Name, m.Version, m.Kind, m.Params, len(m.Files),
				time.Since(start).Round(time.Millisecond), m.Source)
			return nil
		},
	}
	cmd.Flags().StringVar(&repo, "repo", "", "model repository directory (required)")
	cmd.Flags().Uint64Var(&version, "version", 0, "the version whose chain to compact (default: the newest that passes the local checks)")
	cmd.Flags().BoolVar(&deltas, "deltas", false, "merge the chain's deltas into one delta on its full version, instead of writing a full version")
	cmd.MarkFlagRequired("repo")
	return cmd
}

func modelDeltaCommand() *cobra.Command {
	var name, repo, upserts, deletes, dense, goldenFile string
	var bias float64
	var parent uint64
	var unpacked bool
	cmd := &cobra.Command{
		Use:   "delta",
		Short: "Publish an increment on top of a model's version: changed, new and deleted features",
		Long: `delta publishes a delta version on top of --parent, by default the newest
version that passes the local checks (its manifests chain and its files
match them): a damaged version, which the manager rejects, is passed
over, saying why.
--upserts is a TSV model (docs/model-format.md) of the same type and dim
holding features to add or change, and, if it has a bias header, the new
bias; --deletes is a file of feature ids to remove, one per line; --bias
sets a new bias (refused if the upserts name another); --dense replaces a
dnn model's dense layers (by default a delta keeps its parent's). Shards
serve a delta over its parents until the next full version.
The parent's golden requests (golden.jsonl), if it has any, are scored
again on the new chain by the reference scorer and published with the
delta; --golden FILE publishes FILE's instead (as model import does).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			d := loader.Delta{Source: "cumulus model delta", Pack: !unpacked}
			if upserts != "" {
				f, err := os.Open(upserts)
				if err != nil {
					return err
				}
				d.Upserts, err = loader.ParseTSV(f)
				f.Close()
				if err != nil {
					return fmt.Errorf("%s: %w", upserts, err)
				}
			}
			if deletes != "" {
				var err error
				if d.Deletes, err = readIDs(deletes); err != nil {
					return err
				}
			}
			if cmd.Flags().Changed("bias") {
				d.Bias = &bias
			}
			if d.Upserts == nil && d.Deletes == nil && d.Bias == nil && dense == "" {
				return fmt.Errorf("nothing to publish: give --upserts, --deletes, --bias or --dense")
			}
			r := loader.Repo{Dir: repo}
			d.Parent = parent
			if parent == 0 {
				v, skipped, err := r.DeltaParent(name)
				for _, e := range skipped {
					fmt.Fprintf(os.Stderr, "cumulus: not building on %v\n", e)
				}
				if err != nil {
					return err
				}
				d.Parent = v
			}
			if dense != "" {
				pm, err := r.Manifest(name, d.Parent)
				if err != nil {
					return err
				}
				if d.Dense, err = readDense(dense, pm.Shape); err != nil {
					return err
				}
			}
			var err error
			if goldenFile != "" {
				d.Golden, err = readGolden(goldenFile, name)
			} else {
				d.Golden, err = parentGolden(r, name, d.Parent)
			}
			if err != nil {
				return err
			}
			m, err := r.PublishDelta(name, d)
			if err != nil {
				return err
			}
			fmt.Printf("published %s version %d: delta on %d, %d records\n", m.Name, m.Version, m.Parent, m.Params)
			return nil
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "model name (required)")
	cmd.Flags().StringVar(&repo, "repo", "", "model repository directory (required)")
	cmd.Flags().StringVar(&upserts, "upserts", "", "TSV of features to add or change")
	cmd.Flags().StringVar(&deletes, "deletes", "", "file of feature ids to delete, one per line")
	cmd.Flags().Float64Var(&bias, "bias", 0, "new bias (default: keep the parent's)")
	cmd.Flags().StringVar(&dense, "dense", "", "dnn: new dense layers, a safetensors file (default: keep the parent's)")
	cmd.Flags().Uint64Var(&parent, "parent", 0, "the version to build on (default: the newest that passes the local checks)")
	cmd.Flags().StringVar(&goldenFile, "golden", "", "golden requests to publish with the delta (default: the parent's, scored again on the new chain)")
	cmd.Flags().BoolVar(&unpacked, "unpacked", false, "write a file per partition the delta touches (manifest format 2), for a cluster being upgraded from builds that do not read format 3; by default its partitions are sections of one file")
	cmd.MarkFlagRequired("name")
	cmd.MarkFlagRequired("repo")
	return cmd
}

// readIDs reads a file of feature ids, one per line ('#' starts a
// comment line).
func readIDs(path string) ([]uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var ids []uint64
	for i, line := range strings.Split(string(b), "\n") {
		if line = strings.TrimSpace(line); line == "" || line[0] == '#' {
			continue
		}
		id, err := strconv.ParseUint(line, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: line %d: %w", path, i+1, err)
		}
		ids = append(ids, id)
	}
	return ids, nil
}
