package kubernetes_test

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

// No Docker engine is needed: these tests read the repository's Dockerfile
// and the "build FROM this image" recipe in docs/operations.md, and check
// what the manifests rely on: the binary's path, the non-root user, a /data
// that user owns before VOLUME declares it, the port, and (in the recipe)
// that the agent's Python packages reach the final stage.

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, COPY, RUN, ...
	args string
}

type stage struct {
	from, name string
	ins        []instruction
}

// parseDockerfile splits a Dockerfile into stages. It knows comments,
// line continuations and FROM ... AS name; that is all these files use.
func parseDockerfile(t *testing.T, text string) []stage {
	t.Helper()
	var stages []stage
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		cmd, args, _ := strings.Cut(line, " ")
		in := instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			st := stage{from: f[0]}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			stages = append(stages, st)
			return
		}
		if len(stages) == 0 {
			if in.cmd != "ARG" {
				t.Fatalf("%s before the first FROM", in.cmd)
			}
			return
		}
		stages[len(stages)-1].ins = append(stages[len(stages)-1].ins, in)
	}
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if s, ok := strings.CutSuffix(trimmed, "\\"); ok {
			cur.WriteString(s + " ")
			continue
		}
		cur.WriteString(trimmed)
		flush()
	}
	flush()
	if len(stages) == 0 {
		t.Fatal("no FROM")
	}
	return stages
}

// index returns the position of the first instruction of s that matches.
func (s stage) index(match func(instruction) bool) int {
	for i, in := range s.ins {
		if match(in) {
			return i
		}
	}
	return -1
}

func (s stage) last(cmd string) string {
	v := ""
	for _, in := range s.ins {
		if in.cmd == cmd {
			v = in.args
		}
	}
	return v
}

// ownsData reports whether in makes /data a directory owned by 65532:
// COPY --chown=65532:65532 ... /data, RUN install -d -o 65532 -g 65532 /data,
// or RUN ... chown [-R] 65532:65532 /data.
func ownsData(in instruction) bool {
	switch in.cmd {
	case "COPY":
		f := strings.Fields(in.args)
		return strings.Contains(in.args, "--chown=65532:65532") && f[len(f)-1] == "/data"
	case "RUN":
		return regexp.MustCompile(`install -d (?:.* )?-o 65532 -g 65532 (?:.* )?/data(?:$|[ ;&])`).MatchString(in.args) ||
			regexp.MustCompile(`chown (?:-R )?65532:65532 /data(?:$|[ ;&])`).MatchString(in.args)
	}
	return false
}

// finalStageProblems lists what the manifests and the supervisor need of an
// image's last stage and do not find there.
func finalStageProblems(what string, st stage) []string {
	var p []string
	errorf := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }
	if u := st.last("USER"); u != "65532:65532" {
		errorf("%s: USER %q, want 65532:65532 (the StatefulSet's runAsUser and runAsGroup)", what, u)
	}
	vol := st.index(func(in instruction) bool { return in.cmd == "VOLUME" })
	own := st.index(ownsData)
	switch {
	case vol < 0 || st.ins[vol].args != `["/data"]`:
		errorf("%s: want VOLUME [\"/data\"]", what)
	case own < 0:
		errorf("%s: nothing makes /data owned by 65532 (COPY --chown=65532:65532 ... /data, or RUN install -d -o 65532 -g 65532 /data); "+
			"VOLUME alone creates it owned by root, and the supervisor cannot write there", what)
	case own > vol:
		errorf("%s: /data is made 65532's after VOLUME declares it; changes to a volume's directory after VOLUME are discarded", what)
	}
	if !strings.Contains(st.last("EXPOSE"), "9464") {
		errorf("%s: want EXPOSE 9464 (the StatefulSet's container port)", what)
	}
	var entry []string
	if err := json.Unmarshal([]byte(st.last("ENTRYPOINT")), &entry); err != nil || len(entry) == 0 || entry[0] != "/usr/local/bin/supervisor" {
		errorf("%s: ENTRYPOINT %s, want the exec form starting with /usr/local/bin/supervisor (the StatefulSet's command)", what, st.last("ENTRYPOINT"))
	}
	if st.index(func(in instruction) bool {
		f := strings.Fields(in.args)
		return in.cmd == "COPY" && f[len(f)-1] == "/usr/local/bin/supervisor"
	}) < 0 {
		errorf("%s: no COPY of the supervisor binary to /usr/local/bin/supervisor", what)
	}
	return p
}

func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	stages := parseDockerfile(t, string(b))
	final := stages[len(stages)-1]
	if !strings.Contains(final.from, ":nonroot") {
		t.Errorf("Dockerfile: final stage FROM %s, want a nonroot distroless base", final.from)
	}
	for _, p := range finalStageProblems("Dockerfile", final) {
		t.Error(p)
	}
}

// recipe returns the ```dockerfile block of docs/operations.md's "Running
// in a container".
func recipe(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "\n## Running in a container\n")
	if i < 0 {
		t.Fatal("docs/operations.md has no section \"## Running in a container\"")
	}
	m := regexp.MustCompile("(?s)\n```dockerfile\n(.*?)\n```\n").FindStringSubmatch(doc[i:])
	if m == nil {
		t.Fatal("docs/operations.md: no ```dockerfile block in \"Running in a container\"")
	}
	return m[1]
}

func TestAgentImageRecipe(t *testing.T) {
	stages := parseDockerfile(t, recipe(t))
	final := stages[len(stages)-1]
	for _, p := range finalStageProblems("recipe", final) {
		t.Error(p)
	}
	if err := checkVenvCopied(stages); err != nil {
		t.Errorf("recipe: %v", err)
	}
}

// checkVenvCopied: where the agent stage pip-installs packages, it installs
// them into a virtual environment, which the final stage copies whole, puts
// on PATH, and runs on the same base image (a venv's python links to the
// base's interpreter).
func checkVenvCopied(stages []stage) error {
	final := stages[len(stages)-1]
	for _, st := range stages[:len(stages)-1] {
		pip := st.index(func(in instruction) bool {
			return in.cmd == "RUN" && regexp.MustCompile(`\bpip3? install\b`).MatchString(in.args)
		})
		if pip < 0 {
			continue
		}
		venvRun := st.index(func(in instruction) bool { return in.cmd == "RUN" && strings.Contains(in.args, "-m venv ") })
		if venvRun < 0 || venvRun > pip {
			return fmt.Errorf("stage %s pip-installs without a virtual environment made before: the packages stay in that stage", st.name)
		}
		venv := strings.Fields(strings.SplitN(st.ins[venvRun].args, "-m venv ", 2)[1])[0]
		onPath := st.index(func(in instruction) bool {
			return in.cmd == "ENV" && strings.HasPrefix(in.args, "PATH="+venv+"/bin:")
		})
		if !strings.Contains(st.ins[pip].args, venv+"/bin/pip") && (onPath < 0 || onPath > pip) {
			return fmt.Errorf("stage %s: pip install runs outside the venv %s (put %s/bin first on PATH before it)", st.name, venv, venv)
		}
		if final.index(func(in instruction) bool {
			return in.cmd == "COPY" && in.args == "--from="+st.name+" "+venv+" "+venv
		}) < 0 {
			return fmt.Errorf("the final stage does not COPY --from=%s %s %s: the agent's packages are not in the image", st.name, venv, venv)
		}
		if final.index(func(in instruction) bool { return in.cmd == "ENV" && strings.HasPrefix(in.args, "PATH="+venv+"/bin:") }) < 0 {
			return fmt.Errorf("the final stage does not put %s/bin first on PATH", venv)
		}
		if st.from != final.from {
			return fmt.Errorf("stage %s is FROM %s, the final stage FROM %s: the venv's interpreter link would not resolve", st.name, st.from, final.from)
		}
	}
	return nil
}

// The recipe as it was (VOLUME without a /data of 65532's, pip packages
// left in the agent stage) fails these checks, and so does a /data made
// 65532's only after VOLUME: they are not formalities.
func TestRecipeChecksCatchTheOldRecipe(t *testing.T) {
	old := `FROM python:3.12-slim AS agent
RUN pip install requests
COPY . /app
FROM your-registry/supervisor:latest AS supervisor
FROM python:3.12-slim
COPY --from=supervisor /usr/local/bin/supervisor /usr/local/bin/supervisor
COPY --from=agent /app /app
USER 65532:65532
VOLUME ["/data"]
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/supervisor", "run", "--data-dir", "/data", "--"]
`
	stages := parseDockerfile(t, old)
	if err := checkVenvCopied(stages); err == nil {
		t.Error("pip packages left in the agent stage: not caught")
	}
	if p := finalStageProblems("old", stages[2]); len(p) != 1 || !strings.Contains(p[0], "nothing makes /data owned by 65532") {
		t.Errorf("a /data owned by root: problems %q", p)
	}
	late := parseDockerfile(t, old+"RUN install -d -m 0700 -o 65532 -g 65532 /data\n")
	if p := finalStageProblems("late", late[2]); len(p) != 1 || !strings.Contains(p[0], "after VOLUME") {
		t.Errorf("/data made 65532's after VOLUME: problems %q", p)
	}
}
