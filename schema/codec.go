package schema

import (
	"bytes"
	"slices"
	"sort"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// Codec decodes, validates and encodes messages under one set of [Options].
// It is safe for concurrent use; zstd decoders are pooled.
type Codec struct {
	limits  Limits
	ops     map[string]string // allowed WAL operation → its canonical string
	opNames string            // for error messages: "memory_add, tool_register, ..."
	maxBody int               // largest decompressed body any type may have
	maxFrom int               // largest frame from the agent
	maxTo   int               // largest frame to the agent
	stream  bool              // Options.StreamCheckpoints

	zstds sync.Pool // *zstd.Decoder
}

// NewCodec returns a Codec for opts. Zero limits take their defaults; empty
// and duplicate extra WAL operations are ignored.
func NewCodec(opts Options) *Codec {
	c := &Codec{limits: opts.Limits.withDefaults(), stream: opts.StreamCheckpoints}
	c.ops = map[string]string{OpMemoryAdd: OpMemoryAdd, OpToolRegister: OpToolRegister, OpStateUpdate: OpStateUpdate,
		OpRequestStep: OpRequestStep, OpRequestDone: OpRequestDone}
	names := []string{OpMemoryAdd, OpToolRegister, OpStateUpdate, OpRequestStep, OpRequestDone}
	extras := slices.Clone(opts.ExtraWALOperations)
	sort.Strings(extras)
	for _, op := range extras {
		if _, ok := c.ops[op]; op == "" || ok {
			continue
		}
		c.ops[op] = op
		names = append(names, op)
	}
	var b bytes.Buffer
	for i, n := range names {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(n)
	}
	c.opNames = b.String()
	for _, t := range []string{TypeCheckpoint, TypeRestore, TypeWALEntry, TypeMetrics, TypeWALBatch} {
		c.maxBody = max(c.maxBody, c.limits.body(t))
	}
	for _, t := range allTypes {
		d := typeDirections[t]
		if d&FromAgent != 0 {
			c.maxFrom = max(c.maxFrom, c.limits.frame(t))
		}
		if d&ToAgent != 0 {
			c.maxTo = max(c.maxTo, c.limits.frame(t))
		}
	}
	return c
}

var defaultCodec = NewCodec(Options{})

// Encode encodes m with the default codec (default limits, built-in WAL
// operations only).
func Encode(m Message) ([]byte, error) { return defaultCodec.Encode(m) }

// Decode decodes payload with the default codec (default limits, built-in
// WAL operations only).
func Decode(dir Direction, payload []byte) (Message, error) { return defaultCodec.Decode(dir, payload) }

// Limits returns the codec's limits, defaults filled in.
func (c *Codec) Limits() Limits { return c.limits }

// WALOperations returns the accepted WAL operations: the built-in ones (the
// seed's three, then request_step and request_done), then the extras in
// sorted order.
func (c *Codec) WALOperations() []string {
	out := make([]string, 0, len(c.ops))
	builtin := []string{OpMemoryAdd, OpToolRegister, OpStateUpdate, OpRequestStep, OpRequestDone}
	out = append(out, builtin...)
	var extras []string
	for op := range c.ops {
		if !slices.Contains(builtin, op) {
			extras = append(extras, op)
		}
	}
	sort.Strings(extras)
	return append(out, extras...)
}

// MaxFrameSize returns the largest frame any message type may have under the
// codec's limits, in either direction: the value to give wire.NewReader and
// wire.NewWriter. With default limits it is 128 MiB (a restore).
func (c *Codec) MaxFrameSize() int {
	return max(c.MaxFrameSizeFor(FromAgent), c.MaxFrameSizeFor(ToAgent))
}

// MaxFrameSizeFor returns the largest frame a message travelling in
// direction dir may have: for FromAgent by default 100 MiB plus
// [EnvelopeAllowance] (a checkpoint).
func (c *Codec) MaxFrameSizeFor(dir Direction) int {
	n := 0
	if dir&FromAgent != 0 {
		n = c.maxFrom
	}
	if dir&ToAgent != 0 {
		n = max(n, c.maxTo)
	}
	return n
}

// FrameLimit returns the largest frame accepted for message type typ (for an
// unknown type, the default limit).
func (c *Codec) FrameLimit(typ string) int { return c.limits.frame(typ) }

// zstdDecoder returns a pooled zstd decoder: synchronous (no goroutines),
// its memory and window capped at the largest body the codec accepts.
func (c *Codec) zstdDecoder() (*zstd.Decoder, error) {
	if d, ok := c.zstds.Get().(*zstd.Decoder); ok {
		return d, nil
	}
	return zstd.NewReader(nil,
		zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxMemory(uint64(c.maxBody)),
		zstd.WithDecoderMaxWindow(uint64(min(max(c.maxBody, zstd.MinWindowSize), maxInMemoryWindow))),
	)
}

func (c *Codec) putZstdDecoder(d *zstd.Decoder) {
	// Drop the reference to the input so the pool does not keep it alive.
	_ = d.Reset(nil)
	c.zstds.Put(d)
}
