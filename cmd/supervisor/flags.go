package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/agent-sidecar/supervisor/internal/clip"
)

// envPrefix prefixes the environment variable of a flag: --heartbeat-timeout
// is SUPERVISOR_HEARTBEAT_TIMEOUT (SPEC §13).
const envPrefix = "SUPERVISOR_"

// envName is the environment variable that may set flag name.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// flagSet is one command's flags: Go's flag package underneath, with
// arguments and flags accepted in any order, values from the environment,
// one-line errors and a help text that names both the flag and its variable.
type flagSet struct {
	*flag.FlagSet
	cmd      string // "checkpoints show"
	synopsis string // "supervisor checkpoints show ID [--data-dir DIR] [--json]"
	about    string // a paragraph under the synopsis
	e        env
	meta     map[string]string // flag → value name in help ("DIR"); default by type
	// fromEnv lists the flags read from the environment when absent from
	// the command line: all of run's; --data-dir elsewhere.
	fromEnv func(name string) bool
}

func newFlagSet(e env, cmd, synopsis, about string) *flagSet {
	fs := flag.NewFlagSet("supervisor "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are reported once, by report
	fs.Usage = func() {}
	return &flagSet{FlagSet: fs, cmd: cmd, synopsis: synopsis, about: about, e: e, meta: map[string]string{},
		fromEnv: func(name string) bool { return name == "data-dir" }}
}

// dataDir defines --data-dir, which every command has.
func (f *flagSet) dataDir() *string {
	p := f.String("data-dir", defaultDataDir, "the supervisor's data directory")
	f.meta["data-dir"] = "DIR"
	return p
}

// duration defines a duration flag whose error for a bare number says to
// add a unit.
func (f *flagSet) duration(p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	f.Var((*durationValue)(p), name, usage)
	f.meta[name] = "D"
}

// durationValue is time.Duration as a flag.Value with a helpful error.
type durationValue time.Duration

func (d *durationValue) String() string { return (*time.Duration)(d).String() }

func (d *durationValue) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		if _, nerr := strconv.ParseFloat(s, 64); nerr == nil {
			return fmt.Errorf("a duration needs a unit: use a unit, e.g. %ss or %sms", s, s)
		}
		return errors.New("not a duration: use e.g. 500ms, 5s, 2m or 1h")
	}
	*d = durationValue(v)
	return nil
}

// parse parses args with flags before, between and after the positional
// arguments, up to a "--". It returns the positional arguments and, when
// there is a "--", what follows it (dashdash reports whether there was
// one). Flags absent from the command line are then taken from the
// environment. -h/--help prints the help to stdout and returns errHelp.
func (f *flagSet) parse(args []string) (pos, afterDashDash []string, dashdash bool, err error) {
	flagArgs, pos, afterDashDash, dashdash := f.split(args)
	if err := f.FlagSet.Parse(flagArgs); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			f.printHelp(f.e.stdout)
			return nil, nil, false, errHelp
		}
		return nil, nil, false, usageErr(f.cmd, "%s", tidyFlagError(err))
	}
	if err := f.applyEnv(); err != nil {
		return nil, nil, false, err
	}
	return pos, afterDashDash, dashdash, nil
}

// split sorts args into flags (with their values), positional arguments,
// and what follows a "--".
func (f *flagSet) split(args []string) (flagArgs, pos, afterDashDash []string, dashdash bool) {
	flagArgs, at, afterDashDash, dashdash := f.splitAt(args)
	for _, i := range at {
		pos = append(pos, args[i])
	}
	return flagArgs, pos, afterDashDash, dashdash
}

// splitAt is split with the positional arguments given by their index in
// args.
func (f *flagSet) splitAt(args []string) (flagArgs []string, pos []int, afterDashDash []string, dashdash bool) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			afterDashDash, dashdash = args[i+1:], true
			break
		}
		if len(a) < 2 || a[0] != '-' {
			pos = append(pos, i)
			continue
		}
		flagArgs = append(flagArgs, a)
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		if fl := f.Lookup(name); fl != nil && !isBool(fl) && i+1 < len(args) {
			i++
			flagArgs = append(flagArgs, args[i])
		}
	}
	return flagArgs, pos, afterDashDash, dashdash
}

// firstStray returns the first argument before any "--" that split would
// not take as a known flag or its value: an unknown flag (as "--name",
// unknown true) or a positional argument (as given). split cannot know
// whether an unknown flag takes a value, so in "--bogus 3" the "3" is a
// positional argument there; the flag came first, and is what to name.
// Help flags are known. "" when there is none.
func (f *flagSet) firstStray(args []string) (arg string, unknown bool) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		if len(a) < 2 || a[0] != '-' {
			return a, false
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		fl := f.Lookup(name)
		if fl == nil && name != "h" && name != "help" {
			return "--" + name, true
		}
		if fl != nil && !hasValue && !isBool(fl) && i+1 < len(args) {
			i++
		}
	}
	return "", false
}

// parseFlagsOnly parses args for a command that takes flags and nothing else.
func (f *flagSet) parseFlagsOnly(args []string) error {
	pos, _, _, err := f.parse(args)
	if err != nil {
		return err
	}
	return f.noArgs(pos)
}

// noArgs is a usage error for positional arguments a command does not take.
func (f *flagSet) noArgs(pos []string) error {
	if len(pos) > 0 {
		return usageErr(f.cmd, "unexpected argument %q (this command takes only flags)", pos[0])
	}
	return nil
}

func isBool(fl *flag.Flag) bool {
	b, ok := fl.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// tidyFlagError rewrites the flag package's errors in the syntax the
// documentation uses (--name, not -name).
func tidyFlagError(err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return fmt.Sprintf("unknown flag --%s", name)
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return fmt.Sprintf("--%s needs a value", name)
	}
	if strings.Contains(msg, " for flag -") {
		return strings.Replace(msg, " for flag -", " for --", 1)
	}
	return strings.Replace(msg, " for -", " for --", 1)
}

// applyEnv sets each flag that may come from the environment, was not on
// the command line, and has its variable set. A value that does not parse
// is a usage error naming the variable.
func (f *flagSet) applyEnv() error {
	if f.e.lookupEnv == nil {
		return nil
	}
	set := map[string]bool{}
	f.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	var err error
	f.VisitAll(func(fl *flag.Flag) {
		if err != nil || set[fl.Name] || !f.fromEnv(fl.Name) {
			return
		}
		v, ok := f.e.lookupEnv(envName(fl.Name))
		if !ok {
			return
		}
		if serr := f.Set(fl.Name, v); serr != nil { // Set: Visit sees it as given
			err = usageErr(f.cmd, "environment variable %s=%q (for --%s): %v", envName(fl.Name), truncate(v, 64), fl.Name, serr)
		}
	})
	return err
}

// printHelp writes the synopsis and every flag with its default and its
// environment variable.
func (f *flagSet) printHelp(w io.Writer) {
	fmt.Fprintf(w, "Usage: %s\n", f.synopsis)
	if f.about != "" {
		fmt.Fprintf(w, "\n%s\n", f.about)
	}
	var flags []*flag.Flag
	f.VisitAll(func(fl *flag.Flag) { flags = append(flags, fl) })
	if len(flags) == 0 {
		return
	}
	sort.Slice(flags, func(i, j int) bool { return flags[i].Name < flags[j].Name })
	fmt.Fprintln(w, "\nFlags (and the environment variable used when the flag is not given):")
	for _, fl := range flags {
		head := "  --" + fl.Name
		if m := f.metaOf(fl); m != "" {
			head += " " + m
		}
		if f.fromEnv(fl.Name) {
			head += "  $" + envName(fl.Name)
		}
		def := ""
		if fl.DefValue != "" && fl.DefValue != "0" && fl.DefValue != "false" && fl.DefValue != "0s" {
			def = fmt.Sprintf(" (default %s)", fl.DefValue)
		}
		fmt.Fprintf(w, "%s\n      %s%s\n", head, fl.Usage, def)
	}
}

func (f *flagSet) metaOf(fl *flag.Flag) string {
	if m, ok := f.meta[fl.Name]; ok {
		return m
	}
	if isBool(fl) {
		return ""
	}
	switch fl.Value.(type) {
	case *durationValue:
		return "D"
	}
	if _, err := strconv.ParseFloat(fl.DefValue, 64); err == nil {
		return "N"
	}
	return "VALUE"
}

// truncate caps text that came from outside before it goes into a message.
func truncate(s string, n int) string { return clip.String(s, n) }
