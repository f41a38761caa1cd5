package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/supervisor/requests"
)

// An agent answers a request with an error code that is an escape
// sequence: set the terminal's title, clear the screen, and a C1 CSI
// (U+009B) that some terminals take as ESC [. `requests list` printed the
// code raw (clipped, not escaped), and `requests show` printed the C1
// control raw (encoding/json escapes only C0): an operator who listed the
// requests had their terminal driven by the agent. Now both print escapes.
func TestRequestsListEscapesTheAgentsControlCharacters(t *testing.T) {
	dir := t.TempDir()
	j, _, err := requests.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	j.Start(func() []*requests.Record { return nil }, nil)
	now := time.Now().UnixNano()
	code := "\x1b]0;pwned\x07\x1b[2J\u009b31mRED\r"
	if err := j.Append(
		&requests.Record{Kind: requests.KindAccepted, ID: "r1", Body: json.RawMessage(`{"message":"x"}`), At: now, Deadline: now + int64(time.Hour)},
		&requests.Record{Kind: requests.KindAnswered, ID: "r1", At: now + 2, Error: &requests.ErrorBody{Code: code, Message: "m\u009b2J"}},
	).Wait(); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"requests", "list"}, {"requests", "show", "r1"}} {
		c, out, errOut := runCLI(t, nil, append(args, "--data-dir", dir)...)
		if c != 0 {
			t.Fatalf("%s: exit %d, %s", strings.Join(args, " "), c, errOut)
		}
		if strings.ContainsAny(out, "\x1b\x07\r\u009b") {
			t.Errorf("%s printed the agent's control characters raw:\n%q", strings.Join(args, " "), out)
		}
		if !strings.Contains(out, `\u001b`) && !strings.Contains(out, `\u009b`) {
			t.Errorf("%s: the error code is not shown escaped:\n%q", strings.Join(args, " "), out)
		}
	}
}

func TestTermSafe(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain text\n\ttab", "plain text\n\ttab"},
		{"é ü 日本 🙂", "é ü 日本 🙂"},
		{"a\x1b[2Jb", `a\u001b[2Jb`},
		{"bell\x07 cr\r del\x7f", `bell\u0007 cr\u000d del\u007f`},
		{"c1 \u0085\u009b", `c1 \u0085\u009b`},
		{"bad \xff\xfe end", `bad \xff\xfe end`},
		{`{"k":"\u009b"}`, `{"k":"\u009b"}`}, // already escaped JSON: unchanged
	} {
		// Whole, and split at every byte: a rune cut between writes is kept whole.
		for split := 0; split <= len(c.in); split++ {
			var b bytes.Buffer
			w := newTermSafe(&b)
			if _, err := w.Write([]byte(c.in[:split])); err != nil {
				t.Fatal(err)
			}
			if _, err := w.Write([]byte(c.in[split:])); err != nil {
				t.Fatal(err)
			}
			if err := w.Flush(); err != nil {
				t.Fatal(err)
			}
			if b.String() != c.want {
				t.Errorf("%q split at %d: %q, want %q", c.in, split, b.String(), c.want)
			}
		}
	}
	// A JSON string holding a C1 control decodes to the same string after
	// escaping: --json output keeps its meaning.
	raw, _ := json.Marshal(map[string]string{"k": "x\u009by"})
	var b bytes.Buffer
	w := newTermSafe(&b)
	w.Write(raw)
	w.Flush()
	var back map[string]string
	if err := json.Unmarshal(b.Bytes(), &back); err != nil || back["k"] != "x\u009by" {
		t.Fatalf("escaped JSON %s decodes to %q, %v", b.String(), back["k"], err)
	}
}
