package supervisor

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/examples/refagent"
	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wire"
)

// TestMain lets the test binary double as an agent: the supervisor under
// test re-executes it with SUPERVISOR_TEST_REFAGENT=1 (the reference agent)
// or SUPERVISOR_TEST_FLOOD=N (a minimal agent that floods N wal_entry frames).
func TestMain(m *testing.M) {
	if os.Getenv("SUPERVISOR_TEST_REFAGENT") == "1" {
		os.Exit(refagent.Main(os.Args[1:]))
	}
	if n := os.Getenv("SUPERVISOR_TEST_FLOOD"); n != "" {
		count, _ := strconv.Atoi(n)
		if err := floodAgent(count, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "flood agent:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// floodAgent is the cheapest possible agent: one heartbeat, then n 1 KiB
// wal_entry frames as fast as the pipe takes them (the frame is encoded once
// with a fixed-width sequence that is patched per entry), then it waits for
// the supervisor to close its input. It measures the supervisor, not an
// agent's own work.
func floodAgent(n int, in io.Reader, out io.Writer) error {
	w := bufio.NewWriterSize(out, 256<<10)
	hb, err := schema.Encode(&schema.Heartbeat{})
	if err != nil {
		return err
	}
	if _, err := w.Write(wire.AppendFrame(nil, hb)); err != nil {
		return err
	}
	const marker = 0x0102030405060708
	params, err := msgpack.Marshal(map[string]any{"content": strings.Repeat("x", 960)})
	if err != nil {
		return err
	}
	var e bytes.Buffer
	enc := msgpack.NewEncoder(&e)
	_ = enc.EncodeMapLen(3)
	_ = enc.EncodeString("operation")
	_ = enc.EncodeString(schema.OpMemoryAdd)
	_ = enc.EncodeString("params")
	e.Write(params)
	_ = enc.EncodeString("sequence")
	_ = enc.EncodeUint64(marker) // 0xcf + 8 bytes: fixed width
	payload, err := schema.Encode(&schema.WALEntry{Entry: schema.WALRecord{Raw: e.Bytes()}})
	if err != nil {
		return err
	}
	frame := wire.AppendFrame(nil, payload)
	var mk [8]byte
	binary.BigEndian.PutUint64(mk[:], marker)
	at := bytes.Index(frame, mk[:])
	if at < 0 {
		return fmt.Errorf("sequence not found in the encoded frame")
	}
	for seq := 1; seq <= n; seq++ {
		binary.BigEndian.PutUint64(frame[at:], uint64(seq))
		if _, err := w.Write(frame); err != nil {
			return err
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, in)
	return nil
}
