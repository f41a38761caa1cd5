package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// A request whose message is HTML or code was journaled with encoding/json's
// HTML escaping: each '<', '>' and '&' became six bytes (\u003c), so a
// 1 MiB body could weigh up to 6 MiB in the journal and of the 8 MiB of
// pending bodies held for delivery — and, under a small
// --request-journal-bytes, be refused with 429 "retry after 1 s" every
// time. It is journaled as the client sent it.
func TestHTMLBodyIsJournaledAtItsSize(t *testing.T) {
	dir := t.TempDir()
	s, b := requestServer(t, dir)
	msg := strings.Repeat("<p>a & b</p>", 20000) // 240,000 bytes, 100,000 of them escaped by default
	res := serveReq(s.Handler(), "POST", "/v1/requests", `{"message":"`+msg+`"}`)
	if res.code != http.StatusAccepted {
		t.Fatalf("POST: %d %s", res.code, res.body)
	}
	if n := b.Journal().Size(); n > int64(len(msg))+4096 {
		t.Fatalf("a %d-byte message takes %d bytes in the request journal", len(msg), n)
	}
}

// An agent's answer of HTML was converted to JSON with '<' as six bytes:
// 1 MiB of it made 6 MiB, over the 4 MiB one result may take, and the
// answer was refused (INVALID_MESSAGE "cannot be given to the HTTP client
// as JSON") — the request failed for an agent that answered in HTML. It is
// kept at its size now (the HTTP response escapes it as it is written).
func TestHTMLAnswerIsKeptAtItsSize(t *testing.T) {
	html := strings.Repeat("<b>&</b>", 130000) // 1,040,000 bytes; 4,290,000 escaped by default
	raw, err := msgpack.Marshal(map[string]any{"html": html})
	if err != nil {
		t.Fatal(err)
	}
	got, err := msgpackToJSON(raw)
	if err != nil {
		t.Fatalf("an answer of %d bytes of HTML: %v", len(html), err)
	}
	if len(got) > len(html)+64 {
		t.Fatalf("an answer of %d bytes of HTML is kept as %d bytes of JSON", len(html), len(got))
	}
	var back map[string]string
	if err := json.Unmarshal(got, &back); err != nil || back["html"] != html {
		t.Fatalf("the JSON kept does not decode to the answer: %v", err)
	}
}
