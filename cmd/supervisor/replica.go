package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/agent-sidecar/supervisor/replica"
	"github.com/agent-sidecar/supervisor/supervisor"
)

// replicaCmd is `supervisor replica restore|list`: the replica in object
// storage (docs/replication.md).
type replicaCmd struct{ env }

const replicaUsage = `Usage:
  supervisor replica restore --replica s3://BUCKET/PREFIX --data-dir DIR [--to-sequence N | --to-time T] [--generation ID]
  supervisor replica list --replica s3://BUCKET/PREFIX [--json]

Read the replica that "supervisor run --replica" writes. --replica-endpoint URL
points at an S3-compatible server, --replica-region sets the region; the
credentials come from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (AWS_SESSION_TOKEN)
or the shared credentials file (AWS_SHARED_CREDENTIALS_FILE, AWS_PROFILE).
`

func (c *replicaCmd) Run(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return &cliError{cmd: "replica", err: errors.New("missing subcommand: restore or list"), usage: true}
	}
	sub, args := args[0], args[1:]
	switch {
	case isHelpArg(sub):
		fmt.Fprint(c.stdout, replicaUsage)
		return nil
	case sub == "restore":
		return c.restore(ctx, args)
	case sub == "list":
		return c.list(ctx, args)
	}
	return usageErr("replica", "unknown subcommand %q (want restore or list)", truncate(sub, 40))
}

// replicaFlags defines --replica, --replica-endpoint and --replica-region,
// which may also come from SUPERVISOR_REPLICA… as for run.
func replicaFlags(f *flagSet) func() (*replica.Client, error) {
	url := f.String("replica", "", "the replica: s3://BUCKET/PREFIX (required)")
	endpoint := f.String("replica-endpoint", "", "URL of an S3-compatible server (http:// for no TLS); default AWS S3")
	region := f.String("replica-region", "", "the bucket's region")
	f.meta["replica"], f.meta["replica-endpoint"], f.meta["replica-region"] = "URL", "URL", "REGION"
	f.fromEnv = func(name string) bool { return name == "data-dir" || strings.HasPrefix(name, "replica") }
	return func() (*replica.Client, error) {
		if *url == "" {
			return nil, usageErr(f.cmd, "--replica s3://BUCKET/PREFIX is required")
		}
		loc, err := replica.ParseURL(*url, *endpoint, *region)
		if err != nil {
			return nil, usageErr(f.cmd, "%v", err)
		}
		cl, err := replica.Open(loc)
		if err != nil {
			return nil, failed(f.cmd, err)
		}
		return cl, nil
	}
}

func (c *replicaCmd) restore(ctx context.Context, args []string) error {
	const name = "replica restore"
	f := newFlagSet(c.env, name, "supervisor replica restore --replica s3://BUCKET/PREFIX --data-dir DIR [--to-sequence N | --to-time T] [--generation ID] [--json]",
		"Rebuilds a data directory (which must not exist or be empty) from the replica: one checkpoint and every WAL entry after it up to\n"+
			"the newest uploaded one, or up to --to-sequence N, or as the replica held it at --to-time T (RFC 3339). The most recently written\n"+
			"generation that can be restored (newer ones holding nothing restorable are passed over, and named) unless --generation names another. A corrupt object is detected and never used. Then start `supervisor run --data-dir DIR`.")
	client := replicaFlags(f)
	dataDir := f.dataDir()
	toSeq := f.String("to-sequence", "", "restore the state right after this WAL sequence")
	toTime := f.String("to-time", "", "restore the state the replica held at this time (RFC 3339, e.g. 2026-11-23T18:00:00Z)")
	gen := f.String("generation", "", "the generation to restore (see `supervisor replica list`); default the most recently written that can be restored")
	asJSON := f.Bool("json", false, "print the result as JSON")
	f.meta["to-sequence"], f.meta["to-time"], f.meta["generation"] = "N", "T", "ID"
	if err := f.parseFlagsOnly(args); err != nil {
		return err
	}
	t := replica.Target{Generation: *gen}
	if *toSeq != "" && *toTime != "" {
		return usageErr(name, "--to-sequence and --to-time are exclusive: give one")
	}
	if *toSeq != "" {
		n, err := strconv.ParseUint(*toSeq, 10, 64)
		if err != nil || n == 0 {
			return usageErr(name, "--to-sequence %q is not a WAL sequence (a positive integer)", truncate(*toSeq, 40))
		}
		t.Sequence = n
	}
	if *toTime != "" {
		tm, err := time.Parse(time.RFC3339Nano, *toTime)
		if err != nil {
			return usageErr(name, "--to-time %q is not an RFC 3339 time (e.g. 2026-11-23T18:00:00Z)", truncate(*toTime, 40))
		}
		t.Time = tm
	}
	cl, err := client()
	if err != nil {
		return err
	}
	if supervisor.DataDirInUse(*dataDir) {
		return failed(name, fmt.Errorf("a supervisor is running on %s; a restore writes only into an empty data directory", *dataDir))
	}
	log := slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	start := time.Now()
	res, err := cl.Restore(ctx, *dataDir, t, log)
	if err != nil {
		return failed(name, err)
	}
	if *asJSON {
		printJSON(c.stdout, res)
		return nil
	}
	cp := res.CheckpointID
	if cp == "" {
		cp = "none (the WAL from its start)"
	}
	fmt.Fprintf(c.stdout, "restored %s from %s in %.2fs\n  generation:   %s\n  checkpoint:   %s (watermark %d)\n  WAL entries:  %d, through sequence %d\n  downloaded:   %d bytes\n",
		*dataDir, cl.Location(), time.Since(start).Seconds(), res.Generation, cp, res.Watermark, res.Entries, res.LastSequence, res.Bytes)
	for _, id := range res.Skipped {
		fmt.Fprintf(c.stdout, "  skipped:      checkpoint %s (corrupt in the replica)\n", id)
	}
	for _, g := range res.SkippedGenerations {
		fmt.Fprintf(c.stdout, "  skipped:      generation %s (%s)\n", g.ID, g.Reason)
	}
	if res.RequestsJournalOnly {
		fmt.Fprintf(c.stdout, "  agent state:  none in the replica (no checkpoint, no WAL: a stateless agent); the request journal alone is restored\n")
	}
	switch {
	case res.RequestsJournalError != "":
		fmt.Fprintf(c.stdout, "  requests:     NOT restored: the request journal in the replica is damaged (%s)\n", res.RequestsJournalError)
	case res.RequestsJournalIncomplete != "":
		fmt.Fprintf(c.stdout, "  requests:     journal INCOMPLETE in the replica, restored up to the missing or damaged part (%d bytes; %s)\n",
			res.RequestsJournalBytes, res.RequestsJournalIncomplete)
	case res.RequestsJournalBytes > 0:
		fmt.Fprintf(c.stdout, "  requests:     journal restored (%d bytes)\n", res.RequestsJournalBytes)
	}
	return nil
}

func (c *replicaCmd) list(ctx context.Context, args []string) error {
	const name = "replica list"
	f := newFlagSet(c.env, name, "supervisor replica list --replica s3://BUCKET/PREFIX [--json]",
		"Lists the replica's generations (most recently written first; * marks the one a restore takes), their checkpoints and the WAL range each holds;\n"+
			"a generation with nothing restorable says why (a restore passes it over).")
	client := replicaFlags(f)
	asJSON := f.Bool("json", false, "print JSON")
	if err := f.parseFlagsOnly(args); err != nil {
		return err
	}
	cl, err := client()
	if err != nil {
		return err
	}
	inv, err := cl.List(ctx)
	if err != nil {
		return failed(name, err)
	}
	sum := inv.Summary()
	if *asJSON {
		printJSON(c.stdout, map[string]any{"replica": cl.Location().String(), "generations": sum, "ignored_keys": inv.Ignored})
		return nil
	}
	if len(sum) == 0 {
		fmt.Fprintf(c.stdout, "%s holds no generation\n", cl.Location())
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GENERATION\tCREATED\tHOST\tUPDATED\tCHECKPOINTS\tWAL\tRESTORABLE TO\tBYTES\t")
	for _, g := range sum {
		id := g.ID
		if g.Default {
			id += " *"
		}
		wal := "-"
		if g.Chunks > 0 {
			wal = fmt.Sprintf("%d..%d (%d chunks)", g.WALAfter+1, g.WALThrough, g.Chunks)
		}
		to := "-"
		if g.RestorableTo != nil {
			to = strconv.FormatUint(*g.RestorableTo, 10)
		} else if g.RequestsJournalOnly {
			to = "request journal only (no agent state in the replica)"
		} else if g.NotRestorable != "" {
			to = "nothing (skipped)"
		}
		if g.ForkAt != nil {
			to += fmt.Sprintf(" (forked after %d)", *g.ForkAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t\n", id, fmtTime(g.Created), orDash(g.Hostname), fmtTime(g.Updated), len(g.Checkpoints), wal, to, g.Bytes)
	}
	tw.Flush()
	for _, g := range sum {
		if len(g.Checkpoints) == 0 {
			continue
		}
		fmt.Fprintf(c.stdout, "\ncheckpoints of %s:\n", g.ID)
		tw = tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  ID\tCREATED\tWATERMARK\tSTORED\t")
		for _, cp := range g.Checkpoints {
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t\n", cp.ID, fmtTime(cp.Created), cp.Watermark, cp.Bytes)
		}
		tw.Flush()
	}
	fmt.Fprintln(c.stdout, "\n* the generation a restore takes unless --generation names another (the most recently written that can be restored, or the parent it began from while it cannot be restored as far as that)")
	for _, g := range sum {
		if g.NotRestorable != "" {
			fmt.Fprintf(c.stdout, "skipped by a restore: %s %s\n", g.ID, g.NotRestorable)
		}
		if g.PassedOver != "" {
			fmt.Fprintf(c.stdout, "passed over by a restore: %s %s\n", g.ID, g.PassedOver)
		}
		if g.Parent != nil {
			fmt.Fprintf(c.stdout, "%s continues %s from sequence %d\n", g.ID, g.Parent.Generation, g.Parent.Sequence)
		}
	}
	for _, k := range inv.Ignored {
		fmt.Fprintf(c.stdout, "ignored (not this layout): %s\n", k)
	}
	return nil
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
