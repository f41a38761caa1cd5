// Length-prefixed MessagePack framing: a 4-byte big-endian length N, then N
// bytes of MessagePack (byte-compatible with Erlang's {packet, 4}).
import { Decoder, Encoder } from "@msgpack/msgpack";
import { ProtocolError } from "./errors.js";

/** The largest frame the supervisor sends (a restore): 128 MiB. */
export const DEFAULT_MAX_FRAME = 128 * 1024 * 1024;

const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);
const MIN_SAFE = BigInt(Number.MIN_SAFE_INTEGER);

// The supervisor hands back free-form maps (checkpoint data, WAL entries)
// byte for byte as the agent encoded them, so any MessagePack may arrive:
// 64-bit integers beyond 2^53 decode as BigInt (smaller ones as numbers),
// map keys that are neither strings nor numbers become strings.
class SupervisorDecoder extends Decoder {
  readU64() {
    const v = this.readU64AsBigInt();
    return v <= MAX_SAFE ? Number(v) : v;
  }

  readI64() {
    const v = this.readI64AsBigInt();
    return v <= MAX_SAFE && v >= MIN_SAFE ? Number(v) : v;
  }
}

function keyConverter(key) {
  if (typeof key === "string" || typeof key === "number") return key;
  if (typeof key === "bigint" || typeof key === "boolean" || key === null) return String(key);
  if (key instanceof Uint8Array) return Buffer.from(key).toString("latin1");
  try {
    return JSON.stringify(key, (_, v) => (typeof v === "bigint" ? v.toString() : v));
  } catch {
    return String(key);
  }
}

const decoderOptions = { mapKeyConverter: keyConverter };
let sharedDecoder = null;

/** Decode one MessagePack value (nothing after it), as the client reads payloads. */
export function decodeValue(bytes) {
  // One decoder for every call: its key cache makes repeated keys cheap.
  if (sharedDecoder === null) sharedDecoder = new SupervisorDecoder(decoderOptions);
  return sharedDecoder.decode(bytes);
}

const encoder = new Encoder({ useBigInt64: true, ignoreUndefined: true, initialBufferSize: 4096 });

/** The MessagePack encoding of a value (BigInt as int64/uint64, undefined fields dropped). */
export function encodeValue(value) {
  return encoder.encode(value);
}

/** The frame of a large message (a checkpoint), from an encoder of its own so no buffer of its size stays behind. */
export function encodeFrameOnce(msg) {
  return frameOf(new Encoder({ useBigInt64: true, ignoreUndefined: true }).encode(msg));
}

/** A frame: the 4-byte big-endian length and the payload. */
export function frameOf(payload) {
  const out = Buffer.allocUnsafe(4 + payload.length);
  out.writeUInt32BE(payload.length, 0);
  out.set(payload, 4);
  return out;
}

/** The frame of one message: encoded once into the encoder's own buffer, copied once behind its length. */
export function encodeFrame(msg) {
  return frameOf(encoder.encodeSharedRef(msg));
}

/** Decode one payload into a message; a payload that is not a map is a ProtocolError. */
export function decodePayload(payload) {
  let m;
  try {
    m = decodeValue(payload);
  } catch (e) {
    throw new ProtocolError(`invalid frame payload: ${e && e.message ? e.message : e}`);
  }
  if (m === null || typeof m !== "object" || Array.isArray(m) || m instanceof Uint8Array) {
    throw new ProtocolError(`invalid frame payload: not a map but ${Array.isArray(m) ? "an array" : typeof m}`);
  }
  return m;
}

/**
 * Cuts a byte stream into frames. push() takes chunks as they arrive and
 * returns the complete payloads. Memory is bounded by what actually arrived:
 * a declared length is checked against the limit before anything is kept
 * for it, and a payload is assembled only once all its bytes are here.
 */
export class FrameReader {
  constructor(maxFrame = DEFAULT_MAX_FRAME) {
    this.maxFrame = maxFrame;
    this.chunks = [];
    this.buffered = 0;
    this.need = -1; // the current frame's length once its header is read
  }

  /** @returns {Buffer[]} complete payloads, in order */
  push(chunk) {
    if (chunk.length > 0) {
      this.chunks.push(chunk);
      this.buffered += chunk.length;
    }
    const out = [];
    for (;;) {
      if (this.need < 0) {
        if (this.buffered < 4) break;
        const header = this.take(4);
        const n = header.readUInt32BE(0);
        if (n === 0) throw new ProtocolError("invalid frame: zero length");
        if (n > this.maxFrame) {
          throw new ProtocolError(`invalid frame: length ${n} exceeds the maximum of ${this.maxFrame} bytes`);
        }
        this.need = n;
      }
      if (this.buffered < this.need) break;
      out.push(this.take(this.need));
      this.need = -1;
    }
    return out;
  }

  /** At the end of input: throws if it ended inside a frame. */
  end() {
    if (this.need >= 0) {
      throw new ProtocolError(`truncated frame: input ended after ${this.buffered} of ${this.need} bytes`);
    }
    if (this.buffered > 0) {
      throw new ProtocolError(`truncated frame: input ended inside the length prefix (${this.buffered} of 4 bytes)`);
    }
  }

  take(n) {
    const first = this.chunks[0];
    if (first.length === n) {
      this.chunks.shift();
      this.buffered -= n;
      return first;
    }
    if (first.length > n) {
      this.chunks[0] = first.subarray(n);
      this.buffered -= n;
      return first.subarray(0, n);
    }
    const out = Buffer.allocUnsafe(n);
    let got = 0;
    while (got < n) {
      const c = this.chunks[0];
      const k = Math.min(c.length, n - got);
      out.set(k === c.length ? c : c.subarray(0, k), got);
      got += k;
      if (k === c.length) this.chunks.shift();
      else this.chunks[0] = c.subarray(k);
    }
    this.buffered -= n;
    return out;
  }
}
