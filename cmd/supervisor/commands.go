package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/supervisor"
	"github.com/agent-sidecar/supervisor/supervisor/api"
	"github.com/agent-sidecar/supervisor/supervisor/observe"
	"github.com/agent-sidecar/supervisor/wal"
)

const defaultDataDir = "./supervisor-data"

const controlTimeout = 30 * time.Second

// statDataDir checks that a data directory exists, with one clear message
// when it does not (the path said once, and what to do).
func statDataDir(dataDir string) error {
	fi, err := os.Stat(dataDir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("no data directory at %s (has a supervisor run with this --data-dir? set it with --data-dir or SUPERVISOR_DATA_DIR)", dataDir)
	case err != nil:
		return fmt.Errorf("data directory %s: %v", dataDir, pathErr(err))
	case !fi.IsDir():
		return fmt.Errorf("%s is not a directory", dataDir)
	}
	return nil
}

// pathErr drops the path an *fs.PathError repeats ("stat DIR: ...").
func pathErr(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// openStore opens the checkpoint store for reading. It refuses to create a
// data directory that does not exist (a typo in --data-dir).
func openStore(dataDir string) (*checkpoint.Store, error) {
	if err := statDataDir(dataDir); err != nil {
		return nil, err
	}
	dir := filepath.Join(dataDir, "checkpoints")
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no checkpoint store in %s (has a supervisor ever run with this --data-dir?)", dataDir)
	}
	// Warnings (a checkpoint file that is a symlink, hence ignored) go to
	// stderr, beside the listing.
	warn := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	return checkpoint.Open(dir, checkpoint.Options{Logger: warn})
}

// checkpointsCmd is `supervisor checkpoints list|show`.
type checkpointsCmd struct{ env }

const checkpointsUsage = `Usage:
  supervisor checkpoints list [--data-dir DIR] [--json]
  supervisor checkpoints show ID [--data-dir DIR] [--json]

Read the checkpoint store, whether or not a supervisor runs.
`

func (c *checkpointsCmd) Run(_ context.Context, args []string) error {
	if len(args) == 0 {
		return &cliError{cmd: "checkpoints", err: errors.New("missing subcommand: list or show"), usage: true}
	}
	sub, args := args[0], args[1:]
	switch {
	case isHelpArg(sub):
		fmt.Fprint(c.stdout, checkpointsUsage)
		return nil
	case sub == "list":
		return c.list(args)
	case sub == "show":
		return c.show(args)
	}
	return usageErr("checkpoints", "unknown subcommand %q (want list or show)", truncate(sub, 40))
}

func (c *checkpointsCmd) list(args []string) error {
	f := newFlagSet(c.env, "checkpoints list", "supervisor checkpoints list [--data-dir DIR] [--json]",
		"Lists stored checkpoints, newest first: id, creation time, WAL watermark, sizes, flags.")
	dataDir := f.dataDir()
	asJSON := f.Bool("json", false, "print JSON")
	if err := f.parseFlagsOnly(args); err != nil {
		return err
	}
	st, err := openStore(*dataDir)
	if err != nil {
		return failed("checkpoints list", err)
	}
	metas, err := st.List()
	if err != nil {
		return failed("checkpoints list", err)
	}
	if *asJSON {
		if metas == nil {
			metas = []checkpoint.Meta{}
		}
		printJSON(c.stdout, metas)
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCREATED\tWATERMARK\tSIZE\tSTORED\tFLAGS")
	for _, m := range metas {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", m.ID, m.Created.UTC().Format(time.RFC3339), m.Watermark, m.Size, m.StoredSize, flagsOf(m))
	}
	return tw.Flush()
}

func (c *checkpointsCmd) show(args []string) error {
	f := newFlagSet(c.env, "checkpoints show", "supervisor checkpoints show ID [--data-dir DIR] [--json]",
		"Shows one checkpoint and verifies it (decompression and checksum); exit 1 when it is corrupt.")
	dataDir := f.dataDir()
	asJSON := f.Bool("json", false, "print JSON")
	pos, _, _, err := f.parse(args)
	if err != nil {
		return err
	}
	switch {
	case len(pos) == 0:
		return usageErr("checkpoints show", "missing checkpoint ID (see `supervisor checkpoints list`)")
	case len(pos) > 1:
		return usageErr("checkpoints show", "unexpected argument %q (show takes one checkpoint ID)", truncate(pos[1], 64))
	}
	id, err := checkpoint.ParseID(pos[0])
	if err != nil {
		return usageErr("checkpoints show", "%q is not a checkpoint id (a UUID): %v", truncate(pos[0], 64), err)
	}
	st, err := openStore(*dataDir)
	if err != nil {
		return failed("checkpoints show", err)
	}
	// Verify the whole checkpoint, not just its header.
	meta, data, lerr := st.Load(id)
	if lerr != nil && !errors.Is(lerr, checkpoint.ErrCorrupt) {
		return failed("checkpoints show", lerr)
	}
	out := map[string]any{"meta": meta, "verified": lerr == nil}
	if lerr != nil {
		out["error"] = lerr.Error()
		if m, err := st.Stat(id); err == nil {
			out["meta"] = m
		}
	} else {
		out["top_level_keys"] = topLevelKeys(data)
	}
	if *asJSON {
		printJSON(c.stdout, out)
	} else {
		m := out["meta"].(checkpoint.Meta)
		fmt.Fprintf(c.stdout, "id:           %s\ncreated:      %s\nwatermark:    %d\nsize:         %d bytes\nstored size:  %d bytes\nchecksum:     %s\nflags:        %s\n",
			m.ID, m.Created.UTC().Format(time.RFC3339Nano), m.Watermark, m.Size, m.StoredSize, m.Checksum, flagsOf(m))
		if lerr != nil {
			fmt.Fprintf(c.stdout, "verified:     NO — %v\n", lerr)
		} else {
			fmt.Fprintf(c.stdout, "verified:     yes\nkeys:         %v\n", out["top_level_keys"])
		}
	}
	if lerr != nil {
		return failed("checkpoints show", fmt.Errorf("checkpoint %s failed verification: %w", id, lerr))
	}
	return nil
}

// restoreCmd is `supervisor restore`.
type restoreCmd struct{ env }

func (c *restoreCmd) Run(_ context.Context, args []string) error {
	f := newFlagSet(c.env, "restore", "supervisor restore --checkpoint ID [--data-dir DIR] [--no-wal]",
		`Restarts the running supervisor's agent with a restore from checkpoint ID plus
the WAL after it (--no-wal: the checkpoint alone, rolling history back). With no
supervisor running, records ID as the restore point for the next start.`)
	dataDir := f.dataDir()
	id := f.String("checkpoint", "", "checkpoint id (a UUID) to restore the agent from (required)")
	f.meta["checkpoint"] = "ID"
	noWAL := f.Bool("no-wal", false, "restore the checkpoint alone, without the WAL entries after it (rolls the agent's history back)")
	pos, _, _, err := f.parse(args)
	if err != nil {
		return err
	}
	if len(pos) == 1 && *id == "" {
		return usageErr("restore", "give the checkpoint with --checkpoint %s", truncate(pos[0], 64))
	}
	if err := f.noArgs(pos); err != nil {
		return err
	}
	if *id == "" {
		return usageErr("restore", "--checkpoint ID is required (see `supervisor checkpoints list`)")
	}
	parsed, err := checkpoint.ParseID(*id)
	if err != nil {
		return usageErr("restore", "%q is not a checkpoint id (a UUID): %v", truncate(*id, 64), err)
	}
	if err := statDataDir(*dataDir); err != nil {
		return failed("restore", err)
	}
	resp, err := supervisor.Call(*dataDir, supervisor.ControlRequest{Op: supervisor.OpRestore, CheckpointID: parsed, NoWAL: *noWAL}, controlTimeout)
	if errors.Is(err, supervisor.ErrNotRunning) {
		if supervisor.DataDirInUse(*dataDir) {
			return failed("restore", fmt.Errorf("a supervisor holds %s but its control socket does not answer: %w", *dataDir, err))
		}
		st, err := openStore(*dataDir)
		if err != nil {
			return failed("restore", err)
		}
		if _, _, err := st.Load(parsed); err != nil {
			return failed("restore", fmt.Errorf("checkpoint %s cannot be used: %w", parsed, err))
		}
		if err := st.SetRestorePoint(parsed, *noWAL); err != nil {
			return failed("restore", err)
		}
		fmt.Fprintf(c.stdout, "no supervisor is running on %s; checkpoint %s is recorded as the restore point for its next start\n", *dataDir, parsed)
		return nil
	}
	if err != nil {
		return failed("restore", err)
	}
	if r := resp.Restore; r != nil && r.Sent {
		fmt.Fprintf(c.stdout, "restore sent: checkpoint %s (watermark %d) + %d WAL entries (last sequence %d)\n", r.CheckpointID, r.Watermark, r.WALEntries, r.LastSequence)
	} else {
		fmt.Fprintln(c.stdout, resp.Message)
	}
	return nil
}

// statusCmd is `supervisor status`.
type statusCmd struct{ env }

func (c *statusCmd) Run(_ context.Context, args []string) error {
	f := newFlagSet(c.env, "status", "supervisor status [--data-dir DIR] [--json]",
		`Asks the running supervisor over its control socket; with none running, reads
the stores and says "not running".`)
	dataDir := f.dataDir()
	asJSON := f.Bool("json", false, "print JSON")
	if err := f.parseFlagsOnly(args); err != nil {
		return err
	}
	if err := statDataDir(*dataDir); err != nil {
		return failed("status", err)
	}
	var st supervisor.Status
	resp, err := supervisor.Call(*dataDir, supervisor.ControlRequest{Op: supervisor.OpStatus}, controlTimeout)
	switch {
	case err == nil && resp.Status != nil:
		st = *resp.Status
	case errors.Is(err, supervisor.ErrNotRunning):
		if st, err = offlineStatus(*dataDir); err != nil {
			return failed("status", err)
		}
	case err == nil:
		return failed("status", errors.New("the supervisor's answer holds no status"))
	default:
		return failed("status", err)
	}
	if *asJSON {
		printJSON(c.stdout, st)
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s:\t%v\n", k, v) }
	if st.Running {
		row("supervisor", fmt.Sprintf("running (pid %d)", st.SupervisorPID))
		row("version", fmt.Sprintf("%s (revision %s)", st.Version, st.Revision))
		row("http", orDash(st.HTTPAddr))
	} else {
		row("supervisor", "not running")
	}
	row("state", st.State)
	if st.PID != 0 {
		row("agent pid", st.PID)
		row("agent uptime", (time.Duration(st.UptimeSeconds * float64(time.Second))).Round(time.Millisecond))
	}
	if !st.LastHeartbeat.IsZero() {
		row("last heartbeat", fmt.Sprintf("%s (%s ago)", st.LastHeartbeat.Format(time.RFC3339Nano), time.Since(st.LastHeartbeat).Round(time.Millisecond)))
	}
	row("restarts", st.Restarts)
	if st.LastRestartReason != "" {
		row("last restart reason", st.LastRestartReason)
	}
	if st.Diagnosis != "" {
		row("diagnosis", st.Diagnosis)
	}
	row("newest checkpoint", orDash(st.NewestCheckpoint))
	if p := st.PendingRestore; p != nil {
		what := "checkpoint + the WAL after it"
		if p.NoWAL {
			what = "checkpoint alone (--no-wal)"
		}
		row("pending restore", fmt.Sprintf("%s (%s), at the agent's next start", p.CheckpointID, what))
	}
	row("last WAL sequence", st.LastWALSequence)
	if st.Running {
		row("durable WAL sequence", st.DurableWALSequence)
	}
	if r := st.Replica; r != nil {
		row("replica", fmt.Sprintf("%s (%s)", r.URL, r.State))
		row("replica generation", orDash(r.Generation))
		row("replica uploaded through", fmt.Sprintf("sequence %d (lag %d entries, %.1fs)", r.UploadedSequence, r.LagEntries, r.LagSeconds))
		if !r.LastSuccess.IsZero() {
			row("replica last upload", r.LastSuccess.Format(time.RFC3339))
		}
		if r.LastError != "" {
			row("replica last error", fmt.Sprintf("[%s] %s", r.LastErrorKind, r.LastError))
		}
	}
	return tw.Flush()
}

// offlineStatus reads the stores of a data directory nobody supervises.
func offlineStatus(dataDir string) (supervisor.Status, error) {
	st := supervisor.Status{State: "not running"}
	if store, err := openStore(dataDir); err == nil {
		if metas, err := store.List(); err == nil {
			for _, m := range metas {
				if !m.Bad {
					st.NewestCheckpoint = m.ID
					break
				}
			}
		}
		if id, noWAL, ok, err := store.PeekRestorePoint(); err == nil && ok {
			st.PendingRestore = &supervisor.PendingRestore{CheckpointID: id, NoWAL: noWAL}
		}
	}
	walDir := filepath.Join(dataDir, "wal")
	if _, err := os.Stat(walDir); err == nil {
		info, err := wal.Inspect(walDir)
		if err != nil {
			return st, fmt.Errorf("read WAL: %w", err)
		}
		st.LastWALSequence = info.Last
		st.DurableWALSequence = info.Last
	}
	return st, nil
}

// walCmd is `supervisor wal dump`.
type walCmd struct{ env }

const walUsage = `Usage: supervisor wal dump [--data-dir DIR] [--from SEQ] [--json]

Prints WAL entries (SEQ, operation, params as JSON). Safe while a supervisor runs.
`

func (c *walCmd) Run(_ context.Context, args []string) error {
	switch {
	case len(args) == 0:
		return &cliError{cmd: "wal", err: errors.New("missing subcommand: dump"), usage: true}
	case isHelpArg(args[0]):
		fmt.Fprint(c.stdout, walUsage)
		return nil
	case args[0] != "dump":
		return usageErr("wal", "unknown subcommand %q (want dump)", truncate(args[0], 40))
	}
	f := newFlagSet(c.env, "wal dump", "supervisor wal dump [--data-dir DIR] [--from SEQ] [--json]",
		"Prints WAL entries with sequence >= SEQ. Stops with exit 1 at a corrupt record, after the good prefix.")
	dataDir := f.dataDir()
	from := f.Uint64("from", 0, "print entries with sequence >= SEQ")
	f.meta["from"] = "SEQ"
	asJSON := f.Bool("json", false, "print one JSON object per line")
	if err := f.parseFlagsOnly(args[1:]); err != nil {
		return err
	}
	if err := statDataDir(*dataDir); err != nil {
		return failed("wal dump", err)
	}
	walDir := filepath.Join(*dataDir, "wal")
	if _, err := os.Stat(walDir); err != nil {
		return failed("wal dump", fmt.Errorf("no WAL in %s (%v)", *dataDir, pathErr(err)))
	}
	after := uint64(0)
	if *from > 0 {
		after = *from - 1
	}
	enc := json.NewEncoder(c.stdout)
	n := 0
	err := wal.ReadDir(walDir, after, func(e wal.Entry) error {
		n++
		var v map[string]any
		decErr := schema.Unmarshal(e.Data, &v)
		if *asJSON {
			rec := map[string]any{"sequence": e.Sequence, "size": len(e.Data)}
			if decErr == nil {
				rec["entry"] = jsonSafe(v)
			} else {
				rec["raw_hex"] = fmt.Sprintf("%x", e.Data)
			}
			return enc.Encode(rec)
		}
		if decErr != nil {
			_, err := fmt.Fprintf(c.stdout, "%d\t(%d bytes, undecodable)\n", e.Sequence, len(e.Data))
			return err
		}
		op, _ := v["operation"].(string)
		params, _ := json.Marshal(jsonSafe(v["params"]))
		_, err := fmt.Fprintf(c.stdout, "%d\t%s\t%s\n", e.Sequence, op, params)
		return err
	})
	if err != nil {
		return failed("wal dump", fmt.Errorf("stopped after %d entries: %w", n, err))
	}
	return nil
}

// auditCmd is `supervisor audit`.
type auditCmd struct{ env }

func (c *auditCmd) Run(_ context.Context, args []string) error {
	f := newFlagSet(c.env, "audit", "supervisor audit [--data-dir DIR] [--since D] [--json]",
		"Prints the audit log: one record per decision (restart, restore, checkpoint stored, ...).")
	dataDir := f.dataDir()
	var since time.Duration
	f.duration(&since, "since", 0, "only records from the last D (e.g. 1h)")
	asJSON := f.Bool("json", false, "print one JSON object per line")
	if err := f.parseFlagsOnly(args); err != nil {
		return err
	}
	if since < 0 {
		return usageErr("audit", "--since %s is negative: give how far back to read, e.g. 1h", since)
	}
	if err := statDataDir(*dataDir); err != nil {
		return failed("audit", err)
	}
	file, err := os.Open(filepath.Join(*dataDir, "audit.jsonl"))
	if err != nil {
		return failed("audit", fmt.Errorf("no audit log in %s (%v)", *dataDir, pathErr(err)))
	}
	defer file.Close()
	var cut time.Time
	if since > 0 {
		cut = time.Now().Add(-since)
	}
	enc := json.NewEncoder(c.stdout)
	skipped, err := observe.ReadAudit(file, cut, func(r observe.AuditRecord) error {
		if *asJSON {
			return enc.Encode(r)
		}
		fields, _ := json.Marshal(r.Fields)
		_, err := fmt.Fprintf(c.stdout, "%s  %-22s %s\n", r.Time.Format(time.RFC3339Nano), r.Kind, fields)
		return err
	})
	if err != nil {
		return failed("audit", err)
	}
	if skipped > 0 {
		fmt.Fprintf(c.stderr, "supervisor audit: skipped %d unreadable line(s) (a torn last line after a crash is expected)\n", skipped)
	}
	return nil
}

// versionCmd is `supervisor version`.
type versionCmd struct{ env }

func (c *versionCmd) Run(_ context.Context, args []string) error {
	f := newFlagSet(c.env, "version", "supervisor version [--json]",
		"Prints the version and VCS revision this binary was built from.")
	asJSON := f.Bool("json", false, "print JSON")
	if err := f.parseFlagsOnly(args); err != nil {
		return err
	}
	b := supervisor.Build()
	if *asJSON {
		printJSON(c.stdout, b)
		return nil
	}
	fmt.Fprintf(c.stdout, "supervisor %s\nrevision:   %s\n", b.Version, b.Revision)
	if b.Time != "" {
		fmt.Fprintf(c.stdout, "committed:  %s\n", b.Time)
	}
	fmt.Fprintf(c.stdout, "go:         %s\n", b.GoVersion)
	return nil
}

func printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func flagsOf(m checkpoint.Meta) string {
	f := ""
	if m.Pinned {
		f += "pinned "
	}
	if m.Bad {
		f += "bad(" + m.BadReason + ")"
	}
	if f == "" {
		return "-"
	}
	return f
}

func topLevelKeys(data []byte) []string {
	var m map[string]msgpack.RawMessage
	if err := schema.Unmarshal(data, &m); err != nil {
		return nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// jsonSafe converts msgpack-decoded values into something encoding/json takes
// (byte slices become hex strings, map keys strings).
func jsonSafe(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, x := range t {
			out[k] = jsonSafe(x)
		}
		return out
	case map[any]any:
		out := make(map[string]any, len(t))
		for k, x := range t {
			out[fmt.Sprint(k)] = jsonSafe(x)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, x := range t {
			out[i] = jsonSafe(x)
		}
		return out
	case []byte:
		return fmt.Sprintf("%x", t)
	case float32:
		return jsonFloat(float64(t))
	case float64:
		return jsonFloat(t)
	default:
		return t
	}
}

// jsonFloat is f, or "NaN", "+Inf" or "-Inf", which JSON has no number for
// (encoding/json refuses them, which stopped `wal dump` as if the WAL were
// corrupt).
func jsonFloat(f float64) any {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "+Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	}
	return f
}

// evolutionsCmd is `supervisor evolutions list|show`.
type evolutionsCmd struct{ env }

const evolutionsUsage = `Usage:
  supervisor evolutions list [--data-dir DIR] [--json]
  supervisor evolutions show ID [--data-dir DIR] [--json]

Read the evolutions recorded in the audit log, whether or not a supervisor
runs: every trial's hypothesis, timing, pairs, evidence and decision.
`

func (c *evolutionsCmd) Run(_ context.Context, args []string) error {
	if len(args) == 0 {
		return &cliError{cmd: "evolutions", err: errors.New("missing subcommand: list or show"), usage: true}
	}
	sub, args := args[0], args[1:]
	switch {
	case isHelpArg(sub):
		fmt.Fprint(c.stdout, evolutionsUsage)
		return nil
	case sub == "list":
		return c.list(args)
	case sub == "show":
		return c.show(args)
	}
	return usageErr("evolutions", "unknown subcommand %q (want list or show)", truncate(sub, 40))
}

func (c *evolutionsCmd) list(args []string) error {
	f := newFlagSet(c.env, "evolutions list", "supervisor evolutions list [--data-dir DIR] [--json]",
		"Lists the evolutions decided, oldest first: id, time, target, decision, pairs judged, reason.")
	dataDir := f.dataDir()
	asJSON := f.Bool("json", false, "print JSON")
	if err := f.parseFlagsOnly(args); err != nil {
		return err
	}
	if err := statDataDir(*dataDir); err != nil {
		return failed("evolutions list", err)
	}
	evs, skipped, err := api.ReadEvolutions(filepath.Join(*dataDir, "audit.jsonl"), false)
	if err != nil {
		return failed("evolutions list", err)
	}
	if skipped > 0 {
		fmt.Fprintf(c.stderr, "supervisor evolutions: skipped %d unreadable audit line(s) (a torn last line after a crash is expected)\n", skipped)
	}
	if *asJSON {
		printJSON(c.stdout, evs)
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tDECIDED\tTARGET\tDECISION\tPAIRS\tREASON")
	for _, e := range evs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", e.ID, e.Time.UTC().Format(time.RFC3339), truncate(e.Target, 40), e.Decision, e.Samples, truncate(e.Reason, 120))
	}
	return tw.Flush()
}

func (c *evolutionsCmd) show(args []string) error {
	f := newFlagSet(c.env, "evolutions show", "supervisor evolutions show ID [--data-dir DIR] [--json]",
		"Shows one evolution: hypothesis, timing, pairs, each test's estimate and bounds over time, differing answers, decision and reason.")
	dataDir := f.dataDir()
	asJSON := f.Bool("json", false, "print JSON")
	pos, _, _, err := f.parse(args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usageErr("evolutions show", "missing evolution ID (see `supervisor evolutions list`)")
	}
	if len(pos) > 1 {
		return usageErr("evolutions show", "unexpected argument %q (show takes one evolution ID)", truncate(pos[1], 64))
	}
	if err := statDataDir(*dataDir); err != nil {
		return failed("evolutions show", err)
	}
	e, ok, err := api.FindEvolution(filepath.Join(*dataDir, "audit.jsonl"), pos[0])
	if err != nil {
		return failed("evolutions show", err)
	}
	if !ok {
		return failed("evolutions show", fmt.Errorf("no evolution %q in the audit log of %s (see `supervisor evolutions list`)", truncate(pos[0], 64), *dataDir))
	}
	if *asJSON {
		printJSON(c.stdout, e)
		return nil
	}
	return printEvolution(c.stdout, e)
}

// printEvolution writes an evolution for a person: the decision and why,
// then the evidence, the bounds over time and the differing answers.
func printEvolution(w io.Writer, e api.Evolution) error {
	r := e.Record
	str := func(k string) string { s, _ := r[k].(string); return s }
	fmt.Fprintf(w, "evolution  %s\ndecided    %s\ntarget     %s\nhypothesis %s\ndecision   %s\nreason     %s\n",
		e.ID, e.Time.UTC().Format(time.RFC3339), e.Target, truncate(str("hypothesis_reason"), 200), e.Decision, e.Reason)
	if d, ok := r["duration_seconds"].(float64); ok {
		fmt.Fprintf(w, "duration   %.1fs\n", d)
	}
	if c, ok := r["control"].(bool); ok {
		fmt.Fprintf(w, "control    %v\n", c)
	}
	if p, ok := r["pairs"].(map[string]any); ok {
		fmt.Fprintf(w, "requests   %v mirrored, %v paired, %v duplicate answers, %v unknown ids, %v dropped, %v unanswered\n",
			p["mirrored"], p["pairs"], p["duplicates"], p["unknown"], p["dropped"], p["pending"])
		if cm, ok := p["candidate_missing"]; ok { // records before missing answers were judged lack it
			fmt.Fprintf(w, "missing    %v answers of the candidate, %v of the other side (past the deadline; judged as failures), %v late answers\n",
				cm, p["control_missing"], p["late"])
		}
	}
	if m, ok := r["metrics"].(map[string]any); ok {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprintln(w, "\nevidence")
		for _, k := range keys {
			fmt.Fprintf(w, "  %-26s %v\n", k, m[k])
		}
	}
	if path, ok := r["path"].([]any); ok && len(path) > 0 {
		fmt.Fprintln(w, "\nbounds over time")
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  PAIRS\tLATENCY RATIO\tLOW\tHIGH\tERROR CHANGE HIGH\tDISAGREEMENT EXCESS HIGH")
		for _, p := range path {
			pt, _ := p.(map[string]any)
			fmt.Fprintf(tw, "  %v\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\n", pt["pairs"], num(pt["latency_ratio"]), num(pt["latency_ratio_low"]),
				num(pt["latency_ratio_high"]), num(pt["error_rate_change_high"]), num(pt["disagreement_excess_high"]))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if diffs, ok := r["differing"].([]any); ok && len(diffs) > 0 {
		fmt.Fprintln(w, "\ndiffering answers (candidate unlike the primary, control alike)")
		for _, d := range diffs {
			dm, _ := d.(map[string]any)
			fmt.Fprintf(w, "  request %v\n    primary   %v\n    candidate %v\n", dm["request_id"], dm["primary"], dm["candidate"])
			if c, ok := dm["control"]; ok {
				fmt.Fprintf(w, "    control   %v\n", c)
			}
		}
	}
	return nil
}

func num(v any) float64 { f, _ := v.(float64); return f }
