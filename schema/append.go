package schema

import (
	"encoding/binary"
	"math"
)

// The strict encoder writes MessagePack by appending to a byte slice, so it
// can splice stored raw bytes (snapshots, WAL entries) without re-encoding
// them. These appenders always choose the most compact encoding; they are
// exported for agents that build frames by hand on a hot path (the reference
// agent's WAL flood), so that every encoder in the project emits the same
// bytes for the same value.

// AppendMapHeader appends the header of a map with n pairs.
func AppendMapHeader(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x80|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xde), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdf), uint32(n))
}

// AppendArrayHeader appends the header of an array of n elements.
func AppendArrayHeader(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
}

// AppendStr appends s as a MessagePack str in its most compact form.
func AppendStr(b []byte, s string) []byte {
	return append(AppendStrHeader(b, len(s)), s...)
}

// AppendStrHeader appends the header of an n-byte str (fixstr, str8, str16
// or str32), for callers that write the bytes themselves.
func AppendStrHeader(b []byte, n int) []byte {
	switch {
	case n < 32:
		return append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		return append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	}
	return binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
}

// appendBin appends p as a MessagePack bin.
func appendBin(b, p []byte) []byte {
	switch n := len(p); {
	case n <= math.MaxUint8:
		b = append(b, 0xc4, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xc5), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xc6), uint32(n))
	}
	return append(b, p...)
}

// AppendUint appends u in its most compact form (positive fixint, uint8..64).
func AppendUint(b []byte, u uint64) []byte {
	switch {
	case u <= 0x7f:
		return append(b, byte(u))
	case u <= math.MaxUint8:
		return append(b, 0xcc, byte(u))
	case u <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(u))
	case u <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(b, 0xce), uint32(u))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), u)
}

// AppendInt appends i in its most compact form, as msgpack/v5's encoder
// does with UseCompactInts.
func AppendInt(b []byte, i int64) []byte {
	switch {
	case i >= 0:
		return AppendUint(b, uint64(i))
	case i >= -32:
		return append(b, byte(i))
	case i >= math.MinInt8:
		return append(b, 0xd0, byte(i))
	case i >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(b, 0xd1), uint16(i))
	case i >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(b, 0xd2), uint32(i))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xd3), uint64(i))
}
