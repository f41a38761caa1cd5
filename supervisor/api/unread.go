package api

import (
	"io"
	"net/http"
	"sync/atomic"
	"time"
)

// unreadBodies keeps a request whose body its handler leaves unread from
// holding its connection. net/http reads what is left of such a body at
// the client's pace, up to 256 KiB, so that the connection can serve
// another request: before it writes the answer, and again once the handler
// has returned — until the read timeout (30 s). A client without the token
// that declared a body and sent one byte of it held one of the listener's
// slots for 30 s with its 401 already answered, and enough of them (the
// reserve's too, with a probe path and a body) starved /healthz and
// /readyz. Now an answer to a request whose body is unread closes its
// connection (Connection: close, set before the header goes out, so
// nothing is read before the answer), and once the handler returns what
// is left of the body is not waited for (the read deadline moves to now).
func unreadBodies(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			h.ServeHTTP(w, r)
			return
		}
		b := &eofBody{ReadCloser: r.Body}
		r.Body = b
		h.ServeHTTP(&closeIfUnread{ResponseWriter: w, body: b}, r)
		if !b.eof.Load() {
			_ = http.NewResponseController(w).SetReadDeadline(time.Now())
		}
	})
}

// eofBody is a request body that knows whether it was read to its end.
type eofBody struct {
	io.ReadCloser
	eof atomic.Bool
}

func (b *eofBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof.Store(true)
	}
	return n, err
}

// closeIfUnread sets Connection: close on an answer written while the
// request's body is unread.
type closeIfUnread struct {
	http.ResponseWriter
	body  *eofBody
	wrote bool
}

func (c *closeIfUnread) header() {
	if !c.wrote {
		c.wrote = true
		if !c.body.eof.Load() {
			c.ResponseWriter.Header().Set("Connection", "close")
		}
	}
}

func (c *closeIfUnread) WriteHeader(code int) {
	c.header()
	c.ResponseWriter.WriteHeader(code)
}

func (c *closeIfUnread) Write(p []byte) (int, error) {
	c.header()
	return c.ResponseWriter.Write(p)
}

func (c *closeIfUnread) Flush() {
	c.header()
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (c *closeIfUnread) Unwrap() http.ResponseWriter { return c.ResponseWriter }
