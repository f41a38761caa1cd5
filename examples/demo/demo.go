// Package demo is the agent `supervisor run` supervises when it is given no
// agent command: small enough to read in one sitting, and busy enough that
// `supervisor checkpoints list`, `wal dump` and `audit` have something to
// show. It is a library with a [Main] so the supervisor binary can embed it
// (`supervisor demo-agent`), like the reference agent.
//
// It keeps a list of notes. Every few seconds it writes one ("note 7"), and
// it turns each POST /v1/requests message into a note too. It does what an
// agent under the supervisor must do, in the order that keeps state safe:
//
//   - a restore, when one is pending, is applied before anything else;
//   - every change is logged (a wal_entry) before it is made;
//   - a checkpoint of the whole state goes out about every 30 seconds, and a
//     final one on shutdown;
//   - heartbeats every second; its own log lines go to stderr, never stdout.
package demo

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/agent"
	"github.com/agent-sidecar/supervisor/schema"
)

// keepNotes bounds the state: older notes are forgotten.
const keepNotes = 100

// State is the agent's whole state, and the data of its checkpoints.
type State struct {
	AgentState struct {
		Status string `msgpack:"status"`
	} `msgpack:"agent_state"`
	Notes   []Note `msgpack:"notes"`
	Written int    `msgpack:"notes_written"` // every note ever written, forgotten ones included
	LastSeq uint64 `msgpack:"last_seq"`      // the highest WAL sequence applied
}

// Note is one remembered thing.
type Note struct {
	Seq  uint64 `msgpack:"seq"`
	Text string `msgpack:"text"`
}

type walEntry struct {
	Operation string         `msgpack:"operation"`
	Params    map[string]any `msgpack:"params"`
	Sequence  uint64         `msgpack:"sequence"`
}

// Main runs the demo agent and returns its exit code: 0 on shutdown or when
// the supervisor goes away, 1 when the connection broke, 2 for bad flags or
// when run by hand instead of by `supervisor run`.
func Main(args []string) int {
	fs := flag.NewFlagSet("demo-agent", flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	every := fs.Duration("note-every", 3*time.Second, "write a note this often")
	ckpt := fs.Duration("checkpoint-every", 30*time.Second, "send a checkpoint this often")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: supervisor demo-agent [--note-every D] [--checkpoint-every D]\n\n"+
			"The agent `supervisor run` supervises when no agent command is given. It is\n"+
			"started by the supervisor; run by hand it refuses politely.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 || *every <= 0 || *ckpt <= 0 {
		fmt.Fprintln(os.Stderr, "demo-agent: takes no arguments; --note-every and --checkpoint-every must be positive")
		return 2
	}
	// No time: the supervisor stamps every line it logs.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{ReplaceAttr: func(g []string, a slog.Attr) slog.Attr {
		if len(g) == 0 && a.Key == slog.TimeKey {
			return slog.Attr{}
		}
		return a
	}}))
	conn, err := agent.Connect(agent.Options{Logger: log})
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo-agent: %v\n", err)
		return 2
	}
	defer conn.Close()
	err = Run(context.Background(), conn, log, *every, *ckpt)
	switch {
	case err == nil, errors.Is(err, agent.ErrShutdown), errors.Is(err, agent.ErrSupervisorGone):
		log.Info("bye")
		return 0
	default:
		log.Error("stopping", "err", err)
		return 1
	}
}

// demo is the running agent: state behind a mutex, shared by the message
// loop and the note writer.
type demo struct {
	conn *agent.Conn
	log  *slog.Logger
	mu   sync.Mutex
	st   State
}

// Run is the agent on an established connection, until shutdown, the
// supervisor going away, or ctx ending.
func Run(ctx context.Context, conn *agent.Conn, log *slog.Logger, noteEvery, checkpointEvery time.Duration) error {
	d := &demo{conn: conn, log: log}
	d.st.AgentState.Status = "idle"
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// A pending restore is the first frame; nothing changes before it.
	restored := make(chan struct{})
	var once sync.Once
	if !conn.Config().RestorePending {
		close(restored)
		log.Info("fresh start: nothing to restore")
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { conn.Heartbeats(ctx, time.Second) })
	wg.Go(func() {
		select {
		case <-restored:
		case <-ctx.Done():
			return
		}
		d.work(ctx, noteEvery, checkpointEvery)
	})
	err := conn.Run(ctx, agent.Handlers{
		Restore: func(m *schema.Restore) error {
			defer once.Do(func() { close(restored) })
			return d.restore(m)
		},
		CheckpointAck: func(m *schema.CheckpointAck) {
			log.Info("checkpoint stored by the supervisor", "checkpoint_id", m.CheckpointID, "bytes", m.Size)
		},
		ProcessRequest: func(m *schema.ProcessRequest) {
			if err := d.remember("request: " + m.Data.Message); err != nil {
				log.Error("could not log the request", "err", err)
			}
		},
		Shutdown: func(m *schema.Shutdown) {
			cancel()
			if m.CreateCheckpoint {
				d.checkpoint("shutdown")
				wctx, stop := context.WithTimeout(context.Background(), 2*time.Second)
				defer stop()
				if _, err := conn.AwaitCheckpointAck(wctx); err != nil {
					log.Warn("final checkpoint not acknowledged", "err", err)
				}
			}
		},
	})
	cancel()
	return err
}

// work writes a note every noteEvery and checkpoints every checkpointEvery.
func (d *demo) work(ctx context.Context, noteEvery, checkpointEvery time.Duration) {
	notes, ckpts := time.NewTicker(noteEvery), time.NewTicker(checkpointEvery)
	defer notes.Stop()
	defer ckpts.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-notes.C:
			d.mu.Lock()
			n := d.st.Written + 1
			d.mu.Unlock()
			if err := d.remember(fmt.Sprintf("note %d", n)); err != nil {
				d.log.Warn("note not written", "err", err)
			}
		case <-ckpts.C:
			d.checkpoint("periodic")
		}
	}
}

// remember logs a note in the WAL, then applies it: log before acting.
func (d *demo) remember(text string) error {
	if len(text) > 1000 {
		text = text[:1000]
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	seq := d.st.LastSeq + 1
	d.log.Info("remembering", "seq", seq, "text", text)
	if err := d.conn.SendWAL("memory_add", map[string]any{"text": text}, seq); err != nil {
		return err
	}
	d.apply(Note{Seq: seq, Text: text})
	return nil
}

func (d *demo) apply(n Note) {
	d.st.Notes = append(d.st.Notes, n)
	if len(d.st.Notes) > keepNotes {
		d.st.Notes = append([]Note(nil), d.st.Notes[len(d.st.Notes)-keepNotes:]...)
	}
	d.st.Written++
	d.st.LastSeq = n.Seq
}

func (d *demo) checkpoint(why string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.log.Info("sending a checkpoint", "why", why, "notes", len(d.st.Notes), "last_seq", d.st.LastSeq)
	if err := d.conn.SendCheckpoint(d.st); err != nil {
		d.log.Warn("checkpoint not sent", "err", err)
	}
}

// restore replaces the state by the snapshot and replays the WAL after it.
func (d *demo) restore(m *schema.Restore) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if m.CheckpointID != "" {
		var st State
		if err := msgpack.Unmarshal(m.Snapshot, &st); err != nil {
			return fmt.Errorf("snapshot of checkpoint %s: %w", m.CheckpointID, err)
		}
		d.st = st
		if d.st.AgentState.Status == "" {
			d.st.AgentState.Status = "idle" // a checkpoint must carry a valid status
		}
	}
	replayed := 0
	for _, raw := range m.WALEntries {
		var e walEntry
		if err := msgpack.Unmarshal(raw, &e); err != nil {
			return fmt.Errorf("WAL entry: %w", err)
		}
		if e.Sequence <= d.st.LastSeq {
			continue
		}
		text, _ := e.Params["text"].(string)
		d.apply(Note{Seq: e.Sequence, Text: text})
		replayed++
	}
	last := "-"
	if n := len(d.st.Notes); n > 0 {
		last = d.st.Notes[n-1].Text
	}
	d.log.Info("restored", "checkpoint_id", orNone(m.CheckpointID), "wal_entries_replayed", replayed,
		"notes_written", d.st.Written, "last_seq", d.st.LastSeq, "last_note", last)
	return nil
}

func orNone(s string) string {
	if s == "" {
		return "(none: WAL only)"
	}
	return s
}
