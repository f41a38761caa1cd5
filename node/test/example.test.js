// The example agent (examples/llm_agent.js) under the real supervisor: a
// kill -9 mid-request does not repeat completed LLM calls, a DELETE mid-way
// stops the remaining ones. Both need the supervisor's redelivery
// (process_request again with attempt after a restart) and cancel_request.
import assert from "node:assert/strict";
import path from "node:path";
import { test } from "node:test";

import { NODE_DIR, counted, supervisors, tmpDir, waitUntil } from "./harness.js";

const EXAMPLE = path.join(NODE_DIR, "examples", "llm_agent.js");

function agentPids(sup) {
  return [...sup.logText().matchAll(/msg="agent started" pid=(\d+)/g)].map((m) => Number(m[1]));
}

const stepDone = (sup, id, step) => sup.logText().includes(`request ${id} attempt 1: step ${step} done`);

test("example: kill -9 mid-request, the request is redelivered and completed LLM calls are not made again", async (t) => {
  const start = supervisors(t);
  const dir = tmpDir();
  const calls = path.join(dir, "llm-calls.txt");
  const sup = start({ dir, agent: EXAMPLE, env: { LLM_CALLS: calls, LLM_SLEEP_MS: "300" } });
  await sup.waitReady();
  const { status, body } = await sup.post("why is the sky blue?", { wait: "" });
  assert.equal(status, 202);
  const id = body.request_id;
  await waitUntil(() => stepDone(sup, id, "draft"), 30000, "step draft done");
  const pid = agentPids(sup).at(-1);
  process.kill(pid, "SIGKILL");
  const done = await waitUntil(async () => {
    const r = await sup.get(id);
    return r.body.status !== "pending" ? r.body : null;
  }, 60000, "the request answered after the restart");
  assert.equal(done.status, "answered", JSON.stringify(done));
  assert.ok(done.data.attempt >= 2, `answered by a redelivery: ${JSON.stringify(done.data)}`);
  assert.match(done.data.answer, /^<answer: Polish <draft: Write a draft following <plan: /);
  const steps = counted(calls).filter((l) => l.startsWith(id)).map((l) => l.split(" ")[1]);
  const times = (s) => steps.filter((x) => x === s).length;
  // plan and draft were durable before the kill: never called again
  assert.equal(times("plan"), 1, steps.join(" "));
  assert.equal(times("draft"), 1, steps.join(" "));
  // answer was running (or not yet started) when the agent died: it runs again on redelivery
  assert.ok(times("answer") >= 1 && times("answer") <= 2, steps.join(" "));
  assert.ok(agentPids(sup).length >= 2);
});

test("example: DELETE mid-request aborts the running LLM call and the remaining steps never run", async (t) => {
  const start = supervisors(t);
  const dir = tmpDir();
  const calls = path.join(dir, "llm-calls.txt");
  const sup = start({ dir, agent: EXAMPLE, env: { LLM_CALLS: calls, LLM_SLEEP_MS: "1500" } });
  await sup.waitReady();
  const { body } = await sup.post("a long question", { wait: "" });
  const id = body.request_id;
  await waitUntil(() => stepDone(sup, id, "plan"), 30000, "step plan done");
  const del = await sup.del(id);
  assert.ok(del.status < 300, `DELETE answered ${del.status} ${JSON.stringify(del.body)}`);
  await waitUntil(() => sup.logText().includes(`request ${id}: cancelled, remaining steps skipped`), 30000, "the agent saw the cancellation");
  const r = await sup.get(id);
  assert.equal(r.body.status, "cancelled");
  // the handler has returned (it logged the cancellation): no step runs after that
  const steps = counted(calls).filter((l) => l.startsWith(id)).map((l) => l.split(" ")[1]);
  assert.deepEqual(steps, ["plan", "draft"], "draft was running when cancelled; answer never started");
  assert.ok(!stepDone(sup, id, "draft"), "the draft call did not complete");
});
