// The Node client against the real supervisor binary.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";

import { counted, supervisors, tmpDir, waitUntil } from "./harness.js";

test("restore after kill -9 is exact, numbering continues above last_sequence", async (t) => {
  const start = supervisors(t);
  const sup = start({ mode: "exact" });
  const first = await sup.waitEvent("start");
  assert.equal(first.restore, null);
  const cp = await sup.waitEvent("checkpointed");
  assert.match(cp.checkpoint_id, /^[0-9a-f-]{36}$/);
  assert.ok(sup.checkpoints().some((c) => JSON.stringify(c).includes(cp.checkpoint_id)));
  const logged = await sup.waitEvent("logged");
  assert.deepEqual(logged.seqs, [1, 2, 3]);
  process.kill(first.pid, "SIGKILL");
  const second = await sup.waitEvent("start", { count: 2 });
  assert.notEqual(second.pid, first.pid);
  const r = second.restore;
  assert.equal(r.checkpoint_id, cp.checkpoint_id);
  const rich = {
    bin: { bin: "000102ff" },
    big: { bigint: (2n ** 64n - 1n).toString() },
    neg: { bigint: (-(2n ** 63n)).toString() },
    float: 0.1 + 0.2,
    text: "héllo ✓",
    nested: { list: [1, -1, 300, -40000, 70000, 2 ** 40], empty: {} },
  };
  assert.deepEqual(r.snapshot, { rich });
  assert.deepEqual(
    r.wal_entries,
    [0, 1, 2].map((i) => ({ operation: "state_update", params: { i, rich }, sequence: i + 1 })),
  );
  assert.equal(r.last_sequence, 3);
  const after = await sup.waitEvent("logged_after_restore");
  assert.equal(after.seq, 4);
});

for (const transport of ["stdio", "fd"]) {
  test(`requests answered over HTTP (${transport})`, async (t) => {
    const start = supervisors(t);
    const sup = start({ flags: transport === "fd" ? ["--stdio=false"] : [] });
    assert.equal((await sup.waitEvent("start")).transport, transport);
    await sup.waitReady();
    let res = await sup.post("hello", { user_id: "u1", context: { k: 1 } });
    assert.equal(res.status, 200);
    assert.deepEqual(res.body.data, { echo: "hello", user: "u1", ctx: { k: 1 }, attempt: 1 });
    res = await sup.post("fail");
    assert.equal(res.status, 200);
    assert.deepEqual(res.body.error, { code: "TOOL_FAILED", message: "asked to fail" });
  });
}

test("heartbeats keep an idle agent up under a 1 s heartbeat timeout", async (t) => {
  const start = supervisors(t);
  const sup = start({ flags: ["--heartbeat-timeout", "1s"], env: { AGENT_HB_MS: "200" } });
  await sup.waitEvent("ready");
  await sup.waitReady();
  // 3.5 s: three heartbeat timeouts; then a request still reaches the first process
  await new Promise((r) => setTimeout(r, 3500));
  const res = await sup.post("hello");
  assert.equal(res.status, 200);
  assert.equal(sup.events().filter((e) => e.event === "start").length, 1);
  assert.doesNotMatch(sup.logText(), /hung/i);
});

test("shutdown: onShutdown's state is the final checkpoint, the agent exits by itself", async (t) => {
  const start = supervisors(t);
  const dir = tmpDir();
  const sup = start({ dir, mode: "shutdown" });
  await sup.waitEvent("ready");
  const { code } = await sup.stop();
  assert.equal(code, 0);
  await sup.waitEvent("exit");
  const stopped = sup.logText().split("\n").filter((l) => l.includes('msg="agent stopped"'));
  assert.ok(stopped.length > 0 && !stopped.at(-1).includes("killed by signal"), stopped.join("\n"));
  const sup2 = start({ dir, mode: "serve" });
  const r = (await sup2.waitEvent("start", { count: 2 })).restore;
  assert.deepEqual(r.snapshot, { final: true, n: 42, reason: "supervisor is stopping" });
});

test("a checkpoint of 3 MiB round-trips; with fzstd the client speaks v2 and decompresses the restore", async (t) => {
  const start = supervisors(t);
  const sup = start({ mode: "checkpoint", env: { AGENT_SIZE: String(3 << 20) } });
  const first = await sup.waitEvent("start");
  await sup.waitEvent("checkpointed");
  process.kill(first.pid, "SIGKILL");
  const again = await sup.waitEvent("restored_blob");
  // fzstd is a devDependency: the agent speaks version 2, so the supervisor compresses its restore
  assert.deepEqual(again, { event: "restored_blob", ok: true, size: 3 << 20, compressed: true, version: 2 });
});

test("steps: logged durably, rebuilt from the checkpoint and the WAL tail after kill -9, stripped from the user's state", async (t) => {
  const start = supervisors(t);
  const dir = tmpDir();
  const counter = path.join(dir, "llm-calls.txt");
  const sup = start({ dir, env: { STEP_COUNTER: counter } });
  await sup.waitReady();
  const first = await sup.waitEvent("start");
  const { status, body } = await sup.post("steps", { wait: "", context: { n: 3, checkpoint_after: 0, hang_after: 1 } });
  assert.equal(status, 202);
  const rid = body.request_id;
  await sup.waitEvent("hanging", { rid });
  process.kill(first.pid, "SIGKILL");
  const second = await sup.waitEvent("start", { count: 2 });
  // step 0 came back through the checkpoint's __supervisor_steps__, step 1 through the WAL tail
  assert.deepEqual(second.table, {
    [rid]: [
      { index: 0, name: "llm0", result: { i: 0, text: "answer 0" } },
      { index: 1, name: "llm1", result: { i: 1, text: "answer 1" } },
    ],
  });
  assert.deepEqual(second.restore.snapshot, { mine: true }, "the step table is not part of the user's state");
  assert.ok(second.restore.raw_has_steps, "the WAL tail held a request_step entry");
  assert.ok(second.restore.wal_entries.every((e) => e.operation !== "request_step"));
  // steps 0 and 1 ran once (a supervisor that redelivers runs step 2 by now, and only it)
  const lines = counted(counter);
  assert.equal(lines.filter((l) => l === `${rid} 0 1`).length, 1, lines.join("\n"));
  assert.equal(lines.filter((l) => l === `${rid} 1 1`).length, 1, lines.join("\n"));
  assert.ok(lines.every((l) => / [01] 1$/.test(l) || / 2 \d+$/.test(l)), lines.join("\n"));
});

test("a step result over the WAL entry limit fails before anything is logged, naming the limit", async (t) => {
  const start = supervisors(t);
  const sup = start({});
  await sup.waitReady();
  const res = await sup.post("big");
  assert.equal(res.body.error.code, "TOO_LARGE");
  const ev = await sup.waitEvent("big_refused");
  assert.equal(ev.name, "StepResultTooLarge");
  assert.ok(ev.is);
  assert.match(ev.message, /10240 bytes \(10 KiB/);
  assert.match(ev.message, /store big results elsewhere/);
  assert.equal(ev.last, 0, "nothing was numbered or logged");
});

test("request_done: an answered request's steps are gone from the table after a restart", async (t) => {
  const start = supervisors(t);
  const sup = start({});
  await sup.waitReady();
  const first = await sup.waitEvent("start");
  const res = await sup.post("steps", { context: { n: 2 } });
  assert.equal(res.status, 200);
  assert.equal(res.body.data.results.length, 2);
  process.kill(first.pid, "SIGKILL");
  const second = await sup.waitEvent("start", { count: 2 });
  assert.deepEqual(second.table, {});
  assert.ok(second.last_sequence >= 3, "two steps and a request_done were logged");
});

test("redelivery after kill -9: attempt 2 skips the completed steps and answers (needs the supervisor's redelivery)", async (t) => {
  const start = supervisors(t);
  const dir = tmpDir();
  const counter = path.join(dir, "llm-calls.txt");
  const sup = start({ dir, env: { STEP_COUNTER: counter } });
  await sup.waitReady();
  const first = await sup.waitEvent("start");
  const { body } = await sup.post("steps", { wait: "", context: { n: 3, hang_after: 1 } });
  const rid = body.request_id;
  await sup.waitEvent("hanging", { rid });
  process.kill(first.pid, "SIGKILL");
  const again = await sup.waitEvent("delivered", { rid, attempt: 2, timeout: 60000 });
  assert.equal(again.attempt, 2);
  const done = await waitUntil(async () => {
    const r = await sup.get(rid);
    return r.body.status === "answered" ? r.body : null;
  }, 30000, "the answer");
  assert.equal(done.data.attempt, 2);
  assert.deepEqual(done.data.results.map((r) => r.text), ["answer 0", "answer 1", "answer 2"]);
  // one call per step: 0 and 1 by attempt 1, 2 by attempt 2
  assert.deepEqual(counted(counter), [`${rid} 0 1`, `${rid} 1 1`, `${rid} 2 2`]);
});

test("DELETE mid-request aborts req.signal; the steps after it never run (needs the supervisor's cancel_request)", async (t) => {
  const start = supervisors(t);
  const dir = tmpDir();
  const counter = path.join(dir, "llm-calls.txt");
  const sup = start({ dir, env: { STEP_COUNTER: counter } });
  await sup.waitReady();
  const { body } = await sup.post("steps", { wait: "", context: { n: 3, sleep_ms: 60000 } });
  const rid = body.request_id;
  await sup.waitEvent("delivered", { rid });
  await waitUntil(() => counted(counter).length === 1, 10000, "step 0 running");
  const del = await sup.del(rid);
  assert.ok(del.status < 300, `DELETE answered ${del.status}`);
  await sup.waitEvent("aborted", { rid });
  const c = await sup.waitEvent("cancelled", { rid });
  assert.equal(c.completed, 0);
  assert.equal(c.name, "AbortError");
  assert.deepEqual(counted(counter), [`${rid} 0 1`], "steps 1 and 2 never ran");
  assert.equal((await sup.get(rid)).body.status, "cancelled");
});
