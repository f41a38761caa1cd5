package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/checkpoint"
	"github.com/agent-sidecar/supervisor/supervisor"
	"github.com/agent-sidecar/supervisor/wal"
)

const defaultDataDir = "./supervisor-data"

const controlTimeout = 30 * time.Second

func fail(stderr io.Writer, cmd string, err error) int {
	fmt.Fprintf(stderr, "supervisor %s: %v\n", cmd, err)
	return exitFailure
}

func usageErr(stderr io.Writer, cmd string, err error) int {
	if errors.Is(err, errHelp) {
		return exitOK
	}
	fmt.Fprintf(stderr, "supervisor %s: %v\n", cmd, err)
	return exitUsage
}

func printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// openStoreReadOnly opens the checkpoint store for reading. It refuses to
// create a data directory that does not exist (a typo in --data-dir).
func openStore(dataDir string) (*checkpoint.Store, error) {
	dir := filepath.Join(dataDir, "checkpoints")
	if _, err := os.Stat(dataDir); err != nil {
		return nil, fmt.Errorf("data directory %s: %w", dataDir, err)
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no checkpoint store in %s (has a supervisor ever run with this --data-dir?)", dataDir)
	}
	return checkpoint.Open(dir, checkpoint.Options{})
}

func cmdCheckpoints(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "list" && args[0] != "show") {
		if len(args) > 0 && (args[0] == "--help" || args[0] == "-h") {
			fmt.Fprintln(stdout, "Usage: supervisor checkpoints list|show ID [--data-dir DIR] [--json]")
			return exitOK
		}
		fmt.Fprintln(stderr, "Usage: supervisor checkpoints list|show ID [--data-dir DIR] [--json]")
		return exitUsage
	}
	sub := args[0]
	fs := newFlagSet("supervisor checkpoints "+sub, "supervisor checkpoints "+sub+map[string]string{"list": "", "show": " ID"}[sub]+" [--data-dir DIR] [--json]", stderr)
	dataDir := fs.String("data-dir", defaultDataDir, "the supervisor's data directory")
	asJSON := fs.Bool("json", false, "print JSON")
	rest := args[1:]
	var id string
	if sub == "show" {
		if len(rest) == 0 || rest[0] == "" || rest[0][0] == '-' {
			if len(rest) > 0 && (rest[0] == "--help" || rest[0] == "-h") {
				fs.Usage()
				return exitOK
			}
			return usageErr(stderr, "checkpoints show", errors.New("missing checkpoint ID"))
		}
		id, rest = rest[0], rest[1:]
	}
	if err := parseFlags(fs, rest); err != nil {
		return usageErr(stderr, "checkpoints "+sub, err)
	}
	if fs.NArg() > 0 {
		return usageErr(stderr, "checkpoints "+sub, fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	if sub == "show" {
		parsed, err := checkpoint.ParseID(id)
		if err != nil {
			return usageErr(stderr, "checkpoints show", fmt.Errorf("%q is not a checkpoint id (a UUID): %w", id, err))
		}
		id = parsed
	}
	st, err := openStore(*dataDir)
	if err != nil {
		return fail(stderr, "checkpoints "+sub, err)
	}
	if sub == "list" {
		metas, err := st.List()
		if err != nil {
			return fail(stderr, "checkpoints list", err)
		}
		if *asJSON {
			if metas == nil {
				metas = []checkpoint.Meta{}
			}
			printJSON(stdout, metas)
			return exitOK
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tCREATED\tWATERMARK\tSIZE\tSTORED\tFLAGS")
		for _, m := range metas {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", m.ID, m.Created.UTC().Format(time.RFC3339), m.Watermark, m.Size, m.StoredSize, flagsOf(m))
		}
		tw.Flush()
		return exitOK
	}
	// show: verify the whole checkpoint, not just its header.
	meta, data, lerr := st.Load(id)
	if lerr != nil && !errors.Is(lerr, checkpoint.ErrCorrupt) {
		return fail(stderr, "checkpoints show", lerr)
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
		printJSON(stdout, out)
	} else {
		m := out["meta"].(checkpoint.Meta)
		fmt.Fprintf(stdout, "id:           %s\ncreated:      %s\nwatermark:    %d\nsize:         %d bytes\nstored size:  %d bytes\nchecksum:     %s\nflags:        %s\n",
			m.ID, m.Created.UTC().Format(time.RFC3339Nano), m.Watermark, m.Size, m.StoredSize, m.Checksum, flagsOf(m))
		if lerr != nil {
			fmt.Fprintf(stdout, "verified:     NO — %v\n", lerr)
		} else {
			fmt.Fprintf(stdout, "verified:     yes\nkeys:         %v\n", out["top_level_keys"])
		}
	}
	if lerr != nil {
		return exitFailure
	}
	return exitOK
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
	if err := msgpack.Unmarshal(data, &m); err != nil {
		return nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func cmdRestore(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("supervisor restore", "supervisor restore --checkpoint ID [--data-dir DIR] [--no-wal]", stderr)
	dataDir := fs.String("data-dir", defaultDataDir, "the supervisor's data directory")
	id := fs.String("checkpoint", "", "checkpoint id (a UUID) to restore the agent from (required)")
	noWAL := fs.Bool("no-wal", false, "restore the checkpoint alone, without the WAL entries after it (rolls the agent's history back)")
	if err := parseFlags(fs, args); err != nil {
		return usageErr(stderr, "restore", err)
	}
	if *id == "" {
		return usageErr(stderr, "restore", errors.New("--checkpoint ID is required (see `supervisor checkpoints list`)"))
	}
	parsed, err := checkpoint.ParseID(*id)
	if err != nil {
		return usageErr(stderr, "restore", fmt.Errorf("%q is not a checkpoint id (a UUID): %w", *id, err))
	}
	resp, err := supervisor.Call(*dataDir, supervisor.ControlRequest{Op: supervisor.OpRestore, CheckpointID: parsed, NoWAL: *noWAL}, controlTimeout)
	if errors.Is(err, supervisor.ErrNotRunning) {
		if supervisor.DataDirInUse(*dataDir) {
			return fail(stderr, "restore", fmt.Errorf("a supervisor holds %s but its control socket does not answer: %w", *dataDir, err))
		}
		st, err := openStore(*dataDir)
		if err != nil {
			return fail(stderr, "restore", err)
		}
		if _, _, err := st.Load(parsed); err != nil {
			return fail(stderr, "restore", fmt.Errorf("checkpoint %s cannot be used: %w", parsed, err))
		}
		if err := st.SetRestorePoint(parsed, *noWAL); err != nil {
			return fail(stderr, "restore", err)
		}
		fmt.Fprintf(stdout, "no supervisor is running on %s; checkpoint %s is recorded as the restore point for its next start\n", *dataDir, parsed)
		return exitOK
	}
	if errors.Is(err, supervisor.ErrBusy) { // issue 12: a distinct exit code for "busy, retry"
		fmt.Fprintf(stderr, "supervisor restore: %v\n", err)
		return exitBusy
	}
	if err != nil {
		return fail(stderr, "restore", err)
	}
	if r := resp.Restore; r != nil && r.Sent {
		fmt.Fprintf(stdout, "restore sent: checkpoint %s (watermark %d) + %d WAL entries (last sequence %d)\n", r.CheckpointID, r.Watermark, r.WALEntries, r.LastSequence)
	} else {
		fmt.Fprintln(stdout, resp.Message)
	}
	return exitOK
}

func cmdStatus(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("supervisor status", "supervisor status [--data-dir DIR] [--json]", stderr)
	dataDir := fs.String("data-dir", defaultDataDir, "the supervisor's data directory")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parseFlags(fs, args); err != nil {
		return usageErr(stderr, "status", err)
	}
	var st supervisor.Status
	resp, err := supervisor.Call(*dataDir, supervisor.ControlRequest{Op: supervisor.OpStatus}, controlTimeout)
	switch {
	case err == nil && resp.Status != nil:
		st = *resp.Status
	case errors.Is(err, supervisor.ErrNotRunning):
		st, err = offlineStatus(*dataDir)
		if err != nil {
			return fail(stderr, "status", err)
		}
	default:
		return fail(stderr, "status", err)
	}
	if *asJSON {
		printJSON(stdout, st)
		return exitOK
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	row := func(k string, v any) { fmt.Fprintf(tw, "%s:\t%v\n", k, v) }
	if st.Running {
		row("supervisor", fmt.Sprintf("running (pid %d)", st.SupervisorPID))
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
	row("newest checkpoint", orDash(st.NewestCheckpoint))
	row("last WAL sequence", st.LastWALSequence)
	if st.Running {
		row("durable WAL sequence", st.DurableWALSequence)
	}
	tw.Flush()
	return exitOK
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// offlineStatus reads the stores of a data directory nobody supervises.
func offlineStatus(dataDir string) (supervisor.Status, error) {
	st := supervisor.Status{State: "not running"}
	if _, err := os.Stat(dataDir); err != nil {
		return st, fmt.Errorf("data directory %s: %w", dataDir, err)
	}
	if store, err := openStore(dataDir); err == nil {
		if metas, err := store.List(); err == nil {
			for _, m := range metas {
				if !m.Bad {
					st.NewestCheckpoint = m.ID
					break
				}
			}
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

func cmdWAL(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "dump" {
		if len(args) > 0 && (args[0] == "--help" || args[0] == "-h") {
			fmt.Fprintln(stdout, "Usage: supervisor wal dump [--data-dir DIR] [--from SEQ] [--json]")
			return exitOK
		}
		fmt.Fprintln(stderr, "Usage: supervisor wal dump [--data-dir DIR] [--from SEQ] [--json]")
		return exitUsage
	}
	fs := newFlagSet("supervisor wal dump", "supervisor wal dump [--data-dir DIR] [--from SEQ] [--json]", stderr)
	dataDir := fs.String("data-dir", defaultDataDir, "the supervisor's data directory")
	from := fs.Uint64("from", 0, "print entries with sequence >= SEQ")
	asJSON := fs.Bool("json", false, "print one JSON object per line")
	if err := parseFlags(fs, args[1:]); err != nil {
		return usageErr(stderr, "wal dump", err)
	}
	walDir := filepath.Join(*dataDir, "wal")
	if _, err := os.Stat(walDir); err != nil {
		return fail(stderr, "wal dump", fmt.Errorf("no WAL in %s: %w", *dataDir, err))
	}
	after := uint64(0)
	if *from > 0 {
		after = *from - 1
	}
	enc := json.NewEncoder(stdout)
	n := 0
	err := wal.ReadDir(walDir, after, func(e wal.Entry) error {
		n++
		var v map[string]any
		decErr := msgpack.Unmarshal(e.Data, &v)
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
			_, err := fmt.Fprintf(stdout, "%d\t(%d bytes, undecodable)\n", e.Sequence, len(e.Data))
			return err
		}
		op, _ := v["operation"].(string)
		params, _ := json.Marshal(jsonSafe(v["params"]))
		_, err := fmt.Fprintf(stdout, "%d\t%s\t%s\n", e.Sequence, op, params)
		return err
	})
	if err != nil {
		fmt.Fprintf(stderr, "supervisor wal dump: stopped after %d entries: %v\n", n, err)
		return exitFailure
	}
	return exitOK
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
		return float64(t)
	default:
		return t
	}
}

func cmdAudit(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("supervisor audit", "supervisor audit [--data-dir DIR] [--since D] [--json]", stderr)
	dataDir := fs.String("data-dir", defaultDataDir, "the supervisor's data directory")
	since := fs.Duration("since", 0, "only records from the last D (e.g. 1h)")
	asJSON := fs.Bool("json", false, "print one JSON object per line")
	if err := parseFlags(fs, args); err != nil {
		return usageErr(stderr, "audit", err)
	}
	f, err := os.Open(filepath.Join(*dataDir, "audit.jsonl"))
	if err != nil {
		return fail(stderr, "audit", fmt.Errorf("no audit log in %s: %w", *dataDir, err))
	}
	defer f.Close()
	var cut time.Time
	if *since > 0 {
		cut = time.Now().Add(-*since)
	}
	enc := json.NewEncoder(stdout)
	skipped, err := supervisor.ReadAudit(f, cut, func(r supervisor.AuditRecord) error {
		if *asJSON {
			return enc.Encode(r)
		}
		fields, _ := json.Marshal(r.Fields)
		_, err := fmt.Fprintf(stdout, "%s  %-22s %s\n", r.Time.Format(time.RFC3339Nano), r.Kind, fields)
		return err
	})
	if err != nil {
		return fail(stderr, "audit", err)
	}
	if skipped > 0 {
		fmt.Fprintf(stderr, "supervisor audit: skipped %s unreadable line(s) (a torn last line after a crash is expected)\n", strconv.Itoa(skipped))
	}
	return exitOK
}
