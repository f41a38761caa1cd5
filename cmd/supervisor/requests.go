package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"text/tabwriter"
	"time"

	"github.com/agent-sidecar/supervisor/supervisor"
	"github.com/agent-sidecar/supervisor/supervisor/requests"
)

// requestsCmd is `supervisor requests list|show|cancel`.
type requestsCmd struct{ env }

const requestsUsage = `Usage:
  supervisor requests list [--data-dir DIR] [--json]
  supervisor requests show ID [--data-dir DIR] [--json]
  supervisor requests cancel ID [--data-dir DIR]

list and show read the request journal (DATA_DIR/requests/journal), whether
or not a supervisor runs. cancel asks the running supervisor (its control
socket) to cancel a pending request, as DELETE /v1/requests/ID does.
`

func (c *requestsCmd) Run(_ context.Context, args []string) error {
	if len(args) == 0 {
		return &cliError{cmd: "requests", err: errors.New("missing subcommand: list, show or cancel"), usage: true}
	}
	sub, args := args[0], args[1:]
	switch {
	case isHelpArg(sub):
		fmt.Fprint(c.stdout, requestsUsage)
		return nil
	case sub == "list":
		return c.list(args)
	case sub == "show":
		return c.show(args)
	case sub == "cancel":
		return c.cancel(args)
	}
	return usageErr("requests", "unknown subcommand %q (want list, show or cancel)", truncate(sub, 40))
}

func (c *requestsCmd) loadRequests(dataDir string) ([]requests.View, error) {
	if err := statDataDir(dataDir); err != nil {
		return nil, err
	}
	views, rp, err := requests.Load(dataDir)
	if errors.Is(err, fs.ErrNotExist) {
		return []requests.View{}, nil // no request was ever journaled here
	}
	if err != nil {
		return nil, fmt.Errorf("read the request journal: %w", err)
	}
	if rp.Corruption != nil {
		fmt.Fprintln(c.stderr, "warning: the request journal is damaged:", rp.Corruption)
	}
	return views, nil
}

func (c *requestsCmd) list(args []string) error {
	f := newFlagSet(c.env, "requests list", "supervisor requests list [--data-dir DIR] [--json]",
		"Lists the requests the journal holds, in acceptance order: pending ones, and finished ones within --request-retention.")
	dataDir := f.dataDir()
	asJSON := f.Bool("json", false, "print JSON")
	if err := f.parseFlagsOnly(args); err != nil {
		return err
	}
	views, err := c.loadRequests(*dataDir)
	if err != nil {
		return failed("requests list", err)
	}
	if *asJSON {
		printJSON(c.stdout, views)
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tACCEPTED\tSTATUS\tATTEMPTS\tDEATHS\tERROR")
	for _, v := range views {
		code := ""
		if v.Error != nil {
			code = v.Error.Code
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", v.ID, v.Accepted.UTC().Format(time.RFC3339), v.Status, v.Attempts, len(v.Deaths), code)
	}
	return tw.Flush()
}

func (c *requestsCmd) show(args []string) error {
	f := newFlagSet(c.env, "requests show", "supervisor requests show ID [--data-dir DIR] [--json]",
		"Shows one request from the journal: status, attempts, the agent deaths it was in flight for, its answer or error.")
	dataDir := f.dataDir()
	asJSON := f.Bool("json", false, "print JSON")
	pos, _, _, err := f.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErr("requests show", "give one request ID (see `supervisor requests list`)")
	}
	views, err := c.loadRequests(*dataDir)
	if err != nil {
		return failed("requests show", err)
	}
	for _, v := range views {
		if v.ID != pos[0] {
			continue
		}
		if *asJSON {
			printJSON(c.stdout, v)
			return nil
		}
		fmt.Fprintf(c.stdout, "id:         %s\naccepted:   %s\ndeadline:   %s\nstatus:     %s\nattempts:   %d\n",
			v.ID, v.Accepted.UTC().Format(time.RFC3339Nano), v.Deadline.UTC().Format(time.RFC3339Nano), v.Status, v.Attempts)
		if v.Key != "" {
			fmt.Fprintf(c.stdout, "key:        %s\n", v.Key)
		}
		for i, d := range v.Deaths {
			fmt.Fprintf(c.stdout, "death %d:    %s %s (alone in flight: %v)\n", i+1, d.At.UTC().Format(time.RFC3339Nano), d.Reason, d.Alone)
		}
		if v.Data != nil {
			fmt.Fprintf(c.stdout, "data:       %s\n", v.Data)
		}
		if v.Error != nil {
			b, _ := json.Marshal(v.Error)
			fmt.Fprintf(c.stdout, "error:      %s\n", b)
		}
		if v.LateData != nil {
			fmt.Fprintf(c.stdout, "late answer kept beside the status: %s\n", v.LateData)
		}
		if v.LateError != nil {
			b, _ := json.Marshal(v.LateError)
			fmt.Fprintf(c.stdout, "late error kept beside the status: %s\n", b)
		}
		return nil
	}
	return failed("requests show", fmt.Errorf("no request %q in the journal of %s (never accepted, or forgotten after --request-retention)", truncate(pos[0], 64), *dataDir))
}

func (c *requestsCmd) cancel(args []string) error {
	f := newFlagSet(c.env, "requests cancel", "supervisor requests cancel ID [--data-dir DIR]",
		"Cancels a pending request through the running supervisor's control socket (as DELETE /v1/requests/ID): not yet delivered, it never is; in flight, an agent that opted in is sent cancel_request.")
	dataDir := f.dataDir()
	pos, _, _, err := f.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErr("requests cancel", "give one request ID (see `supervisor requests list`)")
	}
	if err := statDataDir(*dataDir); err != nil {
		return failed("requests cancel", err)
	}
	resp, err := supervisor.Call(*dataDir, supervisor.ControlRequest{Op: supervisor.OpCancelRequest, RequestID: pos[0]}, controlTimeout)
	if err != nil {
		if errors.Is(err, supervisor.ErrNotRunning) {
			return failed("requests cancel", fmt.Errorf("%w: a request is cancelled by the supervisor that holds it; start it, then cancel again", err))
		}
		return failed("requests cancel", err)
	}
	fmt.Fprintln(c.stdout, resp.Message)
	return nil
}
