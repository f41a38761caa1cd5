package testagent

import (
	"encoding/binary"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/agent-sidecar/supervisor/schema"
)

// maxChunk bounds the self-driven entries made in one turn of the run loop,
// so messages from the supervisor are not kept waiting behind a flood.
const maxChunk = 1000

func (a *refAgent) batchSize() int {
	return max(1, a.cfg.WALBatch)
}

// workInterval is how often the self-driven work wakes up: about once per
// batch, between 5ms and 100ms.
func (a *refAgent) workInterval() time.Duration {
	d := time.Duration(float64(time.Second) * float64(a.batchSize()) / a.cfg.WALRate)
	return min(max(d, 5*time.Millisecond), 100*time.Millisecond)
}

// selfDrive makes the self-driven memory_add entries that are due at
// --wal-rate, in batches of --wal-batch. behind reports that more are due
// right away.
func (a *refAgent) selfDrive(now time.Time) (behind bool, err error) {
	if !a.ready || a.selfDone || now.Before(a.pausedUntil) {
		a.lastCredit = now
		return false, nil
	}
	k := a.batchSize()
	a.credit += a.cfg.WALRate * now.Sub(a.lastCredit).Seconds()
	a.lastCredit = now
	a.credit = math.Min(a.credit, math.Max(a.cfg.WALRate, float64(k))) // at most a second's worth
	produced := 0
	for produced < maxChunk {
		size := k
		if a.cfg.WALMax > 0 {
			size = min(size, a.cfg.WALMax-a.selfCount)
		}
		if size <= 0 {
			a.selfDone = true
			a.emit("wal_max_reached", "entries", a.selfCount, "last_seq", a.st.LastSeq)
			return false, nil
		}
		if a.credit < float64(size) {
			return false, nil
		}
		changes := make([]change, size)
		for i := range changes {
			changes[i] = a.selfChange(a.st.LastSeq+uint64(i)+1, now)
		}
		if err := a.commit(changes, k > 1); err != nil {
			return false, err
		}
		a.credit -= float64(size)
		a.selfCount += size
		produced += size
	}
	return a.credit >= 1, nil
}

func (a *refAgent) selfChange(seq uint64, now time.Time) change {
	return change{op: schema.OpMemoryAdd, raw: selfParams(nil, seq, now.Unix(), a.padding)}
}

// selfParams appends the params of a self-driven memory_add to b:
//
//	{content: "self-driven note SEQ[ PADDING]", created: NOW, importance: 0.5, metadata: {source: "self"}}
//
// encoded by hand, byte for byte what schema.MarshalMap makes of the same
// map (keys sorted, compact integers), without building the map: this is
// the hot path of a WAL flood.
func selfParams(b []byte, seq uint64, created int64, padding string) []byte {
	var num [20]byte
	digits := strconv.AppendUint(num[:0], seq, 10)
	n := len(selfPrefix) + len(digits)
	if padding != "" {
		n += 1 + len(padding)
	}
	b = append(b, 0x84)
	b = schema.AppendStr(b, "content")
	b = schema.AppendStrHeader(b, n)
	b = append(b, selfPrefix...)
	b = append(b, digits...)
	if padding != "" {
		b = append(b, ' ')
		b = append(b, padding...)
	}
	b = schema.AppendStr(b, "created")
	b = schema.AppendInt(b, created)
	b = schema.AppendStr(b, "importance")
	b = binary.BigEndian.AppendUint64(append(b, 0xcb), math.Float64bits(0.5))
	b = schema.AppendStr(b, "metadata")
	b = append(b, 0x81)
	b = schema.AppendStr(b, "source")
	return schema.AppendStr(b, "self")
}

const selfPrefix = "self-driven note "

// paddingFor returns the filler that makes a self-driven WAL entry (the
// {operation, params, sequence} map) about size bytes.
func (a *refAgent) paddingFor(size int) string {
	if size <= 0 {
		return ""
	}
	const probeSeq = 1_000_000
	params := selfParams(nil, probeSeq, time.Now().Unix(), " ")
	entry, err := schema.MarshalMap(map[string]any{
		"operation": schema.OpMemoryAdd, "params": msgpack.RawMessage(params), "sequence": uint64(probeSeq),
	})
	if err != nil {
		return ""
	}
	// Past 31 bytes a string's header grows from 1 to 2 bytes, past 255 to 3.
	n := size - len(entry) - 2
	if n <= 0 {
		return ""
	}
	return strings.Repeat("x", n)
}
