// The client against an in-memory fake supervisor: what the real binary
// cannot be made to do on demand (a redelivery with a renamed step, refused
// entries), and the step table's round trip through a checkpoint.
import assert from "node:assert/strict";
import { PassThrough } from "node:stream";
import { test } from "node:test";

import { Encoder } from "@msgpack/msgpack";

import { Agent, FrameReader, InvalidMessage, STEPS_KEY, StepMismatch, WalFull, decodePayload, encodeFrame } from "../src/index.js";

// The largest frame the supervisor reads from an agent: a checkpoint of 100 MiB plus a 16 KiB envelope.
const MAX_FROM_AGENT = 100 * 1024 * 1024 + 16 * 1024;

class Fake {
  constructor({ restore, failNext = null } = {}) {
    this.toAgent = new PassThrough();
    this.fromAgent = new PassThrough();
    this.received = [];
    this.failNext = failNext;
    this.waiters = [];
    const r = new FrameReader();
    this.fromAgent.on("data", (c) => {
      for (const p of r.push(c)) {
        if (p.length > MAX_FROM_AGENT) {
          // as the supervisor does: skipped unread, answered without a type or a sequence
          this.received.push({ type: null, skipped: p.length });
          this.send({ type: "error", error: { code: "INVALID_MESSAGE", message: `invalid message: payload of ${p.length} bytes is above the largest accepted frame (${MAX_FROM_AGENT} bytes) (too_large)`, details: { rule: "too_large" } } });
          continue;
        }
        this.onMessage(decodePayload(p));
      }
    });
    if (restore) this.send({ type: "restore", checkpoint_id: "", snapshot: {}, wal_entries: [], last_sequence: 0, ...restore });
  }

  send(m) {
    this.toAgent.write(encodeFrame({ timestamp: 0, ...m }));
  }

  onMessage(m) {
    this.received.push(m);
    if ((m.type === "wal_entry" || m.type === "wal_batch") && m.ack) {
      const seqs = m.type === "wal_entry" ? [m.data.sequence] : m.data.map((e) => e.sequence);
      const tooBig = m.type === "wal_batch" ? m.data.findIndex((e) => new Encoder().encode(e).length > 10 * 1024) : -1;
      if (tooBig >= 0) {
        // as the supervisor refuses it: at once, naming the entry's index but no sequence
        this.send({ type: "error", error: { code: "INVALID_MESSAGE", message: `invalid message: wal_batch.data[${tooBig}]: entry over the 10240-byte wal_entry limit (too_large)`, details: { type: "wal_batch", field: `data[${tooBig}]`, rule: "too_large" } } });
      } else if (this.holdAcks) {
        this.held = seqs.at(-1);
      } else if (this.failNext) {
        this.send({ type: "error", error: { code: this.failNext, message: "disk full", details: { first_sequence: seqs[0], last_sequence: seqs.at(-1) } } });
        this.failNext = null;
      } else {
        this.send({ type: "wal_ack", sequence: seqs.at(-1) });
      }
    }
    if (m.type === "checkpoint") this.send({ type: "checkpoint_ack", checkpoint_id: `cp-${this.received.length}`, size: 1 });
    for (const w of this.waiters.splice(0)) w();
  }

  async until(pred) {
    while (!pred(this.received)) await new Promise((r) => this.waiters.push(r));
    return this.received;
  }

  agent(opts = {}) {
    return Agent.open(this.toAgent, this.fromAgent, { heartbeatInterval: 0, restorePending: true, ...opts });
  }
}

const stepEntry = (seq, rid, index, name, result) => ({
  operation: "request_step",
  sequence: seq,
  params: { request_id: rid, index, name, result },
});

test("redelivery: logged steps return their results without running fn; a renamed step is StepMismatch", async () => {
  const fake = new Fake({
    restore: {
      checkpoint_id: "c1",
      snapshot: { mine: 1, [STEPS_KEY]: { r1: [{ index: 0, name: "plan", result: { p: "plan!" } }] } },
      wal_entries: [stepEntry(5, "r1", 1, "search", ["a", "b"]), stepEntry(6, "r2", 0, "x", 1), { operation: "request_done", sequence: 7, params: { request_id: "r2" } }],
      last_sequence: 7,
    },
  });
  const agent = await fake.agent();
  assert.deepEqual(agent.restore.snapshot, { mine: 1 });
  assert.deepEqual(agent.restore.walEntries, []);
  assert.equal(agent.lastSequence, 7);
  fake.send({ type: "process_request", request_id: "r1", attempt: 2, data: { message: "m" } });
  const it = agent.requests()[Symbol.asyncIterator]();
  const req = (await it.next()).value;
  assert.equal(req.attempt, 2);
  const calls = [];
  const s0 = await req.step("plan", () => calls.push("plan"));
  const s1 = await req.step("search", () => calls.push("search"));
  const s2 = await req.step("write", async () => {
    calls.push("write");
    return "text";
  });
  assert.deepEqual([s0, s1, s2], [{ p: "plan!" }, ["a", "b"], "text"]);
  assert.deepEqual(calls, ["write"], "only the step not logged before ran");
  const logged = fake.received.find((m) => m.type === "wal_entry" && m.data.operation === "request_step");
  assert.deepEqual(logged.data, { sequence: 8, operation: "request_step", params: { request_id: "r1", index: 2, name: "write", result: "text" } });
  assert.equal(logged.ack, true);

  // the table goes into checkpoints, not into the user's state
  const cid = await agent.checkpoint({ mine: 2 });
  assert.ok(cid.startsWith("cp-"));
  const cp = fake.received.find((m) => m.type === "checkpoint");
  assert.deepEqual(cp.data[STEPS_KEY].r1.map((s) => s.name), ["plan", "search", "write"]);
  assert.equal(cp.data.mine, 2);

  await req.reply({ ok: true });
  await fake.until((ms) => ms.some((m) => m.type === "wal_entry" && m.data.operation === "request_done"));
  const tail = fake.received.slice(-2);
  assert.deepEqual(tail.map((m) => m.type), ["request_result", "wal_entry"], "request_done goes after the answer, never before");
  assert.deepEqual(tail[1].data, { sequence: 9, operation: "request_done", params: { request_id: "r1" } });
  assert.equal(tail[1].ack, undefined);
  assert.deepEqual(agent.stepTable(), {});
  await agent.checkpoint({ mine: 3 });
  assert.equal(STEPS_KEY in fake.received.findLast((m) => m.type === "checkpoint").data, false);

  // a handler that calls its steps in another order on redelivery
  const fake2 = new Fake({ restore: { wal_entries: [stepEntry(1, "r9", 0, "llm", "x")], last_sequence: 1 } });
  const a2 = await fake2.agent();
  fake2.send({ type: "process_request", request_id: "r9", attempt: 2, data: { message: "m" } });
  const r9 = (await a2.requests()[Symbol.asyncIterator]().next()).value;
  let ran = false;
  await assert.rejects(
    r9.step("tool", () => {
      ran = true;
    }),
    (e) => e instanceof StepMismatch && /logged as "llm" but the handler now calls "tool"/.test(e.message),
  );
  assert.equal(ran, false);
  agent.close();
  a2.close();
});

test("cancel_request aborts the request's signal; a step not started never runs; the request can still fail", async () => {
  const fake = new Fake({ restore: {} });
  const agent = await fake.agent();
  fake.send({ type: "process_request", request_id: "c1", data: { message: "m" } });
  const req = (await agent.requests()[Symbol.asyncIterator]().next()).value;
  assert.equal(req.attempt, 1);
  assert.equal(req.signal.aborted, false);
  const aborted = new Promise((r) => req.signal.addEventListener("abort", r));
  fake.send({ type: "cancel_request", request_id: "c1" });
  fake.send({ type: "cancel_request", request_id: "unknown" }); // ignored
  await aborted;
  assert.equal(req.cancelled, true);
  let ran = false;
  await assert.rejects(req.step("later", () => (ran = true)), { name: "AbortError" });
  assert.equal(ran, false);
  await req.fail("CANCELLED", "stopped");
  await fake.until((ms) => ms.some((m) => m.type === "request_result"));
  assert.equal(fake.received.at(-1).error.code, "CANCELLED");
  agent.close();
});

test("heartbeats say accepts: [cancel_request]; log() numbers above last_sequence and rejects on WAL_FULL", async () => {
  const fake = new Fake({ restore: { last_sequence: 41 }, failNext: null });
  const agent = await fake.agent({ heartbeatInterval: 10 });
  await fake.until((ms) => ms.some((m) => m.type === "heartbeat"));
  const hb = fake.received.find((m) => m.type === "heartbeat");
  assert.deepEqual(hb.accepts, ["cancel_request"]);
  assert.equal(await agent.log("memory_add", { content: "a" }), 42);
  const seqs = await Promise.all(Array.from({ length: 64 }, (_, i) => agent.log("memory_add", { i })));
  assert.deepEqual(seqs, Array.from({ length: 64 }, (_, i) => 43 + i));
  fake.failNext = "WAL_FULL";
  await assert.rejects(agent.log("memory_add", {}), (e) => e instanceof WalFull && /WAL_FULL/.test(e.message));
  assert.equal(await agent.log("memory_add", {}), 108);
  agent.close();
});

test("hot_reload, evolution_result and shutdown are events; requests() ends after onShutdown's final checkpoint", async () => {
  const fake = new Fake({ restore: {} });
  const agent = await fake.agent({ onShutdown: async (m) => ({ final: m.reason }) });
  const seen = [];
  for (const ev of ["hot_reload", "evolution_result", "shutdown"]) agent.on(ev, (m) => seen.push([ev, m.module ?? m.decision ?? m.reason]));
  fake.send({ type: "hot_reload", code: "x = 1", module: "tools", backup_checkpoint_id: "" });
  fake.send({ type: "evolution_result", success: true, decision: "promoted", metrics: {}, reason: "faster" });
  fake.send({ type: "shutdown", reason: "supervisor is stopping", create_checkpoint: true });
  const it = agent.requests()[Symbol.asyncIterator]();
  assert.deepEqual(await it.next(), { value: undefined, done: true });
  assert.deepEqual(seen, [["hot_reload", "tools"], ["evolution_result", "promoted"], ["shutdown", "supervisor is stopping"]]);
  assert.deepEqual(fake.received.findLast((m) => m.type === "checkpoint").data, { final: "supervisor is stopping" });
  agent.close();
});

test("back-pressure: with the pipe full, send() and log() resolve only once it drains; frames stay in order", async () => {
  const fake = new Fake({ restore: {} });
  const agent = await fake.agent();
  fake.fromAgent.pause(); // the supervisor stops reading
  const big = { blob: "y".repeat(8000) };
  let resolved = 0;
  const sends = Array.from({ length: 20 }, () => agent.send({ type: "metrics", data: { n: 1 }, pad: big }).then(() => resolved++));
  await new Promise((r) => setTimeout(r, 50));
  // the first frames fit in the pipe's buffer; the rest wait for it to drain
  assert.ok(resolved < 10, `${resolved} of 20 sends resolved while the pipe is full`);
  assert.equal(fake.fromAgent.writableNeedDrain, true);
  const logged = agent.log("memory_add", { last: true });
  fake.fromAgent.resume();
  await Promise.all(sends);
  assert.equal(await logged, 1);
  const types = fake.received.map((m) => m.type);
  assert.deepEqual(types.slice(-21), [...Array(20).fill("metrics"), "wal_entry"]);
  agent.close();
});

test("a zstd body declaring more than the limit is refused before decompressing", async () => {
  const { decompress } = await import("../src/zstd.js");
  const frame = Buffer.alloc(4 + 1 + 8 + 3);
  frame.writeUInt32LE(0xfd2fb528, 0);
  frame[4] = 0xe0; // content size: 8 bytes, single segment
  frame.writeBigUInt64LE(200n * 1024n * 1024n, 5);
  assert.throws(() => decompress(frame, 100 * 1024 * 1024), /declares 209715200 bytes, over the limit of 104857600/);
});

/** Runs fn with process.stderr.write captured; returns what was written. */
async function stderrOf(fn) {
  const write = process.stderr.write;
  let out = "";
  process.stderr.write = (chunk, ...rest) => {
    out += String(chunk);
    return true;
  };
  try {
    await fn();
  } finally {
    process.stderr.write = write;
  }
  return out;
}

/** Records unhandled rejections while fn runs (each would kill a Node 20 process: exit 1). */
async function unhandledRejectionsOf(fn) {
  const seen = [];
  const record = (e) => seen.push(e);
  process.on("unhandledRejection", record);
  try {
    await fn();
    await new Promise((r) => setTimeout(r, 20)); // unhandled rejections are reported after a turn
  } finally {
    process.off("unhandledRejection", record);
  }
  return seen;
}

test("a throwing hot_reload listener does not close the connection", async () => {
  const fake = new Fake({ restore: {} });
  const agent = await fake.agent();
  let closedWith = null;
  agent.on("close", (e) => {
    closedWith = e;
  });
  const seen = [];
  const err = await stderrOf(async () => {
    const rejections = await unhandledRejectionsOf(async () => {
      agent.on("hot_reload", () => {
        throw new TypeError("bug");
      });
      agent.on("hot_reload", (m) => seen.push(m.module)); // the listeners after it still run
      agent.on("evolution_result", async () => {
        throw new RangeError("async bug");
      });
      agent.on("cancel_request", () => {
        throw new Error("cancel bug");
      });
      fake.send({ type: "hot_reload", code: "x = 1", module: "tools", backup_checkpoint_id: "" });
      fake.send({ type: "evolution_result", success: true, decision: "promoted", metrics: {}, reason: "" });
      fake.send({ type: "cancel_request", request_id: "nobody" });
      fake.send({ type: "process_request", request_id: "r1", data: { message: "hi" } });
      const it = agent.requests()[Symbol.asyncIterator]();
      const next = await it.next();
      assert.equal(closedWith, null, `connection closed: ${closedWith && closedWith.message}`);
      assert.equal(next.done, false);
      assert.equal(next.value.requestId, "r1");
      assert.equal(await agent.log("memory_add", { n: 1 }), 1);
    });
    assert.deepEqual(rejections, []);
  });
  assert.deepEqual(seen, ["tools"]);
  assert.match(err, /hot_reload listener threw: TypeError: bug/);
  assert.match(err, /evolution_result listener threw: RangeError: async bug/);
  assert.match(err, /cancel_request listener threw: Error: cancel bug/);
  agent.close();
});

test("a throwing shutdown listener neither kills the process nor stops onShutdown's final checkpoint", async () => {
  const fake = new Fake({ restore: {} });
  const agent = await fake.agent({ onShutdown: (m) => ({ final: m.reason }) });
  let rejections;
  const err = await stderrOf(async () => {
    rejections = await unhandledRejectionsOf(async () => {
      agent.on("shutdown", () => {
        throw new TypeError("shutdown bug");
      });
      fake.send({ type: "shutdown", reason: "supervisor is stopping", create_checkpoint: true });
      const it = agent.requests()[Symbol.asyncIterator]();
      assert.deepEqual(await it.next(), { value: undefined, done: true });
    });
  });
  assert.deepEqual(rejections, [], `unhandled rejection (exit 1 in a real agent): ${rejections[0]}`);
  assert.deepEqual(fake.received.findLast((m) => m.type === "checkpoint")?.data, { final: "supervisor is stopping" });
  assert.match(err, /shutdown listener threw: TypeError: shutdown bug/);
  assert.equal(agent.closed, false);
  agent.close();
});

test("an entry over walEntryLimit rejects at once, unsent; the entry in flight beside it is durable", async () => {
  const fake = new Fake({ restore: {} });
  const agent = await fake.agent();
  const small = agent.log("memory_add", { n: 1 });
  await assert.rejects(
    agent.log("memory_add", { blob: "x".repeat(10 * 1024) }),
    (e) => e instanceof InvalidMessage && e.code === "INVALID_MESSAGE" && e.details.limit === 10240 && e.details.size > 10240,
  );
  assert.equal(await small, 1);
  assert.equal(await agent.log("memory_add", { n: 2 }), 2); // no sequence spent on the refused entry
  assert.deepEqual(
    fake.received.filter((m) => m.type === "wal_entry").map((m) => m.data.sequence),
    [1, 2],
  );
  agent.close();
  const roomy = await new Fake({ restore: {} }).agent({ walEntryLimit: 64 * 1024 });
  assert.equal(await roomy.log("memory_add", { blob: "x".repeat(10 * 1024) }), 1);
  roomy.close();
});

test("a cancelled request's steps are forgotten (request_done): restored ones not in flight, and logged ones in flight", async () => {
  const fake = new Fake({ restore: { wal_entries: [stepEntry(1, "old", 0, "llm", "x")], last_sequence: 1 } });
  const agent = await fake.agent();
  assert.deepEqual(Object.keys(agent.stepTable()), ["old"]);
  fake.send({ type: "cancel_request", request_id: "old" }); // restored, never redelivered: cancelled for good
  await fake.until((ms) => ms.some((m) => m.type === "wal_entry" && m.data.operation === "request_done"));
  assert.deepEqual(fake.received.at(-1).data.params, { request_id: "old" });
  assert.deepEqual(agent.stepTable(), {});

  fake.send({ type: "process_request", request_id: "live", data: { message: "m" } });
  const req = (await agent.requests()[Symbol.asyncIterator]().next()).value;
  assert.equal(await req.step("first", () => 1), 1);
  let release;
  const running = req.step("second", () => new Promise((r) => (release = r)));
  await new Promise((r) => setImmediate(r));
  fake.send({ type: "cancel_request", request_id: "live" }); // cancelled while "second" runs
  await fake.until((ms) => ms.filter((m) => m.type === "wal_entry" && m.data.operation === "request_done").length === 2);
  release(2);
  await assert.rejects(running, { name: "AbortError" });
  assert.equal(fake.received.some((m) => m.type === "wal_entry" && m.data.params?.name === "second"), false, "a step cancelled while it ran is not logged");
  assert.deepEqual(agent.stepTable(), {});
  agent.close();
});

test("an oversized checkpoint, refused without a type, never takes the next checkpoint's ack", async () => {
  const fake = new Fake({ restore: {} });
  const agent = await fake.agent();
  // Node 20 cannot compress: a state over 100 MiB goes out plain, over the supervisor's largest frame
  let bigOutcome = null;
  agent.checkpoint({ blob: Buffer.alloc(MAX_FROM_AGENT + 32 * 1024, 120) }).then(
    (id) => (bigOutcome = { id }),
    (err) => (bigOutcome = { err }),
  );
  const small = await Promise.race([
    agent.checkpoint({ small: 1 }),
    new Promise((resolve) => setTimeout(() => resolve("no answer within 5 s"), 5000)),
  ]);
  assert.ok(typeof small === "string" && small.startsWith("cp-"), `the small checkpoint is stored and acknowledged, got ${small}`);
  assert.ok(bigOutcome !== null && bigOutcome.err instanceof InvalidMessage, `the big one failed, got ${JSON.stringify(bigOutcome && bigOutcome.id)}`);
  agent.close();
});

test("a batch holding an entry over walEntryLimit never fails the entry in flight beside it", async () => {
  const fake = new Fake({ restore: {} });
  const agent = await fake.agent();
  fake.holdAcks = true; // entry 1 waits for its fsync while the batch is refused at once
  const small = agent.log("memory_add", { n: 1 });
  const smallOutcome = small.then((seq) => ({ seq }), (err) => ({ err: err.message }));
  await assert.rejects(agent.logBatch([["memory_add", { blob: "x".repeat(20000) }]]), InvalidMessage);
  fake.holdAcks = false;
  fake.send({ type: "wal_ack", sequence: fake.held ?? 1 });
  assert.deepEqual(await smallOutcome, { seq: 1 }, "entry 1 is durable: the batch's refusal is not its error");
  agent.close();
});
