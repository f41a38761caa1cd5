package api

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/supervisor/requests"
)

var (
	errRequestUnknown  = errors.New("no such request")
	errRequestAnswered = errors.New("request already answered")
)

// mirrored is a request also sent to the shadows of an evolution trial, and
// when. Mirrored copies are never journaled; the trial pairs the answers.
type mirrored struct {
	trial string
	sent  time.Time
}

// maxMirrored bounds the mirrored requests remembered for a trial's
// statistics; the oldest are forgotten beyond it.
const maxMirrored = 10000

// RequestTable is the API's view of the requests: the durable book
// (supervisor/requests: the journal and every request's state) and, during
// an evolution trial, the mirrored copies' timing. Safe for concurrent use.
type RequestTable struct {
	retention time.Duration
	met       *observe.Metrics
	now       func() time.Time
	book      atomic.Pointer[requests.Book]

	mu     sync.Mutex
	mirror map[string]*mirrored
	order  []string
}

func newRequestTable(retention time.Duration, met *observe.Metrics) *RequestTable {
	return &RequestTable{retention: retention, met: met, now: time.Now, mirror: map[string]*mirrored{}}
}

// Book is the request book, nil before the data directory is opened.
func (t *RequestTable) Book() *requests.Book { return t.book.Load() }

// SetBook attaches the request book (Run's open, before the API serves).
func (t *RequestTable) SetBook(b *requests.Book) { t.book.Store(b) }

// addMirror remembers that id was mirrored to trial's shadow.
func (t *RequestTable) addMirror(id, trial string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.mirror[id] = &mirrored{trial: trial, sent: t.now()}
	t.order = append(t.order, id)
	for len(t.order) > maxMirrored {
		delete(t.mirror, t.order[0])
		t.order = t.order[1:]
	}
}

// mirrorOf returns the trial id was mirrored to ("" when none).
func (t *RequestTable) mirrorOf(id string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if m := t.mirror[id]; m != nil {
		return m.trial
	}
	return ""
}
