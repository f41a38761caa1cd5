// Command hostileagent is an agent that attacks the supervisor the ways
// issue 12 names; the e2e tests in test/bounds_test.go run it. Its mode is
// the first argument; what it observes goes to the file in $HOSTILE_OUT,
// one line per fact ("ack <checkpoint_id> <size>", "pid <n>", ...).
//
//	checkpoints  20 compressed checkpoints of 100 MiB each uncompressed,
//	             200 zstd frames lying about their size, 30 evolution_intents
//	             with a 1 MiB duplicate key, then heartbeats until stopped
//	chatty       wal entries and a small checkpoint every 100 ms, and a stream
//	             of stderr lines (the supervisor logs each), until stopped
//	setsid       starts a grandchild in its own session (as Python's
//	             start_new_session=True does), then heartbeats until stopped
//	setsid-exit  the same, then exits 1 after 20 ms (a crash loop that leaks)
//	exit         exits at once with the code in $HOSTILE_CODE
//	lyingheader  a frame header declaring 90 MiB, 2 MiB of its payload, then
//	             nothing (it stalls mid-frame until killed)
//	plaincheckpoints
//	             8 uncompressed checkpoints of 30 MiB each, back to back,
//	             then heartbeats until stopped
//	bigstate     a protocol v1 agent with a big state: unless the file
//	             $HOSTILE_MARK exists (it creates it), one uncompressed
//	             checkpoint of $HOSTILE_SIZE bytes (default 100 MB) of text
//	             and float32 embeddings, then $HOSTILE_ENTRIES wal entries
//	             of 1 KiB; in every incarnation it notes each restore's
//	             digest ("restored ID sha HEX entries N at UNIXNANO", the
//	             time its last byte was read) and a frame cut short ("cut")
//	oversize     $HOSTILE_COUNT uncompressed checkpoint frames of
//	             $HOSTILE_SIZE bytes each (streamed, never built in memory),
//	             then a small checkpoint, then heartbeats until stopped
//	stallcheckpoint
//	             heartbeats for a second, then the first 1 MiB of an 8 MiB
//	             checkpoint frame (notes "stalled"), then nothing: it hangs
//	             mid-frame, alive, until killed
package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wire"
)

var (
	ready = make(chan struct{}) // closed once want is set
	want  string                // sha256 of the checkpoint data sent
	outMu sync.Mutex
	out   *os.File
	w     *wire.Writer
	wMu   sync.Mutex
)

func note(format string, args ...any) {
	outMu.Lock()
	defer outMu.Unlock()
	if out != nil {
		fmt.Fprintf(out, format+"\n", args...)
	}
}

func send(payload []byte) {
	wMu.Lock()
	defer wMu.Unlock()
	if err := w.WriteFrame(payload); err != nil {
		os.Exit(0) // the supervisor is gone
	}
}

func marshal(m map[string]any) []byte {
	m["timestamp"] = time.Now().Unix()
	m["version"] = 2
	b, err := msgpack.Marshal(m)
	if err != nil {
		panic(err)
	}
	return b
}

func heartbeats() {
	for {
		send(marshal(map[string]any{"type": "heartbeat"}))
		time.Sleep(200 * time.Millisecond)
	}
}

// noteReply decodes a frame from the supervisor and notes the replies every
// mode reports (acks, errors, wal_acks); it returns the message, nil when
// it cannot be decoded.
func noteReply(p []byte) schema.Message {
	m, err := schema.Decode(schema.ToAgent, p)
	if err != nil {
		note("undecodable %v", err)
		return nil
	}
	switch x := m.(type) {
	case *schema.CheckpointAck:
		note("ack %s %d", x.CheckpointID, x.Size)
	case *schema.Error:
		note("error %s", x.Error.Code)
	case *schema.WALAck:
		note("walack %d", x.Sequence)
	}
	return m
}

// readReplies notes what the supervisor sends.
func readReplies() {
	r := wire.NewReader(os.Stdin, 256<<20)
	for {
		p, err := r.ReadFrame()
		if err != nil {
			os.Exit(0)
		}
		if x, ok := noteReply(p).(*schema.Restore); ok {
			<-ready // the digest of what we checkpointed
			sum := sha256.Sum256(x.Snapshot)
			note("restored %s compressed=%v match=%v", x.CheckpointID, x.Compress, hex.EncodeToString(sum[:]) == want)
		}
	}
}

// bigCheckpoint returns the zstd frame of a checkpoint data map of about
// 100 MiB, built as a stream so this agent stays small too.
func bigCheckpoint() []byte {
	var buf bytes.Buffer
	digest := sha256.New()
	defer func() { want = hex.EncodeToString(digest.Sum(nil)); close(ready) }()
	enc, err := zstd.NewWriter(&buf, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1))
	if err != nil {
		panic(err)
	}
	var size uint32 = 100<<20 - 64<<10
	// {"agent_state": {"status": "idle"}, "blob": bin32(size)}
	head, _ := msgpack.Marshal(map[string]any{"agent_state": map[string]any{"status": "idle"}})
	head[0] = 0x82 // two pairs: agent_state and blob
	head = append(head, 0xa4, 'b', 'l', 'o', 'b', 0xc6, byte(size>>24), byte(size>>16), byte(size>>8), byte(size))
	enc.Write(head)
	digest.Write(head)
	chunk := make([]byte, 64<<10)
	for i := range chunk {
		chunk[i] = byte(i * 7 % 251)
	}
	rng := uint64(12345)
	for n := 0; n < int(size); n += len(chunk) {
		// About 1 KiB of fresh bytes per 64 KiB: 1.5 MB compressed in all,
		// as in the issue.
		for i := 0; i < 900; i++ {
			rng ^= rng << 13
			rng ^= rng >> 7
			rng ^= rng << 17
			chunk[i] = byte(rng)
		}
		enc.Write(chunk[:min(len(chunk), int(size)-n)])
		digest.Write(chunk[:min(len(chunk), int(size)-n)])
	}
	enc.Close()
	return buf.Bytes()
}

// sendOversize writes one checkpoint frame of size bytes, {type, timestamp,
// data: {agent_state, blob: bin32}}, in 64 KiB pieces: its first sent
// bytes after the header (all of it when sent >= size).
func sendOversize(size, sent int) {
	head := marshal(map[string]any{"type": "checkpoint"})
	head[0]++ // one more pair: data
	head = append(head, 0xa4, 'd', 'a', 't', 'a')
	st, _ := msgpack.Marshal(map[string]any{"agent_state": map[string]any{"status": "idle"}})
	st[0] = 0x82
	head = append(head, st...)
	blob := size - len(head) - 10
	head = append(head, 0xa4, 'b', 'l', 'o', 'b', 0xc6, byte(blob>>24), byte(blob>>16), byte(blob>>8), byte(blob))
	wMu.Lock()
	defer wMu.Unlock()
	hdr := []byte{byte(size >> 24), byte(size >> 16), byte(size >> 8), byte(size)}
	if _, err := os.Stdout.Write(append(hdr, head...)); err != nil {
		os.Exit(0)
	}
	chunk := make([]byte, 64<<10)
	blob = min(blob, sent-len(head))
	for n := 0; n < blob; n += len(chunk) {
		if _, err := os.Stdout.Write(chunk[:min(len(chunk), blob-n)]); err != nil {
			os.Exit(0)
		}
	}
}

// lyingFrame declares 100 MiB - 1 of content and holds a few bytes.
func lyingFrame(body []byte) []byte {
	b := []byte{0x28, 0xb5, 0x2f, 0xfd, 0xe0}
	fcs := uint64(100<<20 - 1)
	for i := 0; i < 8; i++ {
		b = append(b, byte(fcs>>(8*i)))
	}
	h := uint32(len(body))<<3 | 1
	b = append(b, byte(h), byte(h>>8), byte(h>>16))
	return append(b, body...)
}

func main() {
	if p := os.Getenv("HOSTILE_OUT"); p != "" {
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			panic(err)
		}
		out = f
	}
	w = wire.NewWriter(os.Stdout, 0)
	mode := ""
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	note("pid %d", os.Getpid())
	switch mode {
	case "exit":
		code, _ := strconv.Atoi(os.Getenv("HOSTILE_CODE"))
		os.Exit(code)
	case "checkpoints":
		go readReplies()
		go heartbeats()
		z := bigCheckpoint()
		note("compressed %d", len(z))
		lie := lyingFrame([]byte{0x80})
		for i := 0; i < 20; i++ {
			send(marshal(map[string]any{"type": "checkpoint", "compressed": true, "compression": "zstd", "data": z}))
			for j := 0; j < 10; j++ {
				send(marshal(map[string]any{"type": "checkpoint", "compressed": true, "compression": "zstd", "data": lie}))
			}
		}
		// evolution_intent with a 1 MiB key that occurs twice in
		// expected_improvement.
		key := strings.Repeat("k", 1<<20-300)
		var ei bytes.Buffer
		e := msgpack.NewEncoder(&ei)
		e.EncodeMapLen(4)
		e.EncodeString("type")
		e.EncodeString("evolution_intent")
		e.EncodeString("timestamp")
		e.EncodeInt(time.Now().Unix())
		e.EncodeString("version")
		e.EncodeInt(2)
		e.EncodeString("hypothesis")
		e.EncodeMapLen(4)
		e.EncodeString("reason")
		e.EncodeString("r")
		e.EncodeString("target")
		e.EncodeString("t")
		e.EncodeString("new_code")
		e.EncodeString("c")
		e.EncodeString("expected_improvement")
		e.EncodeMapLen(2)
		for range 2 {
			e.EncodeString(key)
			e.EncodeFloat64(0.1)
		}
		for i := 0; i < 30; i++ {
			send(ei.Bytes())
		}
		note("sent all")
		select {}
	case "lyingheader":
		go readReplies()
		send(marshal(map[string]any{"type": "heartbeat"}))
		wMu.Lock()
		hdr := []byte{0, 0, 0, 0}
		binary.BigEndian.PutUint32(hdr, 90<<20)
		os.Stdout.Write(hdr)
		os.Stdout.Write(bytes.Repeat([]byte{0x90}, 2<<20))
		note("sent all")
		select {}
	case "plaincheckpoints":
		go readReplies()
		go heartbeats()
		close(ready)
		blob := bytes.Repeat([]byte("checkpoint "), 30<<20/11)
		for i := 0; i < 8; i++ {
			send(marshal(map[string]any{"type": "checkpoint", "data": map[string]any{
				"agent_state": map[string]any{"status": "idle"}, "n": i, "blob": blob}}))
		}
		note("sent all")
		select {}
	case "bigstate":
		bigState()
	case "oversize":
		go readReplies()
		go heartbeats()
		size, _ := strconv.Atoi(os.Getenv("HOSTILE_SIZE"))
		count, _ := strconv.Atoi(os.Getenv("HOSTILE_COUNT"))
		for range count {
			sendOversize(size, size)
		}
		send(marshal(map[string]any{"type": "checkpoint", "data": map[string]any{"agent_state": map[string]any{"status": "idle"}}}))
		note("sent all")
		select {}
	case "stallcheckpoint":
		// Heartbeats from this goroutine only: one sent after the cut would
		// land inside the frame.
		go readReplies()
		for range 5 {
			send(marshal(map[string]any{"type": "heartbeat"}))
			time.Sleep(200 * time.Millisecond)
		}
		sendOversize(8<<20, 1<<20)
		note("stalled")
		select {}
	case "deaf":
		// Heartbeats and never reads its input: what is sent to it fills
		// the pipe and waits (TestOutboundQueueBoundedByBytes).
		heartbeats()
	case "chatty":
		go readReplies()
		go heartbeats()
		go func() {
			line := strings.Repeat("agent chatter ", 20)
			for i := 0; ; i++ {
				fmt.Fprintf(os.Stderr, "%d %s\n", i, line)
				if i%100 == 0 {
					time.Sleep(time.Millisecond)
				}
			}
		}()
		for seq := 1; ; seq++ {
			send(marshal(map[string]any{"type": "wal_entry",
				"data": map[string]any{"operation": "memory_add", "params": map[string]any{"n": seq}, "sequence": seq}}))
			if seq%5 == 0 { // acknowledged: the supervisor is still working for us
				send(marshal(map[string]any{"type": "checkpoint", "data": map[string]any{"n": seq}}))
			}
			time.Sleep(20 * time.Millisecond)
		}
	case "setsid", "setsid-exit":
		go readReplies()
		cmd := exec.Command("sleep", "1000")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			panic(err)
		}
		note("grandchild %d", cmd.Process.Pid)
		if mode == "setsid-exit" {
			send(marshal(map[string]any{"type": "heartbeat"}))
			time.Sleep(20 * time.Millisecond)
			os.Exit(1)
		}
		heartbeats()
	default:
		fmt.Fprintln(os.Stderr, "hostileagent: unknown mode", mode)
		os.Exit(2)
	}
}

// bigState is the bigstate mode (protocol v1: no version field).
func bigState() {
	v1 := func(m map[string]any) []byte {
		m["timestamp"] = time.Now().Unix()
		b, err := msgpack.Marshal(m)
		if err != nil {
			panic(err)
		}
		return b
	}
	go func() {
		// A large frame is read through one 1 MiB buffer when
		// $HOSTILE_DISCARD is set (timing only: its digest is not taken),
		// else into one buffer of its size.
		discard := os.Getenv("HOSTILE_DISCARD") != ""
		in := bufio.NewReaderSize(os.Stdin, 1<<20)
		chunk := make([]byte, 1<<20)
		for {
			var hdr [4]byte
			_, err := io.ReadFull(in, hdr[:])
			size := int(binary.BigEndian.Uint32(hdr[:]))
			var p []byte
			if err == nil && discard && size > 1<<20 {
				for left := size; left > 0 && err == nil; {
					var n int
					n, err = io.ReadFull(in, chunk[:min(left, len(chunk))])
					left -= n
				}
				if err == nil {
					note("restored %q sha - entries -1 bytes %d at %d", "?", size, time.Now().UnixNano())
					continue
				}
			} else if err == nil {
				p = make([]byte, size)
				_, err = io.ReadFull(in, p)
			}
			at := time.Now().UnixNano()
			if err != nil {
				if err != io.EOF {
					note("cut %v", err)
				}
				os.Exit(1)
			}
			if x, ok := noteReply(p).(*schema.Restore); ok {
				sum := sha256.Sum256(x.Snapshot)
				note("restored %q sha %s entries %d bytes %d at %d", x.CheckpointID, hex.EncodeToString(sum[:]), len(x.WALEntries), len(p), at)
			}
		}
	}()
	go func() {
		for {
			send(v1(map[string]any{"type": "heartbeat"}))
			time.Sleep(200 * time.Millisecond)
		}
	}()
	mark := os.Getenv("HOSTILE_MARK")
	if _, err := os.Stat(mark); mark == "" || err == nil {
		select {}
	}
	os.WriteFile(mark, nil, 0o600)
	size := 100 << 20
	if n, err := strconv.Atoi(os.Getenv("HOSTILE_SIZE")); err == nil {
		size = n
	}
	// {"agent_state": {"status": "idle"}, "text": str32, "emb": bin32}:
	// 60% text, 40% float32 embeddings.
	head, _ := msgpack.Marshal(map[string]any{"agent_state": map[string]any{"status": "idle"}})
	head[0] = 0x83
	textLen := size * 6 / 10
	embLen := (size - textLen - len(head) - 20) &^ 3
	data := make([]byte, 0, size)
	data = append(data, head...)
	data = append(data, 0xa4, 't', 'e', 'x', 't', 0xdb, byte(textLen>>24), byte(textLen>>16), byte(textLen>>8), byte(textLen))
	words := strings.Fields("the agent remembered that the user prefers short answers and asked about the weather in Lisbon on Tuesday")
	rng := uint64(99)
	for n := 0; n < textLen; {
		rng ^= rng << 13
		rng ^= rng >> 7
		rng ^= rng << 17
		w := words[rng%uint64(len(words))] + " "
		w = w[:min(len(w), textLen-n)]
		data = append(data, w...)
		n += len(w)
	}
	data = append(data, 0xa3, 'e', 'm', 'b', 0xc6, byte(embLen>>24), byte(embLen>>16), byte(embLen>>8), byte(embLen))
	for i := 0; i < embLen/4; i++ {
		rng ^= rng << 13
		rng ^= rng >> 7
		rng ^= rng << 17
		f := float32(int64(rng%2000000)-1000000) / 1e6
		data = binary.LittleEndian.AppendUint32(data, math.Float32bits(f))
	}
	sum := sha256.Sum256(data)
	note("digest %s size %d", hex.EncodeToString(sum[:]), len(data))
	frame := v1(map[string]any{"type": "checkpoint", "data": msgpack.RawMessage(data)})
	data = nil
	send(frame)
	frame = nil
	entries, _ := strconv.Atoi(os.Getenv("HOSTILE_ENTRIES"))
	pad := strings.Repeat("e", 950)
	for seq := 1; seq <= entries; seq++ {
		send(v1(map[string]any{"type": "wal_entry", "ack": seq == entries,
			"data": map[string]any{"operation": "memory_add", "params": map[string]any{"pad": pad}, "sequence": seq}}))
	}
	note("sent all")
	select {}
}
