package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/cumulus-serving/cumulus/model"
	"github.com/cumulus-serving/cumulus/router"
	"github.com/cumulus-serving/cumulus/server"
	"github.com/cumulus-serving/cumulus/server/kservepb"
)

// failing answers every request with err.
type failing struct{ err error }

func (f failing) Predict(context.Context, *router.Request) (*router.Response, error) {
	return nil, f.err
}
func (failing) Ready() bool     { return true }
func (failing) Revision() int64 { return 1 }
func (failing) Model(name string) (router.ModelStatus, bool) {
	return router.ModelStatus{Name: name, Ready: true, Live: 3, Versions: []uint64{3}, Shape: model.Shape{Type: model.LR}}, name == "m"
}

// TestFailureReasonAndID: a failure with a detail (a shard's, with its
// address) is answered with its code and reason only, and a request id:
// the client's KServe id when it is one a log line carries, else one
// made; gRPC gives it in the message and the x-request-id trailer, HTTP
// in the body and the X-Request-Id header. A failure of the client's own
// input is told as it is.
func TestFailureReasonAndID(t *testing.T) {
	detail := fmt.Errorf("router: %w: shard s3: dial tcp 10.1.2.3:7100: connect: connection refused", router.ErrUnavailable)
	s, client := startFront(t, server.Options{}, failing{err: router.WithReason("partition 12 unavailable", detail)})
	req := func(id string) *kservepb.ModelInferRequest {
		return &kservepb.ModelInferRequest{ModelName: "m", Id: id, Inputs: []*kservepb.ModelInferRequest_InferInputTensor{
			{Name: "ids", Datatype: "INT64", Shape: []int64{1}, Contents: &kservepb.InferTensorContents{Int64Contents: []int64{5}}},
			{Name: "row_splits", Datatype: "INT64", Shape: []int64{2}, Contents: &kservepb.InferTensorContents{Int64Contents: []int64{0, 1}}}}}
	}
	for _, c := range []struct{ sent, want string }{
		{"my-request-1", "my-request-1"},
		{"", ""},
		{"bad\nid", ""},
		{strings.Repeat("x", 200), ""},
	} {
		var trailer metadata.MD
		_, err := client.ModelInfer(context.Background(), req(c.sent), grpc.Trailer(&trailer))
		st := status.Convert(err)
		got := trailer.Get("x-request-id")
		if st.Code() != codes.Unavailable || len(got) != 1 || st.Message() != "partition 12 unavailable (request id "+got[0]+")" {
			t.Fatalf("client id %q: %v, trailer %v", c.sent, err, trailer)
		}
		if c.want != "" && got[0] != c.want || c.want == "" && (got[0] == c.sent || len(got[0]) > 16) {
			t.Fatalf("client id %q: request id %q", c.sent, got[0])
		}
	}
	for _, sent := range []string{"my-request-2", ""} {
		body := `{"inputs":[{"name":"ids","datatype":"INT64","shape":[1],"data":[5]},{"name":"row_splits","datatype":"INT64","shape":[2],"data":[0,1]}]}`
		if sent != "" {
			body = `{"id":"` + sent + `",` + body[1:]
		}
		resp, err := http.Post("http://"+s.HTTPAddr()+"/v2/models/m/infer", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var got map[string]string
		json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		id := resp.Header.Get("X-Request-Id")
		if resp.StatusCode != http.StatusServiceUnavailable || got["error"] != "partition 12 unavailable" || got["id"] != id || id == "" || sent != "" && id != sent {
			t.Fatalf("HTTP, client id %q: %s %v, header id %q", sent, resp.Status, got, id)
		}
	}
	// The client's own fault is told whole.
	code, body := post(t, s, "/v2/models/m/infer", `{"inputs":[]}`)
	if code != http.StatusBadRequest || !strings.Contains(body, `missing input \"row_splits\"`) {
		t.Fatalf("a request without inputs: %d %s", code, body)
	}
}
