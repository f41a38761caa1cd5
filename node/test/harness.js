// Runs the real supervisor binary around Node agents for node --test.
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const HERE = path.dirname(fileURLToPath(import.meta.url));
export const NODE_DIR = path.resolve(HERE, "..");
export const REPO = path.resolve(NODE_DIR, "..");
export const E2E_AGENT = path.join(HERE, "agents", "e2e_agent.js");

let bin = null;

/** The supervisor binary: $SUPERVISOR_BIN, or built once per test file from this repository. */
export function supervisorBin() {
  if (bin) return bin;
  if (process.env.SUPERVISOR_BIN) {
    bin = process.env.SUPERVISOR_BIN;
    return bin;
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "node-sup-bin-"));
  bin = path.join(dir, "supervisor");
  execFileSync("go", ["build", "-o", bin, "./cmd/supervisor"], { cwd: REPO, stdio: "inherit" });
  return bin;
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Polls pred until it returns a truthy value; throws after timeout ms. */
export async function waitUntil(pred, timeout = 20000, what = "condition") {
  const deadline = Date.now() + timeout;
  for (;;) {
    const v = await pred();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await sleep(20);
  }
}

export function tmpDir(prefix = "node-sup-") {
  return fs.mkdtempSync(path.join(os.tmpdir(), prefix));
}

/** The step flags every test passes: a supervisor that does not know the step operations accepts them this way. */
export const STEP_FLAGS = ["--wal-operations", "request_step,request_done"];

export class Supervisor {
  constructor({ dir, agent = E2E_AGENT, mode = "serve", flags = [], env = {}, command = null }) {
    this.dir = dir ?? tmpDir();
    this.dataDir = path.join(this.dir, "data");
    this.report = path.join(this.dir, "report.jsonl");
    this.logPath = path.join(this.dir, "supervisor.log");
    this.agent = agent;
    this.mode = mode;
    this.flags = flags;
    this.env = env;
    this.command = command;
    this.proc = null;
    this.exited = null;
  }

  start() {
    const logfd = fs.openSync(this.logPath, "a");
    const cmd = this.command ?? [process.execPath, this.agent];
    this.proc = spawn(
      supervisorBin(),
      ["run", "--data-dir", this.dataDir, "--http-addr", "127.0.0.1:0", ...STEP_FLAGS, ...this.flags, "--", ...cmd],
      {
        env: { ...process.env, AGENT_REPORT: this.report, AGENT_MODE: this.mode, ...this.env },
        stdio: ["ignore", logfd, logfd],
      },
    );
    fs.closeSync(logfd);
    this.exited = new Promise((resolve) => this.proc.on("exit", (code, signal) => resolve({ code, signal })));
    return this;
  }

  events() {
    let text;
    try {
      text = fs.readFileSync(this.report, "utf8");
    } catch {
      return [];
    }
    // a line without its newline is still being written
    return text
      .split("\n")
      .slice(0, -1)
      .filter(Boolean)
      .map((l) => JSON.parse(l));
  }

  async waitEvent(name, { count = 1, timeout = 30000, ...match } = {}) {
    const find = () => {
      const evs = this.events().filter((e) => e.event === name && Object.entries(match).every(([k, v]) => e[k] === v));
      return evs.length >= count ? evs[count - 1] : null;
    };
    try {
      return await waitUntil(find, timeout, `agent event ${name} #${count}`);
    } catch (e) {
      throw new Error(
        `no event ${name} #${count} ${JSON.stringify(match)}; events: ${JSON.stringify(this.events()).slice(-3000)}\nlog tail:\n${this.logText().slice(-3000)}`,
      );
    }
  }

  logText() {
    try {
      return fs.readFileSync(this.logPath, "utf8");
    } catch {
      return "";
    }
  }

  async httpAddr() {
    return waitUntil(() => {
      const m = [...this.logText().matchAll(/HTTP listener up.*?addr=(\S+)/g)];
      return m.length ? m[m.length - 1][1] : null;
    }, 20000, "HTTP listener up");
  }

  async waitReady(timeout = 30000) {
    const addr = await this.httpAddr();
    await waitUntil(async () => {
      try {
        const r = await fetch(`http://${addr}/readyz`);
        return r.status === 200;
      } catch {
        return false;
      }
    }, timeout, "/readyz 200");
  }

  async post(message, { wait = "10s", context, user_id, headers = {} } = {}) {
    const addr = await this.httpAddr();
    const q = wait ? `?wait=${wait}` : "";
    const r = await fetch(`http://${addr}/v1/requests${q}`, {
      method: "POST",
      headers: { "Content-Type": "application/json", ...headers },
      body: JSON.stringify({ message, context, user_id }),
    });
    return { status: r.status, body: await r.json() };
  }

  async get(id) {
    const addr = await this.httpAddr();
    const r = await fetch(`http://${addr}/v1/requests/${id}`);
    return { status: r.status, body: await r.json() };
  }

  async del(id) {
    const addr = await this.httpAddr();
    const r = await fetch(`http://${addr}/v1/requests/${id}`, { method: "DELETE" });
    let body = null;
    try {
      body = await r.json();
    } catch {
      body = null;
    }
    return { status: r.status, body };
  }

  checkpoints() {
    const out = execFileSync(supervisorBin(), ["checkpoints", "list", "--data-dir", this.dataDir, "--json"], {
      encoding: "utf8",
    });
    return JSON.parse(out);
  }

  async stop(timeout = 30000) {
    if (!this.proc || this.proc.exitCode !== null || this.proc.signalCode !== null) return this.exited ? this.exited : null;
    this.proc.kill("SIGTERM");
    const t = setTimeout(() => this.proc.kill("SIGKILL"), timeout);
    const r = await this.exited;
    clearTimeout(t);
    return r;
  }
}

/** Starts supervisors for one test and stops them all after it. */
export function supervisors(t) {
  const started = [];
  t.after(async () => {
    for (const s of started) await s.stop().catch(() => {});
  });
  return (opts) => {
    const s = new Supervisor(opts).start();
    started.push(s);
    return s;
  };
}

/** Lines of a counter file (one line per call of the fake LLM). */
export function counted(file) {
  try {
    return fs.readFileSync(file, "utf8").split("\n").filter(Boolean);
  } catch {
    return [];
  }
}
