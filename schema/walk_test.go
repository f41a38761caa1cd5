package schema

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

func TestWalkAcceptsEveryEncoding(t *testing.T) {
	u16 := func(c byte, n int) []byte { return binary.BigEndian.AppendUint16([]byte{c}, uint16(n)) }
	u32 := func(c byte, n int) []byte { return binary.BigEndian.AppendUint32([]byte{c}, uint32(n)) }
	values := map[string][]byte{
		"posfixint":  {0x7f},
		"negfixint":  {0xe0},
		"nil":        {0xc0},
		"false":      {0xc2},
		"true":       {0xc3},
		"uint8":      {0xcc, 1},
		"uint16":     {0xcd, 1, 2},
		"uint32":     {0xce, 1, 2, 3, 4},
		"uint64":     {0xcf, 1, 2, 3, 4, 5, 6, 7, 8},
		"int8":       {0xd0, 0xff},
		"int16":      {0xd1, 0, 0},
		"int32":      {0xd2, 0, 0, 0, 0},
		"int64":      {0xd3, 0, 0, 0, 0, 0, 0, 0, 0},
		"float32":    {0xca, 0, 0, 0, 0},
		"float64":    {0xcb, 0, 0, 0, 0, 0, 0, 0, 0},
		"fixstr":     {0xa2, 'h', 'i'},
		"str8":       {0xd9, 2, 'h', 'i'},
		"str16":      append(u16(0xda, 2), 'h', 'i'),
		"str32":      append(u32(0xdb, 2), 'h', 'i'),
		"bin8":       {0xc4, 1, 0},
		"bin16":      append(u16(0xc5, 1), 0),
		"bin32":      append(u32(0xc6, 1), 0),
		"fixext1":    {0xd4, 1, 0},
		"fixext2":    {0xd5, 1, 0, 0},
		"fixext4":    {0xd6, 1, 0, 0, 0, 0},
		"fixext8":    {0xd7, 1, 0, 0, 0, 0, 0, 0, 0, 0},
		"fixext16":   append([]byte{0xd8, 1}, make([]byte, 16)...),
		"ext8":       {0xc7, 2, 5, 0, 0},
		"ext16":      append(u16(0xc8, 2), 5, 0, 0),
		"ext32":      append(u32(0xc9, 2), 5, 0, 0),
		"fixarray":   {0x92, 1, 2},
		"array16":    append(u16(0xdc, 2), 1, 2),
		"array32":    append(u32(0xdd, 2), 1, 2),
		"fixmap":     {0x81, 1, 2},
		"map16":      append(u16(0xde, 1), 1, 2),
		"map32":      append(u32(0xdf, 1), 1, 2),
		"empty map":  {0x80},
		"empty arr":  {0x90},
		"empty str":  {0xa0},
		"nested mix": {0x82, 0xa1, 'a', 0x91, 0x80, 0x01, 0x92, 0xc0, 0xc3},
	}
	for name, v := range values {
		if err := checkValue(v, MaxDepth); err != nil {
			t.Errorf("%s (% x): %v", name, v, err)
		}
		if end := skip(v, 0); end != len(v) {
			t.Errorf("%s: skip ends at %d of %d", name, end, len(v))
		}
	}
}

func TestWalkRejects(t *testing.T) {
	deep := func(n int) []byte { return append(bytes.Repeat([]byte{0x91}, n), 0xc0) }
	tests := []struct {
		name  string
		input []byte
		want  string
	}{
		{"empty", nil, "no bytes"},
		{"reserved code", []byte{0xc1}, "reserved"},
		{"array32 claiming 2^32-1", []byte{0xdd, 0xff, 0xff, 0xff, 0xff}, "declares 4294967295 elements"},
		{"map32 claiming 2^32-1", []byte{0xdf, 0xff, 0xff, 0xff, 0xff}, "declares 4294967295 elements"},
		{"bin32 claiming 2^32-1", []byte{0xc6, 0xff, 0xff, 0xff, 0xff}, "declares 4294967295 bytes"},
		{"str32 claiming 2^32-1", []byte{0xdb, 0xff, 0xff, 0xff, 0xff}, "declares 4294967295 bytes"},
		{"ext32 claiming 2^32-1", []byte{0xc9, 0xff, 0xff, 0xff, 0xff}, "declares 4294967296 bytes"},
		{"map needs two bytes per pair", []byte{0x82, 1, 2, 3}, "map declares 2 elements but only 3 bytes remain"},
		{"array element missing", []byte{0x92, 1}, "array declares 2 elements"},
		{"str16 header cut", []byte{0xda, 0}, "cut short"},
		{"uint64 cut", []byte{0xcf, 1, 2}, "declares 8 bytes"},
		{"fixext16 cut", []byte{0xd8, 1, 0}, "declares 17 bytes"},
		{"trailing bytes", []byte{0x80, 0x00}, "1 trailing bytes"},
		{"65 levels", deep(65), "nested deeper than 64"},
		{"65 levels, innermost empty", append(bytes.Repeat([]byte{0x91}, 64), 0x90), "nested deeper than 64"},
		{"4 MiB of nested arrays", deep(4 << 20), "nested deeper than 64"},
		{"value missing after key", []byte{0x81, 0xa1, 'a'}, "input ended"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := checkValue(tt.input, MaxDepth)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %q, want it to mention %q", err, tt.want)
			}
		})
	}
	if err := checkValue(deep(64), MaxDepth); err != nil {
		t.Errorf("64 levels rejected: %v", err)
	}
}

func TestWalkAllocatesNothing(t *testing.T) {
	v := bytes.Repeat([]byte{0x92, 0xa3, 'a', 'b', 'c', 0x81, 0x01, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0}, 1)
	payload := append([]byte{0x91}, v...)
	if n := testing.AllocsPerRun(100, func() {
		if err := checkValue(payload, MaxDepth); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("walk allocated %v times", n)
	}
}

func TestAppendPrimitives(t *testing.T) {
	// Each encoding is the smallest one, as a conforming decoder expects.
	tests := []struct {
		name string
		got  []byte
		want []byte
	}{
		{"uint 0", AppendUint(nil, 0), []byte{0x00}},
		{"uint 127", AppendUint(nil, 127), []byte{0x7f}},
		{"uint 128", AppendUint(nil, 128), []byte{0xcc, 0x80}},
		{"uint 256", AppendUint(nil, 256), []byte{0xcd, 1, 0}},
		{"uint 65536", AppendUint(nil, 65536), []byte{0xce, 0, 1, 0, 0}},
		{"uint 2^32", AppendUint(nil, 1<<32), []byte{0xcf, 0, 0, 0, 1, 0, 0, 0, 0}},
		{"int -1", AppendInt(nil, -1), []byte{0xff}},
		{"int -32", AppendInt(nil, -32), []byte{0xe0}},
		{"int -33", AppendInt(nil, -33), []byte{0xd0, 0xdf}},
		{"int -129", AppendInt(nil, -129), []byte{0xd1, 0xff, 0x7f}},
		{"int -32769", AppendInt(nil, -32769), []byte{0xd2, 0xff, 0xff, 0x7f, 0xff}},
		{"int -2^31-1", AppendInt(nil, -1<<31-1), []byte{0xd3, 0xff, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff}},
		{"str 31", AppendStr(nil, strings.Repeat("a", 31))[:1], []byte{0xbf}},
		{"str 32", AppendStr(nil, strings.Repeat("a", 32))[:2], []byte{0xd9, 32}},
		{"str 256", AppendStr(nil, strings.Repeat("a", 256))[:3], []byte{0xda, 1, 0}},
		{"str 65536", AppendStr(nil, strings.Repeat("a", 65536))[:5], []byte{0xdb, 0, 1, 0, 0}},
		{"bin 1", appendBin(nil, []byte{9}), []byte{0xc4, 1, 9}},
		{"bin 256", appendBin(nil, make([]byte, 256))[:3], []byte{0xc5, 1, 0}},
		{"bin 65536", appendBin(nil, make([]byte, 65536))[:5], []byte{0xc6, 0, 1, 0, 0}},
		{"map 15", AppendMapHeader(nil, 15), []byte{0x8f}},
		{"map 16", AppendMapHeader(nil, 16), []byte{0xde, 0, 16}},
		{"map 65536", AppendMapHeader(nil, 65536), []byte{0xdf, 0, 1, 0, 0}},
		{"array 15", AppendArrayHeader(nil, 15), []byte{0x9f}},
		{"array 16", AppendArrayHeader(nil, 16), []byte{0xdc, 0, 16}},
		{"array 65536", AppendArrayHeader(nil, 65536), []byte{0xdd, 0, 1, 0, 0}},
		{"float 1.5", appendFloat(nil, 1.5), []byte{0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0}},
	}
	for _, tt := range tests {
		if !bytes.Equal(tt.got, tt.want) {
			t.Errorf("%s: got % x, want % x", tt.name, tt.got, tt.want)
		}
	}
}
