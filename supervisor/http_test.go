package supervisor

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testHTTP returns a supervisor's handler, not running (no agent).
func testHTTP(t *testing.T, mutate func(*Config)) http.Handler {
	t.Helper()
	cfg := DefaultConfig()
	cfg.DataDir = t.TempDir()
	cfg.Command = []string{"/bin/true"}
	if mutate != nil {
		mutate(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s.api.Handler()
}

func do(t *testing.T, h http.Handler, method, target, token, body string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	b, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(b)
}

func TestRequestWaitParameter(t *testing.T) {
	h := testHTTP(t, nil)
	for _, c := range []struct {
		wait string
		code int
		want string
	}{
		{"abc", 400, "not a duration"},
		{"30", 400, "not a duration"},
		{"6m", 400, "out of range"},
		{"-1s", 400, "out of range"},
		{"5m", 503, "request journal is not open"}, // valid: the journal (opened by Run) is the next problem
	} {
		code, body := do(t, h, "POST", "/v1/requests?wait="+c.wait, "", `{"message":"hi"}`)
		if code != c.code || !strings.Contains(body, c.want) {
			t.Errorf("wait=%s: %d %s; want %d and %q", c.wait, code, body, c.code, c.want)
		}
	}
}

func TestRequestAPIToken(t *testing.T) {
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := testHTTP(t, func(c *Config) { c.HTTPTokenFile = file })
	for _, c := range []struct {
		name, method, path, token string
		code                      int
	}{
		{"POST without a token", "POST", "/v1/requests", "", 401},
		{"POST with a wrong token", "POST", "/v1/requests", "s3cret2", 401},
		{"POST with a token prefix", "POST", "/v1/requests", "s3cre", 401},
		{"GET without a token", "GET", "/v1/requests/x", "", 401},
		{"POST with the token", "POST", "/v1/requests", "s3cret", 503}, // authorized; no agent
		{"GET with the token", "GET", "/v1/requests/x", "s3cret", 404},
		{"healthz stays open", "GET", "/healthz", "", 200},
		{"readyz stays open", "GET", "/readyz", "", 503},
		{"metrics stay open", "GET", "/metrics", "", 200},
	} {
		code, body := do(t, h, c.method, c.path, c.token, `{"message":"hi"}`)
		if code != c.code {
			t.Errorf("%s: %d %s, want %d", c.name, code, body, c.code)
		}
	}
	// The Authorization header must say Bearer.
	req := httptest.NewRequest("POST", "/v1/requests", strings.NewReader(`{"message":"hi"}`))
	req.Header.Set("Authorization", "Basic s3cret")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 401 || rec.Header().Get("WWW-Authenticate") == "" {
		t.Errorf("Basic auth: %d %v", rec.Code, rec.Header())
	}
}

func TestHTTPAddrNeedsTokenOrPermission(t *testing.T) {
	token := filepath.Join(t.TempDir(), "token")
	os.WriteFile(token, []byte("t"), 0o600)
	empty := filepath.Join(t.TempDir(), "empty")
	os.WriteFile(empty, []byte("\n"), 0o600)
	for _, c := range []struct {
		addr, token string
		allow       bool
		wantErr     string
	}{
		{"127.0.0.1:9464", "", false, ""},
		{"[::1]:9464", "", false, ""},
		{"localhost:9464", "", false, ""},
		{"", "", false, ""},
		{"0.0.0.0:9464", "", false, "not a loopback address"},
		{":9464", "", false, "not a loopback address"},
		{"10.1.2.3:9464", "", false, "--http-allow-remote"},
		{"0.0.0.0:9464", "", true, ""},
		{"0.0.0.0:9464", token, false, ""},
		{"127.0.0.1:9464", empty, false, "is empty"},
		{"127.0.0.1:9464", "/nonexistent/token", false, "--http-token-file"},
	} {
		cfg := DefaultConfig()
		cfg.DataDir = t.TempDir()
		cfg.Command = []string{"/bin/true"}
		cfg.HTTPAddr, cfg.HTTPTokenFile, cfg.HTTPAllowRemote = c.addr, c.token, c.allow
		_, err := New(cfg)
		switch {
		case c.wantErr == "" && err != nil:
			t.Errorf("%q token %q allow %v: %v", c.addr, c.token, c.allow, err)
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr) || !errors.Is(err, ErrConfig)):
			t.Errorf("%q token %q allow %v: %v, want a configuration error containing %q", c.addr, c.token, c.allow, err, c.wantErr)
		}
	}
}

func TestRequestRetentionMustBePositive(t *testing.T) {
	cfg := DefaultConfig()
	cfg.DataDir, cfg.Command, cfg.RequestRetention = t.TempDir(), []string{"/bin/true"}, -time.Second
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "--request-retention") {
		t.Errorf("New with a negative retention: %v", err)
	}
}
