// Type-checked by types.test.js against src/index.d.ts (never run).
import { Agent, NotDurable, StepMismatch, StepResultTooLarge, type Request } from "supervisor-agent";

interface Plan {
  steps: string[];
}

const agent = await Agent.connect({ heartbeatInterval: 500, onShutdown: async (m) => ({ reason: String(m.reason) }) });
agent.on("hot_reload", (m) => console.error(m.type));
agent.on("supervisor_error", (e) => console.error(e.code, e.details));
if (agent.restore?.checkpointId) console.error(agent.restore.snapshot, agent.restore.walEntries.length);

async function handle(req: Request): Promise<void> {
  try {
    const plan: Plan = await req.step("plan", async (signal) => {
      const r = await fetch("http://127.0.0.1:1/", { signal }).catch(() => null);
      return { steps: [String(r?.status)] };
    });
    const seq: number = await agent.log("memory_add", { content: plan.steps.join(",") });
    await req.reply({ seq, attempt: req.attempt, cancelled: req.signal.aborted });
  } catch (e) {
    if (e instanceof StepMismatch || e instanceof StepResultTooLarge || e instanceof NotDurable) {
      await req.fail(e.name, e.message);
    }
  }
}

for await (const req of agent.requests()) void handle(req);
const id: string = await agent.checkpoint({ n: 1 });
console.error(id, agent.lastSequence, agent.stepTable());
agent.close();
