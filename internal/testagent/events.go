package testagent

import (
	"encoding/json"
	"fmt"
	"os"
	"sync"
)

// eventLog appends one JSON object per line to a file opened with O_APPEND,
// each line in a single write, so several agent processes (a primary and a
// shadow, or successive incarnations) can share one file. A nil *eventLog
// discards events.
type eventLog struct {
	mu   sync.Mutex
	f    *os.File
	pid  int
	role string
}

func openEventLog(path string, role string) (*eventLog, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("testagent: open events file: %w", err)
	}
	return &eventLog{f: f, pid: os.Getpid(), role: role}, nil
}

// emit writes {"event": name, "pid", "role", kv...}. kv alternates keys and
// values. Write errors are returned for the caller to log; events are
// diagnostics and never stop the agent.
func (e *eventLog) emit(name string, kv ...any) error {
	if e == nil {
		return nil
	}
	m := make(map[string]any, 3+len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i].(string)] = kv[i+1]
	}
	m["event"] = name
	m["pid"] = e.pid
	m["role"] = e.role
	line, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("testagent: encode %s event: %w", name, err)
	}
	line = append(line, '\n')
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, err := e.f.Write(line); err != nil {
		return fmt.Errorf("testagent: write %s event: %w", name, err)
	}
	return nil
}

func (e *eventLog) close() error {
	if e == nil {
		return nil
	}
	return e.f.Close()
}
