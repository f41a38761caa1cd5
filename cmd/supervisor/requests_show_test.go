package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agent-sidecar/supervisor/supervisor/requests"
)

// `requests show` of a cancelled request whose agent answered later with
// an error shows that late error, as GET's late_answer does; before, it
// printed "late answer kept beside the status:" and nothing after it (only
// late data was printed).
func TestRequestsShowLateError(t *testing.T) {
	dir := t.TempDir()
	j, _, err := requests.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	j.Start(func() []*requests.Record { return nil }, nil)
	now := time.Now().UnixNano()
	if err := j.Append(
		&requests.Record{Kind: requests.KindAccepted, ID: "r1", Body: json.RawMessage(`{"message":"x"}`), At: now, Deadline: now + int64(time.Hour)},
		&requests.Record{Kind: requests.KindCancelled, ID: "r1", At: now + 1},
		&requests.Record{Kind: requests.KindAnswered, ID: "r1", At: now + 2, Error: &requests.ErrorBody{Code: "TOOL_FAILED", Message: "the tool timed out"}},
	).Wait(); err != nil {
		t.Fatal(err)
	}
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, nil, "requests", "show", "r1", "--data-dir", dir)
	if code != 0 {
		t.Fatalf("requests show: exit %d, %s", code, errOut)
	}
	if !strings.Contains(out, "status:     cancelled") || !strings.Contains(out, "TOOL_FAILED") || !strings.Contains(out, "the tool timed out") {
		t.Errorf("requests show of a cancelled request with a late error answer:\n%s\nwant the late error (TOOL_FAILED: the tool timed out) shown", out)
	}
}
