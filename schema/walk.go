package schema

import (
	"encoding/binary"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// The bounds walk.
//
// msgpack/v5 pre-allocates from declared lengths (a 5-byte array32 header
// claiming 2^32-1 elements is a fatal out-of-memory, which recover cannot
// catch) and recurses without a depth limit. So no byte reaches it before
// walk has checked the whole value: every declared length fits in the bytes
// that remain (each array element needs at least one byte, each map pair
// two), nesting is at most MaxDepth, and the codes are all defined. walk
// allocates nothing on success.

// walkError locates a structural fault.
type walkError struct {
	off    int
	reason string
}

func (e *walkError) Error() string { return fmt.Sprintf("byte %d: %s", e.off, e.reason) }

// checkValue verifies that b holds exactly one well-formed MessagePack value
// nested at most maxDepth deep.
func checkValue(b []byte, maxDepth int) *walkError {
	if len(b) == 0 {
		return &walkError{0, "no bytes"}
	}
	end, err := walk(b, 0, 1, maxDepth)
	if err != nil {
		return err
	}
	if end != len(b) {
		return &walkError{end, fmt.Sprintf("%d trailing bytes after the value", len(b)-end)}
	}
	return nil
}

// head is the header of one value: where its content starts and how much
// content it declares.
type head struct {
	pos int    // offset of the content, after the code and any length header
	n   uint64 // content bytes; elements of an array; pairs of a map
	per uint64 // least bytes per declared unit: 0 for bytes, 1 array, 2 map
}

// readHead reads the header of the value at b[off] and checks it against b:
// the header is complete, a byte count fits in the bytes that remain, and
// an element count could (each array element needs at least one byte, each
// map pair two). It is the only code that reads a declared length.
func readHead(b []byte, off int) (head, *walkError) {
	if off >= len(b) {
		return head{}, &walkError{off, "value expected, input ended"}
	}
	c := b[off]
	var (
		hdr int // length-header bytes after the code
		h   head
	)
	switch {
	case c <= 0x7f || c >= 0xe0: // positive and negative fixint
		return head{pos: off + 1}, nil
	case c <= 0x8f: // fixmap
		h.n, h.per = uint64(c&0x0f), 2
	case c <= 0x9f: // fixarray
		h.n, h.per = uint64(c&0x0f), 1
	case c <= 0xbf: // fixstr
		h.n = uint64(c & 0x1f)
	default:
		switch c {
		case 0xc0, 0xc2, 0xc3: // nil, false, true
			return head{pos: off + 1}, nil
		case 0xc1:
			return head{}, &walkError{off, "reserved code 0xc1"}
		case 0xcc, 0xd0: // uint8, int8
			h.n = 1
		case 0xcd, 0xd1: // uint16, int16
			h.n = 2
		case 0xca, 0xce, 0xd2: // float32, uint32, int32
			h.n = 4
		case 0xcb, 0xcf, 0xd3: // float64, uint64, int64
			h.n = 8
		case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16: type byte + data
			h.n = 1 + 1<<(c-0xd4)
		case 0xc4, 0xd9, 0xc7: // bin8, str8, ext8 (len, type)
			hdr = 1
		case 0xc5, 0xda, 0xc8: // bin16, str16, ext16
			hdr = 2
		case 0xc6, 0xdb, 0xc9: // bin32, str32, ext32
			hdr = 4
		case 0xdc: // array16
			hdr, h.per = 2, 1
		case 0xdd: // array32
			hdr, h.per = 4, 1
		case 0xde: // map16
			hdr, h.per = 2, 2
		case 0xdf: // map32
			hdr, h.per = 4, 2
		}
	}
	h.pos = off + 1
	if hdr > 0 {
		if len(b)-h.pos < hdr {
			return head{}, &walkError{off, fmt.Sprintf("length header of code 0x%02x cut short", c)}
		}
		switch hdr {
		case 1:
			h.n = uint64(b[h.pos])
		case 2:
			h.n = uint64(binary.BigEndian.Uint16(b[h.pos:]))
		case 4:
			h.n = uint64(binary.BigEndian.Uint32(b[h.pos:]))
		}
		h.pos += hdr
		if c >= 0xc7 && c <= 0xc9 { // ext: the type byte follows the length
			h.n++
		}
	}
	rest := uint64(len(b) - h.pos)
	if h.per == 0 {
		if h.n > rest {
			return head{}, &walkError{off, fmt.Sprintf("code 0x%02x declares %d bytes but only %d remain", c, h.n, rest)}
		}
		return h, nil
	}
	if h.n*h.per > rest { // n < 2^32, so no overflow
		kind := "array"
		if h.per == 2 {
			kind = "map"
		}
		return head{}, &walkError{off, fmt.Sprintf("%s declares %d elements but only %d bytes remain", kind, h.n, rest)}
	}
	return h, nil
}

// walk checks the value starting at b[off], at nesting depth depth, and
// returns the offset just past it.
func walk(b []byte, off, depth, maxDepth int) (int, *walkError) {
	h, err := readHead(b, off)
	if err != nil {
		return 0, err
	}
	if h.per == 0 {
		return h.pos + int(h.n), nil
	}
	if depth > maxDepth {
		return 0, &walkError{off, fmt.Sprintf("maps and arrays nested deeper than %d levels", maxDepth)}
	}
	pos := h.pos
	for range int(h.n) * int(h.per) {
		if pos, err = walk(b, pos, depth+1, maxDepth); err != nil {
			return 0, err
		}
	}
	return pos, nil
}

// content returns the bytes of the str or bin value v, which is exactly one
// walked value: they are all of v after its header.
func content(v []byte) []byte {
	switch c := v[0]; {
	case c >= 0xa0 && c <= 0xbf:
		return v[1:]
	case c == 0xd9 || c == 0xc4:
		return v[2:]
	case c == 0xda || c == 0xc5:
		return v[3:]
	}
	return v[5:] // str32, bin32
}

// skip returns the offset just past the value at b[off], which walk has
// already accepted.
func skip(b []byte, off int) int {
	end, err := walk(b, off, 1, 1<<30)
	if err != nil {
		// Only reachable if a caller skips bytes walk never checked.
		panic("schema: skip over unchecked bytes: " + err.Error())
	}
	return end
}

func isMapCode(c byte) bool   { return (c >= 0x80 && c <= 0x8f) || c == 0xde || c == 0xdf }
func isArrayCode(c byte) bool { return (c >= 0x90 && c <= 0x9f) || c == 0xdc || c == 0xdd }
func isStrCode(c byte) bool   { return (c >= 0xa0 && c <= 0xbf) || c == 0xd9 || c == 0xda || c == 0xdb }
func isBinCode(c byte) bool   { return c == 0xc4 || c == 0xc5 || c == 0xc6 }
func isIntCode(c byte) bool {
	return c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xcf) || (c >= 0xd0 && c <= 0xd3)
}
func isFloatCode(c byte) bool { return c == 0xca || c == 0xcb }

// kindOf names a value's MessagePack type for error messages.
func kindOf(c byte) string {
	switch {
	case isMapCode(c):
		return "map"
	case isArrayCode(c):
		return "array"
	case isStrCode(c):
		return "string"
	case isBinCode(c):
		return "binary"
	case isIntCode(c):
		return "integer"
	case isFloatCode(c):
		return "float"
	case c == 0xc0:
		return "nil"
	case c == 0xc2 || c == 0xc3:
		return "boolean"
	}
	return "extension"
}

// Unmarshal decodes the MessagePack value b into v, as msgpack.Unmarshal
// does, once the bounds walk has accepted b: exactly one well-formed value,
// every declared length within b, maps and arrays nested at most MaxDepth.
// It is the way in for bytes read back from disk (a WAL entry, a checkpoint)
// that are not a message.
func Unmarshal(b []byte, v any) error {
	if err := checkValue(b, MaxDepth); err != nil {
		return fmt.Errorf("schema: not one valid MessagePack value: %w", err)
	}
	if err := msgpack.Unmarshal(b, v); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	return nil
}
