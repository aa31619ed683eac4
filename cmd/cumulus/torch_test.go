package main

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// requireTorch is Debian's python3 with PyTorch, or the test is skipped
// (failed under CUMULUS_REQUIRE_TOOLS=1, as scripts/test.sh runs).
func requireTorch(t *testing.T) string {
	t.Helper()
	const python = "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import torch, numpy").Run(); err != nil {
		if os.Getenv("CUMULUS_REQUIRE_TOOLS") == "1" {
			t.Fatalf("%s cannot import torch (%v); scripts/test.sh installs python3-torch", python, err)
		}
		t.Skipf("%s cannot import torch (%v); install python3-torch", python, err)
	}
	return python
}

// torchBody is one request the export script wrote: a KServe v2 JSON
// body, and PyTorch's score of each row.
type torchBody struct {
	Inputs []struct {
		Name     string          `json:"name"`
		Datatype string          `json:"datatype"`
		Shape    []int64         `json:"shape"`
		Data     json.RawMessage `json:"data"`
	} `json:"inputs"`
	Want []float64 `json:"want"`
}

// grpcRequest is the body as a gRPC request with typed contents.
func (b torchBody) grpcRequest(t *testing.T, name string) *kservepb.ModelInferRequest {
	req := &kservepb.ModelInferRequest{ModelName: name}
	for _, in := range b.Inputs {
		c := &kservepb.InferTensorContents{}
		var err error
		switch in.Datatype {
		case "INT64":
			err = json.Unmarshal(in.Data, &c.Int64Contents)
		case "INT32":
			err = json.Unmarshal(in.Data, &c.IntContents)
		case "FP32":
			if len(in.Shape) == 2 {
				var rows [][]float32
				err = json.Unmarshal(in.Data, &rows)
				for _, r := range rows {
					c.Fp32Contents = append(c.Fp32Contents, r...)
				}
			} else {
				err = json.Unmarshal(in.Data, &c.Fp32Contents)
			}
		}
		if err != nil {
			t.Fatalf("input %s: %v", in.Name, err)
		}
		req.Inputs = append(req.Inputs, &kservepb.ModelInferRequest_InferInputTensor{Name: in.Name, Datatype: in.Datatype, Shape: in.Shape, Contents: c})
	}
	return req
}

// TestPyTorchModels: an FFM and an embedding + MLP model trained by
// PyTorch (scripts/torch_models.py), exported and imported with `cumulus
// model import`, score through the KServe HTTP and gRPC fronts of
// `cumulus dev` what PyTorch's own forward pass scores, shared features
// and continuous features included, within 1e-5, row for row.
func TestPyTorchModels(t *testing.T) {
	python := requireTorch(t)
	out, repo := t.TempDir(), t.TempDir()
	if b, err := exec.Command(python, "../../scripts/torch_models.py", out).CombinedOutput(); err != nil {
		t.Fatalf("scripts/torch_models.py: %v\n%s", err, b)
	}
	for _, args := range [][]string{
		{"--name", "ffm", filepath.Join(out, "ffm.tsv")},
		{"--name", "dnn", "--dense", filepath.Join(out, "dnn.safetensors"), filepath.Join(out, "dnn.tsv")},
	} {
		b, err := cumulus(append([]string{"model", "import", "--format", "tsv", "--repo", repo, "--partitions", "3"}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("import %v: %v\n%s", args, err, b)
		}
	}
	dev := startDev(t, repo)
	conn, err := grpc.NewClient(dev.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := kservepb.NewGRPCInferenceServiceClient(conn)
	for _, name := range []string{"ffm", "dnn"} {
		f, err := os.Open(filepath.Join(out, name+".requests.jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(f)
		sc.Buffer(nil, 1<<24)
		rows, worst := 0, 0.0
		for sc.Scan() {
			var body torchBody
			if err := json.Unmarshal(sc.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			// Over HTTP, the body as the script wrote it, less "want".
			inputs, _ := json.Marshal(map[string]any{"inputs": body.Inputs})
			resp, err := http.Post("http://"+dev.http+"/v2/models/"+name+"/infer", "application/json", strings.NewReader(string(inputs)))
			if err != nil {
				t.Fatal(err)
			}
			var answer struct {
				Outputs []struct {
					Data []float32 `json:"data"`
				} `json:"outputs"`
				Error string `json:"error"`
			}
			json.NewDecoder(resp.Body).Decode(&answer)
			resp.Body.Close()
			if resp.StatusCode != 200 || len(answer.Outputs) != 1 {
				t.Fatalf("%s over HTTP: %d %s", name, resp.StatusCode, answer.Error)
			}
			gresp, err := client.ModelInfer(context.Background(), body.grpcRequest(t, name))
			if err != nil {
				t.Fatalf("%s over gRPC: %v", name, err)
			}
			for how, got := range map[string][]float32{"http": answer.Outputs[0].Data, "grpc": gresp.Outputs[0].Contents.Fp32Contents} {
				if len(got) != len(body.Want) {
					t.Fatalf("%s over %s: %d scores for %d rows", name, how, len(got), len(body.Want))
				}
				for r, want := range body.Want {
					d := math.Abs(float64(got[r]) - want)
					if !(d <= 1e-5) {
						t.Fatalf("%s over %s: row %d scores %.8f, PyTorch %.8f", name, how, r, got[r], want)
					}
					worst = math.Max(worst, d)
				}
			}
			rows += len(body.Want)
		}
		f.Close()
		if rows < 1000 {
			t.Fatalf("%s: only %d rows compared", name, rows)
		}
		t.Logf("%s: %d rows over HTTP and gRPC, max |score − PyTorch's| = %.2g", name, rows, worst)
	}
}
