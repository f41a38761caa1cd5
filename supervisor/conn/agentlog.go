package conn

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
)

// Agents that log structured text should not end up as a quoted string
// nested inside our own structured line (line="time=... msg=\"hi\""). A
// line that is a JSON object, or logfmt (key=value pairs, what slog's text
// handler writes), becomes a group: line.msg=hi in text, "line":{"msg":"hi"}
// in JSON, nested JSON values embedded as JSON. Anything else stays a
// string. Lines are already capped by logLoop; these caps bound the work.
const (
	maxStructuredLine = 16 << 10
	maxLineFields     = 64
)

// agentLineAttr returns the attribute an agent's log line is logged under.
func agentLineAttr(line []byte) slog.Attr {
	line = bytes.TrimSpace(line)
	if len(line) <= maxStructuredLine {
		if attrs, ok := jsonFields(line); ok {
			return slog.Attr{Key: "line", Value: slog.GroupValue(attrs...)}
		}
		if attrs, ok := logfmtFields(string(line)); ok {
			return slog.Attr{Key: "line", Value: slog.GroupValue(attrs...)}
		}
	}
	return slog.String("line", string(line))
}

// rawJSON is a JSON value that the JSON handler embeds as is and the text
// handler prints as its JSON text.
type rawJSON []byte

func (r rawJSON) MarshalJSON() ([]byte, error) { return r, nil }
func (r rawJSON) MarshalText() ([]byte, error) { return r, nil }

// jsonFields splits a JSON object into its top-level fields, in order.
func jsonFields(b []byte) ([]slog.Attr, bool) {
	if len(b) < 2 || b[0] != '{' || !json.Valid(b) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if _, err := dec.Token(); err != nil { // {
		return nil, false
	}
	var attrs []slog.Attr
	for dec.More() {
		tok, err := dec.Token()
		key, ok := tok.(string)
		if err != nil || !ok || len(attrs) == maxLineFields {
			return nil, false
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, false
		}
		var s string
		if raw[0] == '"' && json.Unmarshal(raw, &s) == nil {
			attrs = append(attrs, slog.String(key, s))
		} else {
			attrs = append(attrs, slog.Any(key, rawJSON(raw)))
		}
	}
	return attrs, len(attrs) > 0
}

// logfmtFields parses `k=v k2="quoted v"` with at least two pairs (one
// pair alone, as in "retrying x=5", is too often plain prose).
func logfmtFields(s string) ([]slog.Attr, bool) {
	var attrs []slog.Attr
	for {
		s = strings.TrimLeft(s, " ")
		if s == "" {
			break
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || len(attrs) == maxLineFields {
			return nil, false
		}
		key := s[:eq]
		if strings.ContainsAny(key, " \t\"") {
			return nil, false
		}
		s = s[eq+1:]
		var val string
		if strings.HasPrefix(s, `"`) {
			q, err := strconv.QuotedPrefix(s)
			if err != nil {
				return nil, false
			}
			val, _ = strconv.Unquote(q)
			s = s[len(q):]
			if s != "" && s[0] != ' ' {
				return nil, false
			}
		} else {
			end := strings.IndexByte(s, ' ')
			if end < 0 {
				end = len(s)
			}
			val, s = s[:end], s[end:]
			if strings.ContainsRune(val, '"') {
				return nil, false
			}
		}
		attrs = append(attrs, slog.String(key, val))
	}
	return attrs, len(attrs) >= 2
}

// logLoop copies the agent's log stream line by line into our log. Lines are
// capped so an agent writing without newlines cannot grow our memory.
func (in *Instance) logLoop(f io.Reader, stream string) {
	defer in.logsEnd.Done()
	const maxLine = 64 << 10
	br := bufio.NewReaderSize(f, maxLine)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			if errors.Is(err, bufio.ErrBufferFull) {
				in.log.Info("agent output", "stream", stream, "line", string(trimNewline(line)), "truncated", true)
			} else {
				// Structured lines (JSON, key=value) become a group, not a
				// quoted string inside our line: agentlog.go.
				in.log.Info("agent output", slog.String("stream", stream), agentLineAttr(trimNewline(line)))
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			if !errors.Is(err, io.EOF) && !errors.Is(err, os.ErrClosed) {
				in.log.Debug("agent log stream ended", "stream", stream, "err", err)
			}
			return
		}
	}
}

func trimNewline(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
