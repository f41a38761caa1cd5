package test

import (
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// A token file that group or others can read is refused at start, as ssh
// refuses an unprotected key, unless --allow-insecure-token-file, which
// logs a loud warning (issue 33 item 9).
func TestTokenFileReadableByOthersRefused(t *testing.T) {
	for _, mode := range []os.FileMode{0o644, 0o640, 0o604} {
		path := writeTokenFile(t, "tok", mode)
		s := startSup(t, supOpts{flags: []string{"--http-token-file", path}, noEvents: true})
		if code := s.wait(30 * time.Second); code != 2 {
			t.Errorf("token file mode %04o: exit %d, want 2 (configuration error)", mode, code)
		}
		if out := s.out.String(); !strings.Contains(out, "chmod 600 "+path) {
			t.Errorf("token file mode %04o: the refusal does not say `chmod 600 %s`:\n%s", mode, path, out)
		}
	}

	path := writeTokenFile(t, "tok", 0o644)
	s := startSup(t, supOpts{flags: []string{"--http-token-file", path, "--allow-insecure-token-file"}, noEvents: true})
	s.waitReady()
	s.waitOutput("INSECURE TOKEN FILE", 10*time.Second)
	if !strings.Contains(s.out.String(), "level=WARN") {
		t.Errorf("the insecure token file is not logged as a warning:\n%s", s.out.String())
	}
	if code, body := s.httpDo("POST", "/v1/requests", "tok", `{"message":"x"}`); code != http.StatusAccepted {
		t.Errorf("POST with the token of an allowed insecure file: %d %s", code, body)
	}
}

// The Authorization scheme is case-insensitive (RFC 9110 §11.1): bearer,
// BEARER and Bearer are one scheme (issue 33 item 9).
func TestBearerSchemeAnyCase(t *testing.T) {
	path := writeTokenFile(t, "tok", 0o600)
	s := startSup(t, supOpts{flags: []string{"--http-token-file", path}, noEvents: true})
	s.waitReady()
	for header, want := range map[string]int{
		"Bearer tok": 202, "bearer tok": 202, "BEARER tok": 202, "bEaReR  tok": 202,
		"bearer nope": 401, "Basic tok": 401, "tok": 401,
	} {
		req, err := http.NewRequest("POST", s.url("/v1/requests"), strings.NewReader(`{"message":"x"}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", header)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("Authorization: %s: %d, want %d", header, resp.StatusCode, want)
		}
		if want == 401 && !resp.Close {
			t.Errorf("Authorization: %s: 401 without closing the connection", header)
		}
	}
}

// The evolutions' evidence (hypotheses, answers) is behind the token like
// the request API.
func TestEvolutionsRequireToken(t *testing.T) {
	path := writeTokenFile(t, "tok", 0o600)
	s := startSup(t, supOpts{flags: []string{"--http-token-file", path}, noEvents: true})
	s.waitReady()
	for _, p := range []string{"/v1/evolutions", "/v1/evolutions/01234567-0000-0000-0000-000000000000"} {
		for header, want := range map[string]int{"": 401, "Bearer nope": 401, "Bearer tok": 200} {
			if p != "/v1/evolutions" && want == 200 {
				want = 404 // none recorded
			}
			req, _ := http.NewRequest("GET", s.url(p), nil)
			if header != "" {
				req.Header.Set("Authorization", header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Errorf("GET %s with %q: %d, want %d", p, header, resp.StatusCode, want)
			}
		}
	}
}
