package api

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
)

// requireToken protects h with the --http-token-file bearer token (no token
// configured: h as is). The comparison takes the same time whatever the
// guess: both sides are hashed first, then compared in constant time.
func (s *Server) requireToken(h http.Handler) http.Handler {
	if s.tokenHash == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := bearerToken(r.Header.Get("Authorization"))
		sum := sha256.Sum256([]byte(got))
		if !ok || subtle.ConstantTimeCompare(sum[:], s.tokenHash) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="supervisor"`)
			// An unauthenticated client does not keep its connection: it
			// would hold one of the listener's slots (server.go, connPool).
			w.Header().Set("Connection", "close")
			writeJSON(w, http.StatusUnauthorized, map[string]any{"error": "missing or wrong bearer token (Authorization: Bearer TOKEN, the content of --http-token-file)"})
			return
		}
		h.ServeHTTP(w, r)
	})
}

// bearerToken returns the credentials of an Authorization header with the
// Bearer scheme. The scheme is case-insensitive (RFC 9110 §11.1: "bearer",
// "BEARER" are Bearer) and is followed by one or more spaces.
func bearerToken(h string) (string, bool) {
	scheme, cred, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(cred), true
}

// ErrInsecureTokenFile: the --http-token-file can be read by users other
// than the supervisor's (see CheckTokenFile).
var ErrInsecureTokenFile = errors.New("the token file can be read by other users")

// CheckTokenFile refuses a token file that users other than the
// supervisor's can read, as ssh refuses an unprotected private key: its mode
// must give nothing to group and others (0600, 0400). One exception: a file
// owned by root that root shares with a non-root supervisor through the
// file's group, read-only and nothing for others (0440, 0040) — how root
// hands a service a credential, and how Kubernetes mounts a Secret for a
// pod with fsGroup. The error wraps ErrInsecureTokenFile and says how to
// fix it; a file that cannot be read is an error too.
func CheckTokenFile(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("--http-token-file: %w", err)
	}
	owner := uint32(os.Getuid())
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		owner = st.Uid
	}
	if tokenModeOK(fi.Mode(), owner, uint32(os.Geteuid())) {
		return nil
	}
	return fmt.Errorf("%w: --http-token-file %s has mode %04o (group or others may read it); "+
		"run `chmod 600 %s` (only its owner may read it), or give --allow-insecure-token-file to use it anyway",
		ErrInsecureTokenFile, path, fi.Mode().Perm(), path)
}

// tokenModeOK is CheckTokenFile's rule: mode of a file owned by owner, read
// by a process running as me.
func tokenModeOK(mode fs.FileMode, owner, me uint32) bool {
	perm := mode.Perm()
	if perm&0o077 == 0 {
		return true
	}
	// root's file, shared read-only with us through its group.
	return owner == 0 && me != 0 && perm&0o037 == 0
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
