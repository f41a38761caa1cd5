// The frame reader: bounded, and liberal in what it decodes — every encoding
// of msgpack-test-suite goes through FrameReader and decodePayload.
import assert from "node:assert/strict";
import { createRequire } from "node:module";
import { test } from "node:test";

import { DEFAULT_MAX_FRAME, FrameReader, ProtocolError, decodePayload, encodeFrame } from "../src/index.js";

const require = createRequire(import.meta.url);
const suite = require("msgpack-test-suite/dist/msgpack-test-suite.json");

const hex = (s) => Buffer.from(s.replace(/-/g, ""), "hex");

// A payload {type: "t", v: <the encoding>} as one frame, cut into 1-byte chunks
// to exercise reassembly, then decoded as the client decodes the supervisor's.
function throughFrames(enc) {
  const payload = Buffer.concat([Buffer.from([0x82, 0xa4, ...Buffer.from("type"), 0xa1, 0x74, 0xa1, 0x76]), enc]);
  const frame = Buffer.alloc(4 + payload.length);
  frame.writeUInt32BE(payload.length, 0);
  payload.copy(frame, 4);
  const r = new FrameReader();
  const out = [];
  for (let i = 0; i < frame.length; i += 7) out.push(...r.push(frame.subarray(i, i + 7)));
  r.end();
  assert.equal(out.length, 1);
  const m = decodePayload(out[0]);
  assert.equal(m.type, "t");
  return m.v;
}

function expected(c) {
  if ("nil" in c) return null;
  if ("bool" in c) return c.bool;
  if ("binary" in c) return new Uint8Array(c.binary === "" ? [] : hex(c.binary));
  if ("bignum" in c) {
    const b = BigInt(c.bignum);
    return b <= BigInt(Number.MAX_SAFE_INTEGER) && b >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(b) : b;
  }
  if ("number" in c) return c.number;
  if ("string" in c) return c.string;
  if ("array" in c) return c.array;
  if ("map" in c) return c.map;
  if ("nested" in c) return c.nested;
  if ("timestamp" in c) return c.timestamp;
  if ("ext" in c) return c.ext;
  throw new Error(`unknown case ${JSON.stringify(c)}`);
}

function normalise(v, c) {
  if (v instanceof Uint8Array) return new Uint8Array(v);
  if ("timestamp" in c && v instanceof Date) return v.getTime();
  if ("ext" in c && v && typeof v === "object" && "type" in v && v.data instanceof Uint8Array) {
    return [v.type, Buffer.from(v.data).toString("hex").match(/../g)?.join("-") ?? ""];
  }
  return v;
}

let total = 0;
for (const [file, cases] of Object.entries(suite)) {
  test(`msgpack-test-suite ${file}: every encoding decodes through the frame reader`, () => {
    for (const c of cases) {
      for (const enc of c.msgpack) {
        const got = normalise(throughFrames(hex(enc)), c);
        let want = expected(c);
        if ("timestamp" in c) {
          // the timestamp extension decodes to a Date, which holds milliseconds
          const ms = want[0] * 1000 + want[1] / 1e6;
          assert.ok(Math.abs(got - ms) <= 1, `${file} ${enc}: ${got} vs ${ms}`);
          total++;
          continue;
        }
        if ("ext" in c) want = [want[0], want[1].toLowerCase()];
        assert.deepEqual(got, want, `${file} ${enc}`);
        total++;
      }
    }
  });
}

test("the suite covered every integer width, str8/16/32, map16/32, array16/32, bin8/16/32", () => {
  const heads = new Set();
  for (const cases of Object.values(suite)) for (const c of cases) for (const e of c.msgpack) heads.add(e.slice(0, 2));
  for (const h of ["cc", "cd", "ce", "cf", "d0", "d1", "d2", "d3", "d9", "da", "db", "de", "df", "dc", "dd", "c4", "c5", "c6", "ca", "cb"]) {
    assert.ok(heads.has(h), `no encoding with head byte 0x${h} in the suite`);
  }
  assert.ok(total > 200, `only ${total} encodings checked`);
});

test("large str16/str32, map16/map32 and array32 built by hand decode", () => {
  const s16 = "a".repeat(300);
  const s32 = "b".repeat(70000);
  const str16 = Buffer.concat([Buffer.from([0xda, 0x01, 0x2c]), Buffer.from(s16)]);
  const str32 = Buffer.concat([Buffer.from([0xdb, 0, 1, 0x11, 0x70]), Buffer.from(s32)]);
  assert.equal(throughFrames(str16), s16);
  assert.equal(throughFrames(str32), s32);
  const map = (head, n) => {
    const parts = [head];
    for (let i = 0; i < n; i++) parts.push(Buffer.from([0xa3, ...Buffer.from(String(i).padStart(3, "0")), i & 0x7f]));
    return Buffer.concat(parts);
  };
  const m16 = throughFrames(map(Buffer.from([0xde, 0x00, 20]), 20));
  assert.equal(Object.keys(m16).length, 20);
  const m32 = throughFrames(map(Buffer.from([0xdf, 0, 0, 0x01, 0x2c]), 300));
  assert.equal(Object.keys(m32).length, 300);
  assert.equal(m32["299"], 299 & 0x7f);
  const a32 = throughFrames(Buffer.concat([Buffer.from([0xdd, 0, 0, 0, 3]), Buffer.from([1, 2, 3])]));
  assert.deepEqual(a32, [1, 2, 3]);
  // map keys the protocol allows in free-form maps that are not strings
  const odd = throughFrames(Buffer.from([0x83, 0x01, 0xa1, 0x61, 0xc3, 0x02, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x03]));
  assert.deepEqual(odd, { 1: "a", true: 2, "18446744073709551615": 3 });
});

test("a frame over the limit is refused from its header, before anything is kept for it", () => {
  const r = new FrameReader(1024);
  const header = Buffer.alloc(4);
  header.writeUInt32BE(0xffffffff, 0);
  assert.throws(() => r.push(header), (e) => e instanceof ProtocolError && /exceeds the maximum of 1024/.test(e.message));
  assert.equal(r.buffered, 0);
  const d = new FrameReader();
  header.writeUInt32BE(DEFAULT_MAX_FRAME + 1, 0);
  assert.throws(() => d.push(header), /exceeds the maximum of 134217728/);
});

test("memory follows the bytes that arrived, not the declared length", () => {
  const r = new FrameReader();
  const header = Buffer.alloc(4);
  header.writeUInt32BE(100 * 1024 * 1024, 0); // a 100 MiB frame declared...
  const before = process.memoryUsage().arrayBuffers;
  assert.deepEqual(r.push(Buffer.concat([header, Buffer.alloc(10)])), []); // ...10 bytes sent
  assert.equal(r.buffered, 10);
  assert.ok(process.memoryUsage().arrayBuffers - before < 10 * 1024 * 1024);
  assert.throws(() => r.end(), /input ended after 10 of 104857600 bytes/);
});

test("zero length, a truncated header and a payload that is not a map are protocol errors", () => {
  assert.throws(() => new FrameReader().push(Buffer.alloc(4)), /zero length/);
  const r = new FrameReader();
  r.push(Buffer.from([0, 0]));
  assert.throws(() => r.end(), /inside the length prefix/);
  assert.throws(() => decodePayload(Buffer.from([0x93, 1, 2, 3])), (e) => e instanceof ProtocolError && /not a map/.test(e.message));
  assert.throws(() => decodePayload(Buffer.from([0x81, 0xa1])), ProtocolError);
  assert.throws(() => decodePayload(Buffer.from([0x80, 0x01])), /invalid frame payload/); // bytes after the map
});

test("several frames in one chunk and one frame across many chunks", () => {
  const f = Buffer.concat([encodeFrame({ type: "a", n: 1 }), encodeFrame({ type: "b", n: 2 }), encodeFrame({ type: "c" })]);
  const r = new FrameReader();
  const got = [...r.push(f.subarray(0, 5)), ...r.push(f.subarray(5, f.length - 1)), ...r.push(f.subarray(f.length - 1))];
  assert.deepEqual(got.map((p) => decodePayload(p).type), ["a", "b", "c"]);
  r.end();
});
