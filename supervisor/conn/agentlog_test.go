package conn

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestAgentLinesAreEmbeddedNotNestedAsStrings(t *testing.T) {
	render := func(json bool, line string) string {
		var b bytes.Buffer
		opts := &slog.HandlerOptions{ReplaceAttr: func(g []string, a slog.Attr) slog.Attr {
			if len(g) == 0 && (a.Key == slog.TimeKey || a.Key == slog.LevelKey) {
				return slog.Attr{}
			}
			return a
		}}
		var h slog.Handler = slog.NewTextHandler(&b, opts)
		if json {
			h = slog.NewJSONHandler(&b, opts)
		}
		slog.New(h).Info("agent output", slog.String("stream", "stderr"), agentLineAttr([]byte(line)))
		return strings.TrimSpace(b.String())
	}
	for _, c := range []struct {
		name, line string
		json       bool
		want       string
	}{
		{"JSON line, JSON log", `{"level":"info","msg":"hi there","n":3,"ctx":{"a":[1,2]}}`, true,
			`{"msg":"agent output","stream":"stderr","line":{"level":"info","msg":"hi there","n":3,"ctx":{"a":[1,2]}}}`},
		{"JSON line, text log", `{"msg":"hi there","n":3}`, false,
			`msg="agent output" stream=stderr line.msg="hi there" line.n=3`},
		{"logfmt line, text log", `time=2026-11-23T09:00:00Z level=INFO msg="note stored" seq=4`, false,
			`msg="agent output" stream=stderr line.time=2026-11-23T09:00:00Z line.level=INFO line.msg="note stored" line.seq=4`},
		{"logfmt line, JSON log", `level=WARN msg="slow \"disk\""`, true,
			`{"msg":"agent output","stream":"stderr","line":{"level":"WARN","msg":"slow \"disk\""}}`},
		{"prose stays a string", `Traceback (most recent call last): x=1`, false,
			`msg="agent output" stream=stderr line="Traceback (most recent call last): x=1"`},
		{"broken JSON stays a string", `{"msg": "cut`, true,
			`{"msg":"agent output","stream":"stderr","line":"{\"msg\": \"cut"}`},
	} {
		if got := render(c.json, c.line); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
}
