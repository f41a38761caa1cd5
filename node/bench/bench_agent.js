// The agent bench.js runs under the supervisor. Requests say what to measure.
import fs from "node:fs";

import { Agent } from "../src/index.js";
import { openProbe, p50 } from "./probe.js";

const agent = await Agent.connect();
const out = process.env.BENCH_OUT;
const note = (o) => fs.appendFileSync(out, JSON.stringify(o) + "\n");
note({ event: "start", pid: process.pid });

async function logBench(total, inflight) {
  const params = { content: "x".repeat(100) };
  let next = 0;
  const worker = async () => {
    while (next < total) {
      next++;
      await agent.log("memory_add", params);
    }
  };
  const t0 = performance.now();
  await Promise.all(Array.from({ length: inflight }, worker));
  return (performance.now() - t0) / 1000;
}

async function handle(req) {
  const c = req.context;
  switch (req.message) {
    case "plain":
      return req.reply({ ok: true });
    case "step": {
      const t0 = performance.now();
      await req.step("trivial", () => 1);
      const ms = performance.now() - t0;
      return req.reply({ ok: true, step_ms: ms });
    }
    case "loggap": {
      // log() one at a time, each followed by one fdatasync probe (as
      // floor_agent.js does without the client).
      const probe = openProbe(`${out}.probe`);
      const lat = [];
      const fsync = [];
      const params = { content: "x".repeat(900) };
      for (let i = 0; i < c.n; i++) {
        const t = performance.now();
        await agent.log("memory_add", params);
        lat.push(performance.now() - t);
        fsync.push(probe.once());
      }
      probe.close();
      return req.reply({ log_p50_ms: p50(lat), fdatasync_p50_ms: p50(fsync) });
    }
    case "log": {
      await logBench(2000, c.inflight); // warm up
      const seconds = await logBench(c.n, c.inflight);
      return req.reply({ n: c.n, inflight: c.inflight, seconds, per_s: c.n / seconds });
    }
    case "wait": {
      const aborted = new Promise((r) => req.signal.addEventListener("abort", r, { once: true }));
      note({ event: "waiting", id: req.requestId });
      await aborted;
      note({ event: "aborted", id: req.requestId, t: performance.timeOrigin + performance.now() });
      return req.fail("CANCELLED", "cancelled");
    }
    default:
      return req.fail("UNKNOWN", req.message);
  }
}

for await (const req of agent.requests()) handle(req);
agent.close();
