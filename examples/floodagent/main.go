// Command floodagent is the smallest useful agent: it speaks the protocol
// with raw frames (no client package), sends one heartbeat, then N 1 KiB
// wal_entry frames as fast as the pipe takes them, with a small checkpoint
// every so often, then waits for the supervisor to close its input.
// Benchmarks use it to measure the supervisor's own capacity, without an
// agent's work in the way.
//
//	supervisor run -- floodagent -n 1000000
package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wire"
)

func main() {
	n := flag.Int("n", 100000, "number of wal_entry frames to send")
	every := flag.Int("checkpoint-every", 50000, "send a small checkpoint after every `N` entries (0 = never): the supervisor refuses a WAL tail larger than a restore may be, as any agent must checkpoint")
	flag.Parse()
	in, out := os.Stdin, os.Stdout
	if os.Getenv("SUPERVISOR_TRANSPORT") == "fd" { // --stdio=false: read fd 3, write fd 4
		in, out = os.NewFile(3, "frames-in"), os.NewFile(4, "frames-out")
	}
	if err := floodAgent(*n, *every, in, out); err != nil {
		fmt.Fprintln(os.Stderr, "floodagent:", err)
		os.Exit(1)
	}
}

// floodAgent is the cheapest possible agent: one heartbeat, then n 1 KiB
// wal_entry frames as fast as the pipe takes them (the frame is encoded once
// with a fixed-width sequence that is patched per entry) with a small
// checkpoint after every `every` entries, then it waits for the supervisor
// to close its input. It measures the supervisor, not an agent's own work.
//
// At most one checkpoint is unacknowledged: before sending one it waits for
// the previous one's checkpoint_ack. Faster than the supervisor can store
// checkpoints, the WAL tail after the newest stored one would otherwise
// outgrow what a restore may hold, and the supervisor would refuse entries
// (WAL_FULL) — as it must with any agent that does not checkpoint.
func floodAgent(n, every int, in io.Reader, out io.Writer) error {
	acks := make(chan error, 1)
	go readAcks(in, acks)
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
	unacked := false
	for seq := 1; seq <= n; seq++ {
		binary.BigEndian.PutUint64(frame[at:], uint64(seq))
		if _, err := w.Write(frame); err != nil {
			return err
		}
		if every > 0 && seq%every == 0 {
			if unacked {
				if err := w.Flush(); err != nil {
					return err
				}
				if err := <-acks; err != nil {
					return err
				}
			}
			cp, err := schema.Encode(&schema.Checkpoint{Data: schema.RawMap(map[string]any{"upto": seq})})
			if err != nil {
				return err
			}
			if _, err := w.Write(wire.AppendFrame(nil, cp)); err != nil {
				return err
			}
			unacked = true
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for err := range acks { // until the supervisor closes our input
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
	}
	return nil
}

// readAcks reads the supervisor's frames until the input ends: a nil on
// acks for each checkpoint_ack, an error for a checkpoint refused or a read
// failure; other messages are ignored. It closes acks at the end of input.
func readAcks(in io.Reader, acks chan<- error) {
	defer close(acks)
	r := wire.NewReader(in, 0)
	for {
		payload, err := r.ReadFrame()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				acks <- fmt.Errorf("reading the supervisor's frames: %w", err)
			}
			return
		}
		switch m, err := schema.Decode(schema.ToAgent, payload); m := m.(type) {
		case nil:
			acks <- fmt.Errorf("undecodable frame from the supervisor: %w", err)
			return
		case *schema.CheckpointAck:
			acks <- nil
		case *schema.Error:
			if m.Error.Code == schema.CodeCheckpointFailed {
				acks <- fmt.Errorf("checkpoint refused: %s: %s", m.Error.Code, m.Error.Message)
				return
			}
		}
	}
}
