// `npm install` of the packed package into a fresh project, then an agent
// of that project runs under the real supervisor.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";

import { NODE_DIR, supervisors, tmpDir } from "./harness.js";

test("npm install of the packed package into a fresh project; its agent answers under the supervisor", async (t) => {
  const dir = tmpDir("node-install-");
  const npm = (args, cwd) => execFileSync("npm", args, { cwd, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
  const packed = JSON.parse(npm(["pack", "--json", "--pack-destination", dir], NODE_DIR))[0];
  const files = packed.files.map((f) => f.path);
  assert.ok(files.includes("src/index.js") && files.includes("src/index.d.ts"), files.join(" "));
  assert.ok(!files.some((f) => f.startsWith("test/")), "tests are not shipped");
  const project = path.join(dir, "project");
  fs.mkdirSync(project);
  fs.writeFileSync(path.join(project, "package.json"), JSON.stringify({ name: "my-agent", private: true, type: "module" }));
  npm(["install", "--no-audit", "--no-fund", "--prefer-offline", path.join(dir, packed.filename)], project);
  const installed = JSON.parse(fs.readFileSync(path.join(project, "node_modules", "supervisor-agent", "package.json"), "utf8"));
  assert.equal(installed.name, "supervisor-agent");
  assert.ok(fs.existsSync(path.join(project, "node_modules", "@msgpack", "msgpack")), "the runtime dependency came along");
  fs.writeFileSync(
    path.join(project, "agent.js"),
    `import fs from "node:fs";
import { Agent } from "supervisor-agent";
const agent = await Agent.connect();
fs.appendFileSync(process.env.AGENT_REPORT, JSON.stringify({ event: "start", pid: process.pid }) + "\\n");
for await (const req of agent.requests()) {
  const n = await req.step("count", async () => req.message.length);
  const seq = await agent.log("memory_add", { content: req.message });
  await req.reply({ from: "installed package", n, seq });
}
agent.close();
`,
  );
  const start = supervisors(t);
  const sup = start({ dir, command: [process.execPath, path.join(project, "agent.js")] });
  await sup.waitEvent("start");
  await sup.waitReady();
  const res = await sup.post("hello");
  assert.equal(res.status, 200, JSON.stringify(res.body));
  assert.deepEqual(res.body.data, { from: "installed package", n: 5, seq: 2 });
});
