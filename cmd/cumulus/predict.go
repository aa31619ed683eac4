package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/cumulus-serving/cumulus/bench"
	"github.com/cumulus-serving/cumulus/server/kservepb"
)

func predictCommand() *cobra.Command {
	var addr, model, version, format string
	var batch int
	var tlsf tlsFlags
	cmd := &cobra.Command{
		Use:   "predict [FILE]",
		Short: "Score rows read from libsvm or JSON lines (FILE or stdin); prints one score per row",
		Long: `predict reads rows and prints one probability per row, in order.

libsvm:  LABEL ID:VALUE ID:VALUE ...   (the label is ignored)
jsonl:   {"ids": [1, 2, 3], "values": [0.5, 1, 2]}   (values optional)`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			var in io.Reader = os.Stdin
			if len(args) == 1 && args[0] != "-" {
				f, err := os.Open(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				in = f
			}
			creds, err := tlsf.grpcCreds(cmd.Context(), addr)
			if err != nil {
				return err
			}
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds),
				grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20), grpc.MaxCallSendMsgSize(256<<20)))
			if err != nil {
				return err
			}
			defer conn.Close()
			client := kservepb.NewGRPCInferenceServiceClient(conn)
			out := bufio.NewWriter(os.Stdout)
			// Scores not written are lost: a failed flush (full disk, closed
			// pipe) is the command's failure, never exit status 0.
			defer func() {
				if ferr := out.Flush(); ferr != nil && err == nil {
					err = fmt.Errorf("writing scores: %w", ferr)
				}
			}()
			var ids, splits []uint64
			var vals []float32
			flush := func() error {
				if len(splits) == 0 {
					return nil
				}
				req := &kservepb.ModelInferRequest{ModelName: model, ModelVersion: version}
				splits = append([]uint64{0}, splits...)
				for _, t := range []struct {
					name, dt string
					raw      []byte
					n        int
				}{{"ids", "UINT64", bench.RawUint64(ids), len(ids)}, {"values", "FP32", bench.RawFloat32(vals), len(vals)}, {"row_splits", "INT64", bench.RawUint64(splits), len(splits)}} {
					req.Inputs = append(req.Inputs, &kservepb.ModelInferRequest_InferInputTensor{Name: t.name, Datatype: t.dt, Shape: []int64{int64(t.n)}})
					req.RawInputContents = append(req.RawInputContents, t.raw)
				}
				resp, err := client.ModelInfer(cmd.Context(), req)
				if err != nil {
					return tlsHint(err, tlsf)
				}
				scores, err := bench.Scores(resp)
				if err != nil {
					return err
				}
				for _, s := range scores {
					fmt.Fprintf(out, "%.7g\n", s)
				}
				ids, vals, splits = ids[:0], vals[:0], splits[:0]
				return nil
			}
			sc := bufio.NewScanner(in)
			sc.Buffer(make([]byte, 1<<16), 1<<26)
			line := 0
			for sc.Scan() {
				line++
				text := strings.TrimSpace(sc.Text())
				if text == "" || text[0] == '#' {
					continue
				}
				var err error
				if format == "jsonl" {
					ids, vals, err = parseJSONRow(text, ids, vals)
				} else {
					ids, vals, err = parseLibsvmRow(text, ids, vals)
				}
				if err != nil {
					return fmt.Errorf("line %d: %w", line, err)
				}
				splits = append(splits, uint64(len(ids)))
				if len(splits) == batch {
					if err := flush(); err != nil {
						return err
					}
				}
			}
			if err := sc.Err(); err != nil {
				return err
			}
			return flush()
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:8001", "router gRPC address")
	cmd.Flags().StringVar(&model, "model", "", "model name (required)")
	cmd.Flags().StringVar(&version, "model-version", "", "pin a version (default: the live one)")
	cmd.Flags().StringVar(&format, "format", "libsvm", "libsvm or jsonl")
	cmd.Flags().IntVar(&batch, "batch", 256, "rows per request")
	tlsf.registerClient(cmd.Flags(), "this client (to a router serving TLS: --tls-ca alone, or all three if it asks for a client certificate)")
	cmd.MarkFlagRequired("model")
	return cmd
}

func parseLibsvmRow(text string, ids []uint64, vals []float32) ([]uint64, []float32, error) {
	f := strings.Fields(text)
	// The label is ignored but must be one: anything else is another
	// format read by mistake, which would score as an empty row.
	if _, err := strconv.ParseFloat(f[0], 64); err != nil {
		if strings.HasPrefix(f[0], "{") {
			return nil, nil, fmt.Errorf("this looks like a JSON line: use --format jsonl")
		}
		return nil, nil, fmt.Errorf("label %q is not a number (libsvm lines are LABEL ID:VALUE ...)", f[0])
	}
	for _, kv := range f[1:] {
		k, v, ok := strings.Cut(kv, ":")
		if !ok {
			return nil, nil, fmt.Errorf("%q is not ID:VALUE", kv)
		}
		id, err := strconv.ParseUint(k, 10, 64)
		if err != nil {
			return nil, nil, fmt.Errorf("feature id %q: %w", k, err)
		}
		x, err := strconv.ParseFloat(v, 32)
		if err != nil {
			return nil, nil, fmt.Errorf("value %q: %w", v, err)
		}
		ids, vals = append(ids, id), append(vals, float32(x))
	}
	return ids, vals, nil
}

func parseJSONRow(text string, ids []uint64, vals []float32) ([]uint64, []float32, error) {
	var row struct {
		IDs    []uint64  `json:"ids"`
		Values []float32 `json:"values"`
	}
	if err := json.Unmarshal([]byte(text), &row); err != nil {
		return nil, nil, err
	}
	if row.Values != nil && len(row.Values) != len(row.IDs) {
		return nil, nil, fmt.Errorf("%d values for %d ids", len(row.Values), len(row.IDs))
	}
	ids = append(ids, row.IDs...)
	for i := range row.IDs {
		x := float32(1)
		if row.Values != nil {
			x = row.Values[i]
		}
		vals = append(vals, x)
	}
	return ids, vals, nil
}

func kserveClient(conn *grpc.ClientConn) kservepb.GRPCInferenceServiceClient {
	return kservepb.NewGRPCInferenceServiceClient(conn)
}
