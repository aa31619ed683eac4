package server

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"unicode"

	"github.com/cumulus-serving/cumulus/router"
)

// A failed request is answered with its code, a short reason and a
// request id; the detail (which shard failed, at which address, the
// transport's message) is logged under that id, never sent
// (router.Reason). The id is the KServe id the client sent, when it is
// one a log line can carry, else one made here; it comes back in the
// answer (the status message and the x-request-id trailer, or the HTTP
// error body's "id" and the X-Request-Id header).

// headerRequestID carries a failed request's id.
const headerRequestID = "X-Request-Id"

// maxRequestID bounds a client's id used as the request id.
const maxRequestID = 128

// requestID is the id of a request whose client sent id.
func requestID(id string) string {
	if id != "" && len(id) <= maxRequestID && printable(id) {
		return id
	}
	return strconv.FormatUint(rand.Uint64(), 16)
}

func printable(s string) bool {
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// told is what the client of a request that failed with err is told,
// and its detail is logged under id when the client is not told it.
func (s *Server) told(ctx context.Context, api, model, id string, err error) string {
	reason := router.Reason(err)
	if router.Detailed(err) {
		slog.WarnContext(ctx, "server: request failed", "id", id, "api", api, "model", model, "code", classify(err).label, "err", err.Error())
	}
	return reason
}
