package test

// The request agent: this test binary, re-executed with REQAGENT=1, as the
// agent of the durable-request tests. It answers process_request with
// {echo, attempt} and logs what it saw to REQAGENT_LOG (JSON lines), so a
// test can count deliveries:
//
//	REQAGENT_LOG=FILE             events: start, request {id, attempt, msg}, cancel {id}
//	REQAGENT_DELAY=D              answer each request after D (concurrently)
//	REQAGENT_HOLD=PREFIX          never answer a message starting with PREFIX
//	REQAGENT_ACCEPTS_CANCEL=1     heartbeats carry accepts: ["cancel_request"]
//	REQAGENT_POISON_EXIT=MSG      exit 1 at once on a request whose message is MSG
//	REQAGENT_POISON_EXIT_CODE=N   … with code N instead (0: a clean exit() in the handler)
//	REQAGENT_POISON_HANG=MSG      stop heartbeating and reading on it (hang)
//	REQAGENT_EXIT_FIRST=MSG       exit 1 on MSG's first delivery (attempt 1) only
//	REQAGENT_STAMP=FILE           timing (BenchmarkRedeliver10k): log one WAL entry
//	                              at a start without a restore (so the next start
//	                              gets one); after a restore, write to FILE (JSON)
//	                              when it arrived and when the first and the
//	                              REQAGENT_STAMP_N-th process_request arrived
//	REQAGENT_WAL_ONE=1            log one WAL entry (sequence 1, ack) at start

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agent-sidecar/supervisor/schema"
	"github.com/agent-sidecar/supervisor/wire"
)

const envReqAgent = "REQAGENT"

func runReqAgent() int {
	codec := schema.NewCodec(schema.Options{})
	r := wire.NewReader(os.Stdin, 0)
	w := wire.NewWriter(os.Stdout, 0)
	var wmu sync.Mutex
	send := func(m schema.Message) {
		b, err := codec.Encode(m)
		if err != nil {
			return
		}
		wmu.Lock()
		defer wmu.Unlock()
		_ = w.WriteFrame(b)
	}
	var lmu sync.Mutex
	logf, _ := os.OpenFile(os.Getenv("REQAGENT_LOG"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	emit := func(ev map[string]any) {
		if logf == nil {
			return
		}
		b, _ := json.Marshal(ev)
		lmu.Lock()
		defer lmu.Unlock()
		_, _ = logf.Write(append(b, '\n'))
	}
	emit(map[string]any{"ev": "start", "pid": os.Getpid()})
	var accepts []string
	if os.Getenv("REQAGENT_ACCEPTS_CANCEL") != "" {
		accepts = []string{schema.TypeCancelRequest}
	}
	hung := make(chan struct{})
	var hangOnce sync.Once
	go func() {
		t := time.NewTicker(200 * time.Millisecond)
		for {
			select {
			case <-hung:
				return
			default:
			}
			send(&schema.Heartbeat{Accepts: accepts})
			<-t.C
		}
	}()
	if os.Getenv("REQAGENT_WAL_ONE") != "" {
		params, _ := schema.MarshalMap(map[string]any{"n": 1})
		send(&schema.WALEntry{Entry: schema.WALRecord{Operation: "state_update", Sequence: 1, Params: params}, Ack: true})
	}
	delay, _ := time.ParseDuration(os.Getenv("REQAGENT_DELAY"))
	hold := os.Getenv("REQAGENT_HOLD")
	var cmu sync.Mutex
	cancelled := map[string]chan struct{}{}
	stamp := os.Getenv("REQAGENT_STAMP")
	stampN, _ := strconv.Atoi(os.Getenv("REQAGENT_STAMP_N"))
	var restoredAt, firstAt time.Time
	arrived := 0
	if stamp != "" && os.Getenv("SUPERVISOR_RESTORE_PENDING") != "1" {
		params, _ := schema.MarshalMap(map[string]any{"content": "state, so that the next start is sent a restore"})
		send(&schema.WALEntry{Entry: schema.WALRecord{Operation: "memory_add", Sequence: 1, Params: params}})
	}
	for {
		p, err := r.ReadFrame()
		if err != nil {
			return 0
		}
		m, err := codec.Decode(schema.ToAgent, p)
		if err != nil {
			continue
		}
		if stamp != "" && !restoredAt.IsZero() {
			if _, ok := m.(*schema.ProcessRequest); ok {
				now := time.Now()
				if arrived++; arrived == 1 {
					firstAt = now
				}
				if arrived == stampN {
					b, _ := json.Marshal(map[string]any{"restore_ns": restoredAt.UnixNano(), "first_ns": firstAt.UnixNano(), "last_ns": now.UnixNano(), "n": arrived})
					_ = os.WriteFile(stamp, b, 0o600)
				}
			}
		}
		switch m := m.(type) {
		case *schema.Restore:
			if stamp != "" {
				restoredAt, arrived = time.Now(), 0
			}
		case *schema.Shutdown:
			return 0
		case *schema.CancelRequest:
			emit(map[string]any{"ev": "cancel", "id": m.RequestID})
			cmu.Lock()
			if c := cancelled[m.RequestID]; c != nil {
				close(c)
				delete(cancelled, m.RequestID)
			}
			cmu.Unlock()
		case *schema.ProcessRequest:
			msg := m.Data.Message
			emit(map[string]any{"ev": "request", "id": m.RequestID, "attempt": m.Attempt, "msg": msg})
			if v := os.Getenv("REQAGENT_POISON_EXIT"); v != "" && msg == v {
				code, err := strconv.Atoi(os.Getenv("REQAGENT_POISON_EXIT_CODE"))
				if err != nil {
					code = 1
				}
				os.Exit(code)
			}
			if v := os.Getenv("REQAGENT_EXIT_FIRST"); v != "" && msg == v && m.Attempt <= 1 {
				os.Exit(1)
			}
			if v := os.Getenv("REQAGENT_POISON_HANG"); v != "" && msg == v {
				hangOnce.Do(func() { close(hung) })
				select {} // neither heartbeats nor reads: hung
			}
			if hold != "" && strings.HasPrefix(msg, hold) {
				c := make(chan struct{})
				cmu.Lock()
				cancelled[m.RequestID] = c
				cmu.Unlock()
				continue
			}
			id, attempt := m.RequestID, m.Attempt
			answer := func() {
				data, _ := schema.MarshalMap(map[string]any{"echo": msg, "attempt": attempt})
				send(&schema.RequestResult{RequestID: id, Data: data})
			}
			if delay <= 0 {
				answer()
				continue
			}
			c := make(chan struct{})
			cmu.Lock()
			cancelled[id] = c
			cmu.Unlock()
			go func() {
				select {
				case <-time.After(delay):
					answer()
				case <-c:
				}
				cmu.Lock()
				delete(cancelled, id)
				cmu.Unlock()
			}()
		}
	}
}
