// Package schema defines the 16 messages exchanged between the supervisor
// and its agent, and decodes, validates and encodes them.
//
// # Decoding
//
// [Codec.Decode] takes one frame's payload and the direction it travelled
// ([FromAgent] or [ToAgent]) and, in this order:
//
//  1. walks the bytes once, without allocating, keeping the span of each
//     known key of the message map: the payload must be exactly one
//     well-formed MessagePack value, every declared length must fit in the
//     bytes that remain (an array element needs at least 1 byte, a map pair
//     2), maps and arrays nest at most [MaxDepth] levels, and nothing may
//     follow the value. The fields are then read from those checked spans
//     by the package's own readers, the mirror of its appending encoder;
//     msgpack/v5, which allocates from declared lengths (a 5-byte payload
//     claiming a 4-GiB array), never sees a payload. [Unmarshal] puts the
//     same walk in front of msgpack/v5 for other bytes (a WAL entry read
//     back from disk);
//  2. requires a map with string keys, a string "type" naming one of the
//     16 types (the seed's 13 and the extensions wal_ack,
//     request_result and cancel_request), valid in that direction;
//  3. checks the type's size limit ([Limits]);
//  4. decodes "timestamp" (required, an integer of any width — a float or a
//     string is invalid), "version" (optional integer, 1 when absent) and
//     "metadata" (optional map);
//  5. inflates a v2 compressed body ("compressed": true, "compression":
//     "zstd"; the body, "data" or a restore's "snapshot", is zstd-compressed
//     MessagePack as bin, or base64 in a str). The zstd decoder's memory is
//     capped and its output may not exceed the type's limit, so a bomb is a
//     payload error; the inflated bytes are walked like the payload;
//  6. decodes and validates the type's fields.
//
// Integers are accepted in any encoding (fixint through int64 and uint64)
// and numbers as integers, float32 or float64. Optional fields sent as nil
// count as absent. Unknown fields are ignored; a known field that occurs
// twice in one map is malformed.
//
// Every failure is a [*ValidationError] naming the message type, the field
// (a dotted path such as "data[3].sequence") and the [Rule] broken; it
// unwraps to [ErrInvalidMessage]. [ErrorReply] turns it into the
// INVALID_MESSAGE error the supervisor sends back.
//
// # Raw bytes and aliasing
//
// The supervisor keeps the agent's bytes: a WAL record's Raw, a checkpoint's
// Data, metadata and other free-form maps are [msgpack.RawMessage] slices of
// the payload (or of the decompressed body when the message came
// compressed). They alias the payload: keep it unmodified while the message
// is in use. Encode splices raw fields back unchanged, so a restore carries
// exactly the bytes the agent once sent.
//
// # Encoding
//
// [Codec.Encode] writes strict MessagePack any conforming library decodes,
// and validates what it writes by the same rules. Timestamp 0 means now.
// Checkpoint.Compress and Restore.Compress send the body zstd-compressed as
// bin, with version at least 2.
//
// # Example
//
//	codec := schema.NewCodec(schema.Options{ExtraWALOperations: []string{"file_write"}})
//	msg, err := codec.Decode(schema.FromAgent, payload)
//	if err != nil {
//		reply, _ := codec.Encode(schema.ErrorReply(err)) // INVALID_MESSAGE
//		...
//	}
//	switch m := msg.(type) {
//	case *schema.WALEntry:
//		log.Append(m.Entry.Sequence, m.Entry.Raw)
//	}
package schema
