package api

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
)

// requireToken protects h with the --http-token-file bearer token (no token
// configured: h as is). The comparison takes the same time whatever the
// guess: both sides are hashed first, then compared in constant time.
func (s *Server) requireToken(h http.Handler) http.Handler {
	if s.tokenHash == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		sum := sha256.Sum256([]byte(strings.TrimSpace(got)))
		if !ok || subtle.ConstantTimeCompare(sum[:], s.tokenHash) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="supervisor"`)
			writeJSON(w, http.StatusUnauthorized, map[string]any{"error": "missing or wrong bearer token (Authorization: Bearer TOKEN, the content of --http-token-file)"})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// loadToken reads the bearer token of --http-token-file: the file's content
// without surrounding whitespace, which must not be empty.
func loadToken(path string) ([]byte, error) {
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--http-token-file: %w", err)
	}
	tok := bytes.TrimSpace(b)
	if len(tok) == 0 {
		return nil, fmt.Errorf("--http-token-file %s is empty; put the bearer token in it", path)
	}
	sum := sha256.Sum256(tok)
	return sum[:], nil
}

// IsLoopbackAddr reports whether a listen address binds only loopback:
// 127.0.0.0/8, ::1 or localhost. An empty host (all interfaces) is not.
func IsLoopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
