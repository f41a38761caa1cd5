package api

import (
	"fmt"
	"net"
	"net/http"
	"sync"
)

// maxWaitsPerClient caps the POST /v1/requests?wait= calls one client (one
// remote IP address) may have waiting at once; the listener's waits in all
// are capped at half its general connection slots. A request over a cap is
// still sent to the agent but answered 202 at once, as a wait that timed
// out: its result is fetched with GET /v1/requests/ID. A connection that
// waits holds a slot nobody else can take; these caps keep most of them for
// other clients.
const maxWaitsPerClient = 16

// waitLimiter counts the requests waiting for their result, per client and
// in all. Safe for concurrent use.
type waitLimiter struct {
	perClient, total int

	mu   sync.Mutex
	open map[string]int
	n    int
}

func newWaitLimiter(perClient, total int) *waitLimiter {
	return &waitLimiter{perClient: max(1, perClient), total: max(1, total), open: map[string]int{}}
}

// acquire takes a wait for r's client: ok with the release to call when the
// wait ends, or why not.
func (l *waitLimiter) acquire(r *http.Request) (release func(), why string, ok bool) {
	client := clientOf(r)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.open[client] >= l.perClient:
		return nil, fmt.Sprintf("%d requests from this client (%s) are waiting already, the most one client may have", l.open[client], client), false
	case l.n >= l.total:
		return nil, fmt.Sprintf("%d requests are waiting already, the most this listener holds", l.n), false
	}
	l.open[client]++
	l.n++
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.n--
		if l.open[client]--; l.open[client] <= 0 {
			delete(l.open, client)
		}
	}, "", true
}

// clientOf is the client a request counts against: its remote IP address.
func clientOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
