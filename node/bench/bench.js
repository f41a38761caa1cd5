#!/usr/bin/env node
// Benchmarks of the Node client through the real supervisor binary.
//
//   cd node && node bench/bench.js            (SUPERVISOR_BIN=path to skip the build)
//
// Prints JSON:
//   - log_64: durable log() (each waits for its wal_ack) with 64 in flight, entries/s
//   - step: a request answered after one step (trivial fn, its result logged
//     with ack) against a plain reply, HTTP round trip p50 of each, and the
//     step's own time in the agent, beside this disk's fdatasync p50 measured
//     in the same run on the data directory's file system
//   - cancel: DELETE /v1/requests/ID sent → the handler's AbortSignal aborted, p50
//     (needs a supervisor that sends cancel_request)
//   - floor: what bounds a step from Node on this machine — log() through the
//     client, one at a time with an fdatasync probe after each (the pause a
//     step inside a request sees), beside the same loop from an agent with no
//     client code (floor_agent.js, under a second supervisor), each over the
//     fdatasync p50 measured in its loop
// BENCH_FLAGS adds supervisor flags (e.g. "--wal-sync none": the fixed cost
// without the fsync); BENCH_DIR is where the data directory goes.
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const REPO = path.resolve(HERE, "..", "..");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const p50 = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
};
const round = (x, d = 3) => Math.round(x * 10 ** d) / 10 ** d;

let bin = process.env.SUPERVISOR_BIN;
const dir = fs.mkdtempSync(path.join(process.env.BENCH_DIR ?? os.tmpdir(), "node-bench-"));
if (!bin) {
  bin = path.join(dir, "supervisor");
  execFileSync("go", ["build", "-o", bin, "./cmd/supervisor"], { cwd: REPO, stdio: "inherit" });
}
const out = path.join(dir, "out.jsonl");
const logPath = path.join(dir, "supervisor.log");
const logfd = fs.openSync(logPath, "a");
const sup = spawn(
  bin,
  ["run", "--data-dir", path.join(dir, "data"), "--http-addr", "127.0.0.1:0", "--wal-operations", "request_step,request_done",
    ...(process.env.BENCH_FLAGS ? process.env.BENCH_FLAGS.split(" ") : []), "--", process.execPath, path.join(HERE, "bench_agent.js")],
  { env: { ...process.env, BENCH_OUT: out }, stdio: ["ignore", logfd, logfd] },
);
const notes = () => (fs.existsSync(out) ? fs.readFileSync(out, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l)) : []);

async function until(pred, what, timeout = 30000) {
  const end = Date.now() + timeout;
  for (;;) {
    const v = await pred();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}\n${fs.readFileSync(logPath, "utf8").slice(-2000)}`);
    await sleep(10);
  }
}

const result = { node: process.version, date: new Date().toISOString(), cpus: os.cpus().length };
try {
  const addr = await until(() => fs.readFileSync(logPath, "utf8").match(/HTTP listener up.*?addr=(\S+)/)?.[1], "HTTP listener");
  const base = `http://${addr}`;
  await until(async () => (await fetch(`${base}/readyz`).catch(() => null))?.status === 200, "/readyz");
  const post = async (message, context, wait = "30s") => {
    const r = await fetch(`${base}/v1/requests${wait ? `?wait=${wait}` : ""}`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ message, context }),
    });
    return r.json();
  };

  // 1. durable log(), 64 in flight
  const logs = [];
  for (let i = 0; i < 3; i++) logs.push((await post("log", { n: 100000, inflight: 64 }, "120s")).data.per_s);
  result.log_64 = { entries_per_s_runs: logs.map((x) => Math.round(x)), entries_per_s_best: Math.round(Math.max(...logs)), target: 100000 };

  // 2. a step over a plain reply, beside fdatasync p50 on the same file system
  const fsync = [];
  // the probe of the Go benchmarks (test/durable_bench_test.go): 1 KiB into a
  // preallocated file on the same file system, one after each round trip
  const f = fs.openSync(path.join(dir, "data", "fsync-probe"), "w+");
  const block = Buffer.alloc(1024, 1);
  fs.writeSync(f, Buffer.alloc(1024 * 1024));
  fs.fsyncSync(f);
  let off = 0;
  const plain = [];
  const step = [];
  const inAgent = [];
  for (let i = 0; i < 300; i++) {
    let t = performance.now();
    await post("plain");
    plain.push(performance.now() - t);
    t = performance.now();
    const r = await post("step");
    step.push(performance.now() - t);
    inAgent.push(r.data.step_ms);
    t = performance.now();
    fs.writeSync(f, block, 0, block.length, off);
    off = (off + 1024) % (1024 * 1024);
    fs.fdatasyncSync(f);
    fsync.push(performance.now() - t);
  }
  fs.closeSync(f);
  const added = p50(step) - p50(plain);
  result.step = {
    plain_reply_p50_ms: round(p50(plain)),
    step_reply_p50_ms: round(p50(step)),
    added_p50_ms: round(added),
    step_in_agent_p50_ms: round(p50(inAgent)),
    fdatasync_p50_ms: round(p50(fsync)),
    added_over_fdatasync: round(added / p50(fsync), 2),
    step_in_agent_over_fdatasync: round(p50(inAgent) / p50(fsync), 2),
    target: "added <= 1.3 x fdatasync p50",
  };

  // 3. cancellation: DELETE → AbortSignal aborted
  const lat = [];
  let cancelError = null;
  for (let i = 0; i < 50 && cancelError === null; i++) {
    const { request_id: id } = await post("wait", {}, "");
    await until(() => notes().some((n) => n.event === "waiting" && n.id === id), "the handler waiting");
    const t0 = performance.timeOrigin + performance.now();
    const d = await fetch(`${base}/v1/requests/${id}`, { method: "DELETE" });
    if (d.status >= 300) {
      cancelError = `DELETE answered ${d.status}: this supervisor does not cancel requests`;
      break;
    }
    const n = await until(() => notes().find((x) => x.event === "aborted" && x.id === id), "the abort", 5000).catch(() => null);
    if (!n) {
      cancelError = "no cancel_request reached the agent within 5 s";
      break;
    }
    lat.push(n.t - t0);
  }
  result.cancel = cancelError ? { error: cancelError } : { delete_to_abort_p50_ms: round(p50(lat)), n: lat.length, target_ms: 1 };

  // 4. the floor: the client's log() and a client-less agent's, same loop
  const client = (await post("loggap", { n: 2000 }, "120s")).data;
  const floor = await runFloor();
  result.floor = {
    client_log_p50_ms: round(client.log_p50_ms),
    client_log_over_fdatasync: round(client.log_p50_ms / client.fdatasync_p50_ms, 2),
    no_client_log_p50_ms: round(floor.log_p50_ms),
    no_client_log_over_fdatasync: round(floor.log_p50_ms / floor.fdatasync_p50_ms, 2),
    note: "a step is one such round trip: it cannot cost less than the no-client figure",
  };
} finally {
  sup.kill("SIGTERM");
  await new Promise((r) => sup.on("exit", r));
}

// runFloor runs floor_agent.js under a supervisor of its own and returns its figures.
async function runFloor() {
  const fdir = path.join(dir, "floor");
  fs.mkdirSync(fdir);
  const fout = path.join(fdir, "figures.json");
  const flog = fs.openSync(path.join(fdir, "supervisor.log"), "a");
  const fsup = spawn(bin, ["run", "--data-dir", path.join(fdir, "data"), "--http-addr", "127.0.0.1:0",
    ...(process.env.BENCH_FLAGS ? process.env.BENCH_FLAGS.split(" ") : []), "--", process.execPath, path.join(HERE, "floor_agent.js")],
    { env: { ...process.env, FLOOR_OUT: fout, FLOOR_SYNCDIR: fdir }, stdio: ["ignore", flog, flog] });
  try {
    await until(() => fs.existsSync(fout), "the no-client agent's figures", 120000);
    return JSON.parse(fs.readFileSync(fout, "utf8"));
  } finally {
    fsup.kill("SIGTERM");
    await new Promise((r) => fsup.on("exit", r));
  }
}
console.log(JSON.stringify(result, null, 2));
