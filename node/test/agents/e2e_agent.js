// The agent the end-to-end tests run under the real supervisor. It writes
// what it sees, one JSON object a line, to $AGENT_REPORT; $AGENT_MODE picks
// what it does at start. Requests are answered by their message.
import fs from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";

import { Agent, StepResultTooLarge } from "../../src/index.js";

const mode = process.env.AGENT_MODE ?? "serve";
const counter = process.env.STEP_COUNTER; // outside the data dir: one line per fake LLM call

function replacer(k, v) {
  const o = this[k]; // before toJSON: a Buffer is still a Uint8Array
  if (typeof o === "bigint") return { bigint: o.toString() };
  if (o instanceof Uint8Array) return { bin: Buffer.from(o).toString("hex") };
  return v;
}

function report(event, fields = {}) {
  fs.appendFileSync(process.env.AGENT_REPORT, JSON.stringify({ event, ...fields }, replacer) + "\n");
}

export const RICH = {
  bin: new Uint8Array([0, 1, 2, 255]),
  big: 2n ** 64n - 1n,
  neg: -(2n ** 63n),
  float: 0.1 + 0.2,
  text: "héllo ✓",
  nested: { list: [1, -1, 300, -40000, 70000, 2 ** 40], empty: {} },
};

const agent = await Agent.connect({
  heartbeatInterval: Number(process.env.AGENT_HB_MS ?? 1000),
  onShutdown: (m) => (mode === "shutdown" ? { final: true, n: 42, reason: m.reason } : null),
});
const r = agent.restore;
report("start", {
  pid: process.pid,
  transport: process.env.SUPERVISOR_TRANSPORT,
  version: agent.version,
  restore: r && {
    checkpoint_id: r.checkpointId,
    snapshot: r.snapshot,
    wal_entries: r.walEntries,
    last_sequence: r.lastSequence,
    compressed: r.compressed,
    raw_has_steps: r.raw.wal_entries.some((e) => e.operation === "request_step"),
  },
  table: agent.stepTable(),
  last_sequence: agent.lastSequence,
});

if (mode === "exact" && !r) {
  const cid = await agent.checkpoint({ rich: RICH });
  report("checkpointed", { checkpoint_id: cid });
  const seqs = [];
  for (let i = 0; i < 3; i++) seqs.push(await agent.log("state_update", { i, rich: RICH }));
  report("logged", { seqs });
} else if (mode === "exact") {
  const seq = await agent.log("state_update", { after: true });
  report("logged_after_restore", { seq });
}
if (mode === "checkpoint") {
  const size = Number(process.env.AGENT_SIZE ?? 1000);
  const blob = Buffer.alloc(size);
  for (let i = 0; i < size; i++) blob[i] = (i * 7919) % 251;
  if (!r) report("checkpointed", { checkpoint_id: await agent.checkpoint({ blob, size }) });
  else report("restored_blob", { ok: Buffer.from(r.snapshot.blob).equals(blob), size: r.snapshot.size, compressed: r.compressed, version: agent.version });
}
report("ready");

async function handle(req) {
  const rid = req.requestId;
  switch (req.message) {
    case "hello":
      return req.reply({ echo: req.message, user: req.userId, ctx: req.context, attempt: req.attempt });
    case "fail":
      return req.fail("TOOL_FAILED", "asked to fail");
    case "table":
      return req.reply({ table: agent.stepTable() });
    case "big":
      try {
        await req.step("huge", async () => "x".repeat(20000));
        return req.reply({ logged: true });
      } catch (e) {
        report("big_refused", { name: e.name, message: e.message, is: e instanceof StepResultTooLarge, last: agent.lastSequence });
        return req.fail("TOO_LARGE", e.message);
      }
    case "steps": {
      const c = req.context;
      const results = [];
      report("delivered", { rid, attempt: req.attempt });
      req.signal.addEventListener("abort", () => report("aborted", { rid, t: performance.timeOrigin + performance.now() }));
      try {
        for (let i = 0; i < (c.n ?? 3); i++) {
          const res = await req.step(`llm${i}`, async (signal) => {
            if (counter) fs.appendFileSync(counter, `${rid} ${i} ${req.attempt}\n`);
            await sleep(c.sleep_ms ?? 0, undefined, { signal });
            return { i, text: `answer ${i}` };
          });
          results.push(res);
          report("step_done", { rid, i, attempt: req.attempt });
          if (c.checkpoint_after === i) report("checkpointed", { checkpoint_id: await agent.checkpoint({ mine: true }) });
          if (c.hang_after === i && req.attempt === 1) {
            report("hanging", { rid, i });
            await new Promise(() => {}); // the test kills -9 the agent here
          }
        }
      } catch (e) {
        report("cancelled", { rid, completed: results.length, name: e.name });
        return req.fail("CANCELLED", `stopped after ${results.length} steps`);
      }
      return req.reply({ results, attempt: req.attempt });
    }
    default:
      return req.fail("UNKNOWN", `no handler for ${req.message}`);
  }
}

for await (const req of agent.requests()) {
  handle(req).catch((e) => report("handler_error", { name: e.name, message: e.message }));
}
report("exit", { shutdown: agent.shutdownMessage?.reason ?? null });
agent.close();
