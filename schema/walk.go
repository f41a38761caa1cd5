package schema

import (
	"encoding/binary"
	"fmt"
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

// walk checks the value starting at b[off], at nesting depth depth, and
// returns the offset just past it.
func walk(b []byte, off, depth, maxDepth int) (int, *walkError) {
	if off >= len(b) {
		return 0, &walkError{off, "value expected, input ended"}
	}
	c := b[off]
	var (
		hdr     int    // header bytes after the code
		n       uint64 // payload bytes, or elements for containers
		elemMin uint64 // 0: bytes; 1: array; 2: map
	)
	switch {
	case c <= 0x7f || c >= 0xe0: // positive and negative fixint
		return off + 1, nil
	case c <= 0x8f: // fixmap
		n, elemMin = uint64(c&0x0f), 2
	case c <= 0x9f: // fixarray
		n, elemMin = uint64(c&0x0f), 1
	case c <= 0xbf: // fixstr
		n = uint64(c & 0x1f)
	default:
		switch c {
		case 0xc0, 0xc2, 0xc3: // nil, false, true
			return off + 1, nil
		case 0xc1:
			return 0, &walkError{off, "reserved code 0xc1"}
		case 0xcc, 0xd0: // uint8, int8
			n = 1
		case 0xcd, 0xd1: // uint16, int16
			n = 2
		case 0xca, 0xce, 0xd2: // float32, uint32, int32
			n = 4
		case 0xcb, 0xcf, 0xd3: // float64, uint64, int64
			n = 8
		case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16: type byte + data
			n = 1 + 1<<(c-0xd4)
		case 0xc4, 0xd9: // bin8, str8
			hdr = 1
		case 0xc5, 0xda: // bin16, str16
			hdr = 2
		case 0xc6, 0xdb: // bin32, str32
			hdr = 4
		case 0xc7: // ext8: len, type
			hdr = 1
		case 0xc8: // ext16
			hdr = 2
		case 0xc9: // ext32
			hdr = 4
		case 0xdc: // array16
			hdr, elemMin = 2, 1
		case 0xdd: // array32
			hdr, elemMin = 4, 1
		case 0xde: // map16
			hdr, elemMin = 2, 2
		case 0xdf: // map32
			hdr, elemMin = 4, 2
		}
	}
	pos := off + 1
	if hdr > 0 {
		if len(b)-pos < hdr {
			return 0, &walkError{off, fmt.Sprintf("length header of code 0x%02x cut short", c)}
		}
		switch hdr {
		case 1:
			n = uint64(b[pos])
		case 2:
			n = uint64(binary.BigEndian.Uint16(b[pos:]))
		case 4:
			n = uint64(binary.BigEndian.Uint32(b[pos:]))
		}
		pos += hdr
		if c >= 0xc7 && c <= 0xc9 { // ext: the type byte follows the length
			n++
		}
	}
	rest := uint64(len(b) - pos)
	if elemMin == 0 {
		if n > rest {
			return 0, &walkError{off, fmt.Sprintf("code 0x%02x declares %d bytes but only %d remain", c, n, rest)}
		}
		return pos + int(n), nil
	}
	if n*elemMin > rest { // n < 2^32, so no overflow
		kind := "array"
		if elemMin == 2 {
			kind = "map"
		}
		return 0, &walkError{off, fmt.Sprintf("%s declares %d elements but only %d bytes remain", kind, n, rest)}
	}
	if depth > maxDepth {
		return 0, &walkError{off, fmt.Sprintf("maps and arrays nested deeper than %d levels", maxDepth)}
	}
	count := int(n) * int(elemMin)
	var err *walkError
	for range count {
		if pos, err = walk(b, pos, depth+1, maxDepth); err != nil {
			return 0, err
		}
	}
	return pos, nil
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
