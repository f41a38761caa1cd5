// Package wire reads and writes the supervisor's frames: a 4-byte big-endian
// unsigned length N followed by N bytes of payload, byte-compatible with
// Erlang's {packet, 4} port framing.
//
// # Reading
//
// [Reader.ReadFrame] returns one payload per call. It checks the declared
// length before allocating anything of that size: a length of 0 is
// [ErrZeroLength], a length above the configured maximum is
// [ErrFrameTooLarge]. A payload larger than 1 MiB is read into a buffer that
// grows as bytes arrive, so a peer that declares a large frame and then stalls
// or dies has not made the reader commit memory for bytes it never sent.
//
// End of input is reported precisely:
//
//   - io.EOF itself: the input ended cleanly between two frames.
//   - [ErrTruncated] (whose chain also holds io.ErrUnexpectedEOF): the input
//     ended inside a frame, in its header or its payload.
//
// Zero length, too large and truncated are framing errors ([IsFramingError]):
// after one, the byte stream cannot be trusted and the peer must be
// restarted. Any other error is the underlying reader's, wrapped.
//
// # Writing
//
// [Writer.WriteFrame] is safe for concurrent use; frames from concurrent
// callers never interleave. A payload up to 64 KiB is copied behind its
// header into a pooled buffer and written with a single Write call; a larger
// one is written as header and payload, two calls under the writer's lock,
// to avoid copying megabytes. If a Write fails or is short, the stream is
// broken (the peer may hold half a frame): the error is sticky and every
// later WriteFrame returns it.
package wire
