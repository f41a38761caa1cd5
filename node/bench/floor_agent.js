// The floor of a durable round trip from Node on this machine: an agent
// with no client code (raw frames through @msgpack/msgpack, one write, one
// stream reader) logs 1 KiB entries with ack: true, one at a time, each
// followed by one fdatasync probe on the data directory's file system (the
// pause a step inside a request sees between round trips). bench.js runs
// it under its own supervisor beside the client's figures. Figures go to
// FLOOR_OUT as JSON.
import fs from "node:fs";
import path from "node:path";

import { decode, encode } from "@msgpack/msgpack";

import { openProbe, p50 } from "./probe.js";

const N = Number(process.env.FLOOR_N ?? 2000);
const frame = (m) => {
  const p = encode(m);
  const b = Buffer.allocUnsafe(4 + p.length);
  b.writeUInt32BE(p.length, 0);
  b.set(p, 4);
  return b;
};
const now = () => Math.floor(Date.now() / 1000);
const write = (b) => fs.writeSync(1, b);

write(frame({ type: "heartbeat", timestamp: now() }));
setInterval(() => write(frame({ type: "heartbeat", timestamp: now() })), 1000).unref();

let pending = Buffer.alloc(0);
let waiter = null;
process.stdin.on("data", (d) => {
  pending = pending.length ? Buffer.concat([pending, d]) : d;
  while (pending.length >= 4) {
    const n = pending.readUInt32BE(0);
    if (pending.length < 4 + n) break;
    const m = decode(pending.subarray(4, 4 + n));
    pending = pending.subarray(4 + n);
    if (m.type === "wal_ack" && waiter) {
      const w = waiter;
      waiter = null;
      w();
    } else if (m.type === "shutdown") {
      process.exit(0);
    }
  }
});
process.stdin.on("end", () => process.exit(0));

const probe = openProbe(path.join(process.env.FLOOR_SYNCDIR, "floor-probe"));
const lat = [];
const fsync = [];
const params = { content: "x".repeat(900) };
for (let i = 1; i <= N; i++) {
  const fr = frame({ type: "wal_entry", timestamp: now(), ack: true, data: { sequence: i, operation: "memory_add", params } });
  const t = performance.now();
  const acked = new Promise((r) => (waiter = r));
  write(fr);
  await acked;
  lat.push(performance.now() - t);
  fsync.push(probe.once());
}
probe.close();
fs.writeFileSync(process.env.FLOOR_OUT + ".tmp", JSON.stringify({ n: N, log_p50_ms: p50(lat), fdatasync_p50_ms: p50(fsync) }));
fs.renameSync(process.env.FLOOR_OUT + ".tmp", process.env.FLOOR_OUT);
