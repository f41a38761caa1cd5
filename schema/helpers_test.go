package schema_test

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/vmihailenco/msgpack/v5"
)

// Payloads in these tests are built independently of the package's own
// encoder: values go through msgpack/v5's Marshal (which keeps Go's integer
// widths: int8 → int8, uint64 → uint64, float32 → float32), and maps are
// assembled in the order given so tests control duplicates and key types.

// raw is MessagePack spliced as is.
type raw []byte

// kv is one map pair; k is usually a string.
type kv struct {
	k any
	v any
}

// enc encodes one value: raw as is, anything else with msgpack.Marshal.
func enc(v any) []byte {
	if r, ok := v.(raw); ok {
		return r
	}
	b, err := msgpack.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// obj builds a map with its pairs in order.
func obj(pairs ...kv) raw {
	var b []byte
	n := len(pairs)
	switch {
	case n < 16:
		b = append(b, 0x80|byte(n))
	default:
		b = binary.BigEndian.AppendUint16(append(b, 0xde), uint16(n))
	}
	for _, p := range pairs {
		b = append(b, enc(p.k)...)
		b = append(b, enc(p.v)...)
	}
	return b
}

// arr builds an array.
func arr(vals ...any) raw {
	var b []byte
	n := len(vals)
	if n < 16 {
		b = append(b, 0x90|byte(n))
	} else {
		b = binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	}
	for _, v := range vals {
		b = append(b, enc(v)...)
	}
	return b
}

// str16 and str32 encode s with a wider header than needed.
func str16(s string) raw {
	return append(binary.BigEndian.AppendUint16([]byte{0xda}, uint16(len(s))), s...)
}

func str32(s string) raw {
	return append(binary.BigEndian.AppendUint32([]byte{0xdb}, uint32(len(s))), s...)
}

// bin encodes b as MessagePack bin.
func bin(b []byte) raw { return enc(b) }

// msg builds a message map: type and timestamp first, then the rest.
func msg(typ string, rest ...kv) raw {
	return obj(append([]kv{{"type", typ}, {"timestamp", int64(1705392000)}}, rest...)...)
}

func walRec(op string, seq any, params any) raw {
	return obj(kv{"operation", op}, kv{"params", params}, kv{"sequence", seq})
}

func zstdBytes(t testing.TB, b []byte) []byte {
	t.Helper()
	e, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	return e.EncodeAll(b, nil)
}

// zstdStream compresses b as a stream, so the frame does not declare its
// content size.
func zstdStream(t testing.TB, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	w, err := zstd.NewWriter(&out, zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}
