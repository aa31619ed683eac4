// Package adminhttp is what every Cumulus admin API shares: the bearer
// token check and JSON answers. The manager's admin API and a shard's
// HTTP surface use it.
package adminhttp

import (
	"crypto/subtle"
	"encoding/json"
	"log/slog"
	"net/http"
)

// Auth refuses a call without "Authorization: Bearer token", comparing
// in constant time, with 401 and a warning naming who (the server) and
// the caller. It changes nothing, and calls h only when the token is
// right.
func Auth(who, token string, h http.HandlerFunc) http.HandlerFunc {
	want := []byte("Bearer " + token)
	return func(w http.ResponseWriter, r *http.Request) {
		if token == "" || subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			slog.Warn(who+": admin call refused: missing or wrong token", "from", r.RemoteAddr, "method", r.Method, "path", r.URL.Path)
			w.Header().Set("WWW-Authenticate", `Bearer realm="cumulus-admin"`)
			WriteError(w, http.StatusUnauthorized, "missing or wrong admin token (Authorization: Bearer TOKEN)")
			return
		}
		h(w, r)
	}
}

// WriteJSON answers v as indented JSON with status code.
func WriteJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// WriteError answers {"error": msg} with status code.
func WriteError(w http.ResponseWriter, code int, msg string) {
	WriteJSON(w, code, map[string]string{"error": msg})
}
