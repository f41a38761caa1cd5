// Package demo is the example agent: the one `supervisor run` supervises
// when it is given no agent command, and the one to copy when writing an
// agent in Go. It is a library with a [Main] so the supervisor binary can
// embed it (`supervisor demo-agent`); a program of your own calls the same
// things from its func main.
//
// It keeps a list of notes. Every few seconds it writes one ("note 7"), and
// it turns each POST /v1/requests message into a note and answers with the
// note's number. It does what an agent under the supervisor must do, in the
// order that keeps state safe:
//
//   - a restore, when one is pending, is applied before anything else;
//   - every change is logged (a durable wal_entry, [agent.Conn.Log]) before
//     it is made;
//   - a checkpoint of the whole state goes out about every 30 seconds, and a
//     final one on shutdown;
//   - heartbeats every second; its own log lines go to stderr, never stdout.
//
// One goroutine owns the state: the select loop in [Run] takes the
// supervisor's messages from [agent.Conn.Messages] and its own timers alike.
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

// finalAckWait bounds the wait for the final checkpoint's ack on shutdown.
const finalAckWait = 2 * time.Second

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

// demo is the running agent. Only Run's goroutine touches it.
type demo struct {
	conn    *agent.Conn
	log     *slog.Logger
	st      State
	unacked int // checkpoints sent and not yet acknowledged
}

// Run is the agent on an established connection, until shutdown
// ([agent.ErrShutdown]), the supervisor going away, or ctx ending.
func Run(ctx context.Context, conn *agent.Conn, log *slog.Logger, noteEvery, checkpointEvery time.Duration) error {
	d := &demo{conn: conn, log: log}
	d.st.AgentState.Status = "idle"
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { conn.Heartbeats(ctx, time.Second) })

	// A pending restore is the first message; nothing changes before it.
	restoring := conn.Config().RestorePending
	if !restoring {
		log.Info("fresh start: nothing to restore")
	}
	// After shutdown, only the acks of the checkpoints sent matter, for a
	// little while.
	var stopping <-chan time.Time
	notes, checkpoints := time.NewTicker(noteEvery), time.NewTicker(checkpointEvery)
	defer notes.Stop()
	defer checkpoints.Stop()
	for {
		idle := restoring || stopping != nil
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stopping:
			log.Warn("final checkpoint not acknowledged", "waited", finalAckWait)
			return agent.ErrShutdown
		case <-notes.C:
			if idle {
				break
			}
			if _, err := d.remember(ctx, fmt.Sprintf("note %d", d.st.Written+1)); err != nil && !errors.Is(err, agent.ErrNotDurable) {
				return err
			}
		case <-checkpoints.C:
			if !idle {
				d.checkpoint("periodic")
			}
		case m, ok := <-conn.Messages():
			if !ok {
				return conn.Err()
			}
			switch m := m.(type) {
			case *schema.Restore:
				if err := d.restore(m); err != nil {
					_ = conn.SendError(agent.CodeRestoreFailed, err.Error()) // the agent stops either way
					return err
				}
				restoring = false
			case *schema.ProcessRequest:
				if err := d.answer(ctx, m, idle); err != nil {
					return err
				}
			case *schema.CheckpointAck:
				d.unacked--
				log.Info("checkpoint stored by the supervisor", "checkpoint_id", m.CheckpointID, "bytes", m.Size)
			case *schema.Error:
				if m.Error.Code == schema.CodeCheckpointFailed {
					d.unacked--
				}
				log.Warn("the supervisor reported an error", "code", m.Error.Code, "message", m.Error.Message)
			case *schema.Shutdown:
				if !m.CreateCheckpoint || restoring {
					return agent.ErrShutdown
				}
				d.checkpoint("shutdown")
				stopping = time.After(finalAckWait)
			}
			if stopping != nil && d.unacked == 0 { // every checkpoint sent is answered
				return agent.ErrShutdown
			}
		}
	}
}

// answer turns a request into a note and tells the caller its number.
func (d *demo) answer(ctx context.Context, m *schema.ProcessRequest, idle bool) error {
	if idle {
		return d.conn.SendRequestError(m.RequestID, "NOT_READY", "the agent is restoring its state, or stopping")
	}
	seq, err := d.remember(ctx, "request: "+m.Data.Message)
	if errors.Is(err, agent.ErrNotDurable) {
		return d.conn.SendRequestError(m.RequestID, "NOT_LOGGED", err.Error())
	}
	if err != nil {
		return err
	}
	return d.conn.SendRequestResult(m.RequestID, map[string]any{"note": seq})
}

// remember logs a note in the WAL and, once the supervisor has it on disk,
// applies it: log before acting. A note the supervisor could not log
// (WAL_FULL, say) is not applied, and the agent carries on; any other error
// means the connection is gone.
func (d *demo) remember(ctx context.Context, text string) (uint64, error) {
	if len(text) > 1000 {
		text = text[:1000]
	}
	seq := d.st.LastSeq + 1
	d.log.Info("remembering", "seq", seq, "text", text)
	if err := d.conn.Log(ctx, "memory_add", map[string]any{"text": text}, seq); err != nil {
		if errors.Is(err, agent.ErrNotDurable) {
			d.log.Warn("note not logged, so not kept", "seq", seq, "err", err)
		}
		return 0, err
	}
	d.apply(Note{Seq: seq, Text: text})
	return seq, nil
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
	d.log.Info("sending a checkpoint", "why", why, "notes", len(d.st.Notes), "last_seq", d.st.LastSeq)
	if err := d.conn.SendCheckpoint(d.st); err != nil {
		d.log.Warn("checkpoint not sent", "err", err)
		return
	}
	d.unacked++
}

// restore replaces the state by the snapshot and replays the WAL after it.
func (d *demo) restore(m *schema.Restore) error {
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
