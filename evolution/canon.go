package evolution

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"slices"
	"strconv"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// maxCanonDepth bounds the nesting Canonical follows (the protocol's own
// limit is lower; this is the function's own guard).
const maxCanonDepth = 64

// Answer is one agent's answer to a request as the judge compares it: the
// digest of its canonical form, and the first bytes of that form, kept as
// evidence when two answers differ.
type Answer struct {
	Failed bool
	Digest [16]byte
	Text   string // canonical form, at most maxAnswerText bytes (truncated)
}

// maxAnswerText bounds the canonical text an Answer keeps.
const maxAnswerText = 160

// AnswerOf is the Answer for a request_result: data (MessagePack), or an
// error code when failed. Data that does not decode is compared as its
// bytes, never a panic.
func AnswerOf(data []byte, failed bool, errCode string) Answer {
	var canon []byte
	if failed {
		canon = append([]byte("error "), strconv.Quote(errCode)...)
	} else {
		c, err := Canonical(data)
		if err != nil {
			c = append([]byte("undecodable "), hex.EncodeToString(data[:min(len(data), 64)])...)
			c = strconv.AppendInt(append(c, " len "...), int64(len(data)), 10)
		}
		canon = c
	}
	sum := sha256.Sum256(canon)
	a := Answer{Failed: failed}
	copy(a.Digest[:], sum[:16])
	a.Text = string(canon[:min(len(canon), maxAnswerText)])
	if len(canon) > maxAnswerText {
		a.Text += "…"
	}
	return a
}

// Canonical renders a MessagePack value as canonical text, JSON-like, in
// which two values the agent would call equal render alike: map keys are
// sorted (by their canonical form), integers of any width and sign encoding
// are their decimal value, and float32 and float64 are the float64 value
// (so 0.5 as float32 equals 0.5 as float64). Integers and floats stay
// distinct (3 and 3.0 differ), as do strings and bin.
func Canonical(data []byte) ([]byte, error) {
	d := msgpack.NewDecoder(bytes.NewReader(data))
	var out []byte
	out, err := canonValue(d, out, 0)
	if err != nil {
		return nil, err
	}
	return out, nil
}

var errTooDeep = errors.New("evolution: answer nested too deep to compare")

func canonValue(d *msgpack.Decoder, out []byte, depth int) ([]byte, error) {
	if depth > maxCanonDepth {
		return nil, errTooDeep
	}
	c, err := d.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.DecodeMapLen()
		if err != nil {
			return nil, err
		}
		type kv struct{ k, v []byte }
		entries := make([]kv, 0, min(n, 1024))
		for range n {
			k, err := canonValue(d, nil, depth+1)
			if err != nil {
				return nil, err
			}
			v, err := canonValue(d, nil, depth+1)
			if err != nil {
				return nil, err
			}
			entries = append(entries, kv{k, v})
		}
		slices.SortFunc(entries, func(a, b kv) int { return bytes.Compare(a.k, b.k) })
		out = append(out, '{')
		for i, e := range entries {
			if i > 0 {
				out = append(out, ',')
			}
			out = append(append(append(out, e.k...), ':'), e.v...)
		}
		return append(out, '}'), nil
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.DecodeArrayLen()
		if err != nil {
			return nil, err
		}
		out = append(out, '[')
		for i := range n {
			if i > 0 {
				out = append(out, ',')
			}
			if out, err = canonValue(d, out, depth+1); err != nil {
				return nil, err
			}
		}
		return append(out, ']'), nil
	case c == msgpcode.Float || c == msgpcode.Double:
		f, err := d.DecodeFloat64()
		if err != nil {
			return nil, err
		}
		return appendFloat(out, f), nil
	case msgpcode.IsExt(c):
		id, n, err := d.DecodeExtHeader()
		if err != nil {
			return nil, err
		}
		b := make([]byte, n)
		if err := d.ReadFull(b); err != nil {
			return nil, err
		}
		out = strconv.AppendInt(append(out, "ext("...), int64(id), 10)
		return append(append(out, "):"...), hex.EncodeToString(b)...), nil
	case msgpcode.IsBin(c):
		b, err := d.DecodeBytes()
		if err != nil {
			return nil, err
		}
		return append(append(out, "bin:"...), hex.EncodeToString(b)...), nil
	}
	v, err := d.DecodeInterfaceLoose() // nil, bool, integers (int64/uint64), str
	if err != nil {
		return nil, err
	}
	switch x := v.(type) {
	case nil:
		return append(out, "null"...), nil
	case bool:
		return strconv.AppendBool(out, x), nil
	case int64:
		return strconv.AppendInt(out, x, 10), nil
	case uint64:
		return strconv.AppendUint(out, x, 10), nil
	case string:
		return strconv.AppendQuote(out, x), nil
	case float64: // not reached (floats are handled above); kept for safety
		return appendFloat(out, x), nil
	}
	return nil, errors.New("evolution: unexpected MessagePack value in an answer")
}

// appendFloat writes a float so that it never reads as an integer.
func appendFloat(out []byte, f float64) []byte {
	switch {
	case math.IsNaN(f):
		return append(out, "NaN"...)
	case math.IsInf(f, 1):
		return append(out, "+Inf"...)
	case math.IsInf(f, -1):
		return append(out, "-Inf"...)
	}
	s := strconv.AppendFloat(nil, f, 'g', -1, 64)
	out = append(out, s...)
	if !bytes.ContainsAny(s, ".eE") {
		out = append(out, ".0"...)
	}
	return out
}
