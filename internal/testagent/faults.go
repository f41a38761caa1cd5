package testagent

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os/exec"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// sendGarbage breaks the protocol the way --garbage says.
func (a *refAgent) sendGarbage() error {
	a.emit("garbage", "kind", a.cfg.Garbage)
	a.log.Warn("sending garbage as asked by --garbage", "kind", a.cfg.Garbage)
	switch a.cfg.Garbage {
	case GarbageBytes:
		// Random bytes; the first is forced high so the length they seem to
		// declare is far above any frame limit.
		b := make([]byte, 64)
		rand.Read(b)
		b[0] |= 0xF0
		return a.conn.WriteRaw(b)
	case GarbageOversize:
		return a.conn.WriteRaw([]byte{0xFF, 0xFF, 0xFF, 0xFF, 'j', 'u', 'n', 'k'})
	case GarbageZero:
		return a.conn.WriteRaw([]byte{0, 0, 0, 0})
	case GarbageInvalid:
		b, err := msgpack.Marshal(map[string]any{"type": "no_such_type", "timestamp": time.Now().Unix()})
		if err != nil {
			return err
		}
		return a.conn.SendRawFrame(b)
	case GarbageNotMap:
		b, err := msgpack.Marshal([]any{"heartbeat", time.Now().Unix()})
		if err != nil {
			return err
		}
		return a.conn.SendRawFrame(b)
	}
	return fmt.Errorf("testagent: unknown garbage kind %q", a.cfg.Garbage)
}

// flood writes numbered lines to w until ctx ends or w fails, pausing a
// millisecond every 64 lines so it floods without spinning a core.
func flood(ctx context.Context, w io.Writer) {
	line := []byte("testagent: stderr flood, as asked by --stderr-flood: 0123456789abcdefghijklmnopqrstuvwxyz\n")
	for i := 0; ctx.Err() == nil; i++ {
		if _, err := w.Write(line); err != nil {
			return
		}
		if i%64 == 63 {
			time.Sleep(time.Millisecond)
		}
	}
}

// forkGrandchild starts `sleep 3600` in this process's group and lets it go:
// it is meant to outlive the agent, for the supervisor to reap.
func forkGrandchild() (int, error) {
	cmd := exec.Command("sleep", "3600")
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("testagent: --fork-grandchild: %w", err)
	}
	pid := cmd.Process.Pid
	if err := cmd.Process.Release(); err != nil {
		return pid, fmt.Errorf("testagent: --fork-grandchild: release: %w", err)
	}
	return pid, nil
}
