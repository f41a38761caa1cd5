#!/usr/bin/env node
// An agent that answers each request by calling an LLM three times, each
// call a durable step: kill -9 it mid-request and, when the supervisor
// delivers the request again, the calls that completed are not made again;
// cancel the request (DELETE /v1/requests/ID) and the remaining calls never
// run. Run it with:
//
//   supervisor run --data-dir /tmp/llm-data -- node node/examples/llm_agent.js
//
// The LLM here is a fake that needs no network: it sleeps LLM_SLEEP_MS
// (default 2000) and appends one line per call to LLM_CALLS (default
// /tmp/fake-llm-calls.txt, outside the data directory) so you can count the
// calls. Its answer is deterministic.
import fs from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";

import { Agent } from "supervisor-agent";

const CALLS = process.env.LLM_CALLS ?? "/tmp/fake-llm-calls.txt";
const SLEEP_MS = Number(process.env.LLM_SLEEP_MS ?? 2000);

async function llm(prompt, { signal, requestId, step }) {
  // A real call passes the same signal, so a cancelled request stops the
  // HTTP request too, and an idempotency key made of the request id and the
  // step (a step that was running when the agent died runs again):
  //
  //   import OpenAI from "openai";
  //   const openai = new OpenAI();
  //   const r = await openai.chat.completions.create(
  //     { model: "gpt-4o-mini", messages: [{ role: "user", content: prompt }] },
  //     { signal, headers: { "Idempotency-Key": `${requestId}-${step}` } },
  //   );
  //   return r.choices[0].message.content;
  fs.appendFileSync(CALLS, `${requestId} ${step}\n`);
  await sleep(SLEEP_MS, undefined, { signal }); // rejects with AbortError on cancel
  return `<${step}: ${prompt.slice(0, 60)}>`;
}

const agent = await Agent.connect();
console.error(`llm agent up (pid ${process.pid}); restored ${Object.keys(agent.stepTable()).length} unfinished request(s) with logged steps`);

async function handle(req) {
  const id = req.requestId;
  const call = async (step, prompt) => {
    const text = await req.step(step, (signal) => llm(prompt, { signal, requestId: id, step }));
    // here the step's result is durable: a crash from now on never calls the LLM again for it
    console.error(`request ${id} attempt ${req.attempt}: step ${step} done`);
    return text;
  };
  try {
    const plan = await call("plan", `Plan an answer to: ${req.message}`);
    const draft = await call("draft", `Write a draft following ${plan}`);
    const answer = await call("answer", `Polish ${draft}`);
    await req.reply({ answer, attempt: req.attempt });
  } catch (e) {
    if (req.signal.aborted) {
      console.error(`request ${id}: cancelled, remaining steps skipped`);
      await req.fail("CANCELLED", "the request was cancelled");
    } else {
      console.error(`request ${id}: ${e.message}`);
      await req.fail("AGENT_ERROR", e.message);
    }
  }
}

for await (const req of agent.requests()) {
  handle(req); // not awaited: requests run concurrently
}
agent.close();
