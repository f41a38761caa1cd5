// Package logging gives the supervisor a logger that never blocks it: each
// record is formatted by a standard slog handler into memory and handed to
// one writer goroutine through a buffer bounded in bytes. When the output
// does not keep up (a stalled log shipper, a stderr pipe nobody reads),
// records that do not fit are dropped and counted, and the supervisor goes
// on. Attribute strings longer than a cap are cut, so no record is large.
package logging

import (
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agent-sidecar/supervisor/internal/clip"
)

// Defaults for zero Options fields.
const (
	DefaultBufferBytes = 1 << 20
	DefaultMaxValue    = 2 << 10
)

// Options configure New.
type Options struct {
	Format      string     // "json" or text (default)
	Level       slog.Level // minimum level
	BufferBytes int        // bytes of formatted records waiting for the writer; default 1 MiB
	MaxValue    int        // longest string attribute value kept, in bytes; default 2 KiB
}

// Async is the bounded buffer between the loggers and the output: an
// io.Writer whose Write never blocks. Its writer goroutine is owned by it
// and ends on Close.
type Async struct {
	out io.Writer
	max int

	mu      sync.Mutex
	queue   [][]byte
	queued  int
	closed  bool
	wake    chan struct{} // capacity 1: records are waiting
	done    chan struct{} // closed when the writer goroutine has ended
	dropped atomic.Uint64
	werr    atomic.Uint64
}

// NewAsync starts the writer goroutine for out with a buffer of max bytes.
func NewAsync(out io.Writer, max int) *Async {
	if max <= 0 {
		max = DefaultBufferBytes
	}
	a := &Async{out: out, max: max, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go a.run()
	return a
}

// Write queues one formatted record. It never blocks on the output: a
// record that does not fit in the buffer is dropped and counted.
func (a *Async) Write(p []byte) (int, error) {
	a.mu.Lock()
	if a.closed || a.queued+len(p) > a.max {
		a.mu.Unlock()
		a.dropped.Add(1)
		return len(p), nil
	}
	a.queue = append(a.queue, append([]byte(nil), p...))
	a.queued += len(p)
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
	return len(p), nil
}

// Dropped returns how many records were dropped so far.
func (a *Async) Dropped() uint64 { return a.dropped.Load() }

// Buffered returns the bytes waiting for the output now.
func (a *Async) Buffered() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.queued
}

func (a *Async) run() {
	defer close(a.done)
	for {
		a.mu.Lock()
		batch := a.queue
		a.queue = nil
		closed := a.closed
		a.mu.Unlock()
		for _, rec := range batch {
			if _, err := a.out.Write(rec); err != nil {
				a.werr.Add(1)
			}
			a.mu.Lock()
			a.queued -= len(rec)
			a.mu.Unlock()
		}
		if closed && len(batch) == 0 {
			return
		}
		if len(batch) == 0 {
			<-a.wake
		}
	}
}

// Close stops accepting records and waits up to timeout for the buffered
// ones to be written. It reports false when the output did not take them in
// time (the writer goroutine then ends as soon as its blocked write returns,
// or with the process).
func (a *Async) Close(timeout time.Duration) bool {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	select {
	case a.wake <- struct{}{}:
	default:
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-a.done:
		return true
	case <-t.C:
		return false
	}
}

// New returns a logger writing to out through an Async buffer.
func New(out io.Writer, o Options) (*slog.Logger, *Async) {
	a := NewAsync(out, o.BufferBytes)
	return slog.New(NewHandler(a, o)), a
}

// NewHandler returns the standard text or JSON handler over w, with every
// string value (and error text) longer than o.MaxValue cut.
func NewHandler(w io.Writer, o Options) slog.Handler {
	maxValue := o.MaxValue
	if maxValue <= 0 {
		maxValue = DefaultMaxValue
	}
	ho := &slog.HandlerOptions{Level: o.Level, ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		return clipAttr(a, maxValue)
	}}
	if o.Format == "json" {
		return slog.NewJSONHandler(w, ho)
	}
	return slog.NewTextHandler(w, ho)
}

func clipAttr(a slog.Attr, n int) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindString:
		if s := a.Value.String(); len(s) > n {
			a.Value = slog.StringValue(Clip(s, n))
		}
	case slog.KindAny:
		if err, ok := a.Value.Any().(error); ok {
			if s := err.Error(); len(s) > n {
				a.Value = slog.StringValue(Clip(s, n))
			}
		}
	}
	return a
}

// Clip returns s cut to at most n bytes on a rune boundary, marked with the
// original length when cut (clip.String).
func Clip(s string, n int) string { return clip.String(s, n) }
