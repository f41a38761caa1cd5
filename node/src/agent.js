// The Agent: one connection to the supervisor over two pipes.
import { EventEmitter } from "node:events";
import fs from "node:fs";
import net from "node:net";

import { Encoder } from "@msgpack/msgpack";

import {
  CheckpointFailed,
  Disconnected,
  InvalidMessage,
  NotDurable,
  NotUnderSupervisor,
  ProtocolError,
  StepMismatch,
  StepResultTooLarge,
  SupervisorError,
  fromErrorMessage,
} from "./errors.js";
import { DEFAULT_MAX_FRAME, FrameReader, decodePayload, decodeValue, encodeFrame, encodeFrameOnce, encodeValue, frameOf } from "./framing.js";
import { compress, decompress, loadZstd, zstdInfo } from "./zstd.js";

/** The checkpoint key under which the client keeps its table of steps. */
export const STEPS_KEY = "__supervisor_steps__";
/** The size limit of one WAL entry, the supervisor's (SPEC §2; no flag changes it): 10 KiB. */
export const DEFAULT_WAL_ENTRY_LIMIT = 10 * 1024;
const RESULT_LIMIT = 1024 * 1024;
const COMPRESS_OVER = 1024 * 1024;
const MAX_DECOMPRESSED = 100 * 1024 * 1024;
// The largest frame the supervisor reads from an agent: a checkpoint, 100 MiB of data plus a 16 KiB
// envelope (SPEC §2; no flag changes it). A bigger frame is skipped unread and answered INVALID_MESSAGE
// without a type: no reply the client could tie to its checkpoint, so the next ack would be taken for it.
const CHECKPOINT_FRAME_LIMIT = 100 * 1024 * 1024 + 16 * 1024;
const STEP_OPS = new Set(["request_step", "request_done"]);

const isMap = (v) => v !== null && typeof v === "object" && !Array.isArray(v) && !(v instanceof Uint8Array);

/** v as a whole number, or null (a reply of the wrong shape never kills the reader). */
function toInt(v) {
  if (typeof v === "number" && Number.isInteger(v)) return v;
  if (typeof v === "bigint") {
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) {
      throw new SupervisorError(
        `sequence ${v} is beyond 2^53: this client numbers entries with JavaScript numbers; number them below 2^53`,
      );
    }
    return Number(v);
  }
  return null;
}

const now = () => Math.floor(Date.now() / 1000);
const WROTE = Promise.resolve();

/** What the supervisor restored: the state to start from. */
export class Restore {
  constructor(checkpointId, snapshot, walEntries, lastSequence, compressed, raw) {
    /** The checkpoint restored, or "" when only WAL entries follow. */
    this.checkpointId = checkpointId;
    /** The checkpoint's data (without the client's step table). */
    this.snapshot = snapshot;
    /** The logged entries after the checkpoint, in order, without the client's own step entries. */
    this.walEntries = walEntries;
    /** The WAL's last sequence: the client numbers new entries above it. */
    this.lastSequence = lastSequence;
    /** The snapshot arrived zstd-compressed (v2). */
    this.compressed = compressed;
    /** The restore message as it arrived (snapshot decompressed). */
    this.raw = raw;
  }
}

/** One delivery of a user request (process_request). */
export class Request {
  constructor(agent, msg) {
    const d = isMap(msg.data) ? msg.data : {};
    /** The request's id (a UUID). */
    this.requestId = String(msg.request_id ?? "");
    /** The user's message. */
    this.message = typeof d.message === "string" ? d.message : String(d.message ?? "");
    /** The request's context map ({} when absent). */
    this.context = isMap(d.context) ? d.context : {};
    /** The user id ("" when absent). */
    this.userId = typeof d.user_id === "string" ? d.user_id : "";
    const a = typeof msg.attempt === "number" || typeof msg.attempt === "bigint" ? Number(msg.attempt) : 1;
    /** 1 on first delivery; higher when delivered again after the agent restarted. */
    this.attempt = Number.isInteger(a) && a >= 1 ? a : 1;
    /** The process_request message as it arrived. */
    this.raw = msg;
    this.answered = false;
    this._agent = agent;
    this._controller = new AbortController();
    this._nextIndex = 0;
  }

  /** Aborted when a caller cancels the request (cancel_request) or the connection ends. Pass it on to fetch and SDKs. */
  get signal() {
    return this._controller.signal;
  }

  /** True once the request was cancelled. */
  get cancelled() {
    return this._controller.signal.aborted;
  }

  /** Run fn once for this request: its result is logged durably before step() returns; on redelivery the logged result is returned without calling fn. */
  step(name, fn) {
    return this._agent._step(this, name, fn);
  }

  /** Answer the request with data (a map). */
  reply(data) {
    return this._agent._answer(this, { data });
  }

  /** Answer the request with an error. */
  fail(code, message) {
    return this._agent._answer(this, { error: { code: String(code), message: String(message) } });
  }
}

function openRead(fd) {
  const st = fs.fstatSync(fd);
  if (st.isFIFO() || st.isSocket()) {
    if (fd === 0) return process.stdin;
    return new net.Socket({ fd, readable: true, writable: false });
  }
  return fs.createReadStream(null, { fd, autoClose: false, highWaterMark: 1 << 20 });
}

function openWrite(fd) {
  const st = fs.fstatSync(fd);
  if (st.isFIFO()) {
    // Our own file description of the pipe: process.stdout (if anything
    // touches it) makes its description blocking, which must not make our
    // writes block the event loop.
    let own = fd;
    try {
      own = fs.openSync(`/proc/self/fd/${fd}`, "w");
    } catch {
      own = fd;
    }
    return new net.Socket({ fd: own, readable: false, writable: true });
  }
  if (st.isSocket()) return new net.Socket({ fd, readable: false, writable: true });
  return fs.createWriteStream(null, { fd, autoClose: false });
}

/**
 * A connection to the supervisor. Use `await Agent.connect()` in a real
 * agent; `Agent.open(readable, writable, options)` connects to any pair of
 * streams (tests, in-process fakes).
 */
export class Agent extends EventEmitter {
  constructor(readable, writable, opts = {}) {
    super();
    this.role = opts.role ?? "primary";
    this.version = opts.version ?? 2;
    if (this.version >= 2 && !zstdInfo().canDecompress) this.version = 1;
    this.maxFrame = opts.maxFrame ?? DEFAULT_MAX_FRAME;
    this.walEntryLimit = opts.walEntryLimit ?? DEFAULT_WAL_ENTRY_LIMIT;
    this.heartbeatInterval = opts.heartbeatInterval ?? 1000;
    this.onShutdown = opts.onShutdown ?? null;
    /** @type {Restore|null} */
    this.restore = null;
    /** The shutdown message, once one arrived. */
    this.shutdownMessage = null;
    this.closed = false;
    this.closeReason = null;
    this._r = readable;
    this._w = writable;
    this._reader = new FrameReader(this.maxFrame);
    this._seq = 0;
    this._durable = 0;
    this._ackWaiters = []; // {first, last, resolve, reject, done}, in send order
    this._ackHead = 0;
    this._cpWaiters = [];
    this._steps = new Map(); // request id -> Map(index -> {name, result})
    this._inflight = new Map(); // request id -> Request
    this._queue = [];
    this._pullers = [];
    this._requestsEnded = false;
    this._drain = null;
    this._corked = false;
    this._hb = null;
    this._restoreWait = null;

    this._onData = (chunk) => {
      let payloads;
      try {
        payloads = this._reader.push(chunk);
        for (const p of payloads) this._dispatch(decodePayload(p));
      } catch (e) {
        // Listeners cannot get here (_emit reports what they throw): this is the stream itself.
        this._close(e instanceof SupervisorError ? e : new ProtocolError(`reader failed: ${e && e.message}`));
      }
    };
    this._onEnd = () => {
      try {
        this._reader.end();
        this._close(new Disconnected("the supervisor closed the pipe"));
      } catch (e) {
        this._close(e);
      }
    };
    this._onReadError = (e) => this._close(new Disconnected(`cannot read from the supervisor: ${e.message}`));
    this._onWriteError = (e) => this._close(new Disconnected(`cannot write to the supervisor: ${e.message}`));
    readable.on("data", this._onData);
    readable.on("end", this._onEnd);
    readable.on("error", this._onReadError);
    writable.on("error", this._onWriteError);
  }

  /** Connect using the supervisor's environment contract; refuse without one. */
  static async connect(opts = {}) {
    const env = process.env;
    const hint = `Run it as: supervisor run -- node ${process.argv[1] ?? "agent.js"}`;
    if (!("SUPERVISOR_PROTOCOL_VERSION" in env)) {
      throw new NotUnderSupervisor(
        `This program is an agent meant to be started by the supervisor (SUPERVISOR_PROTOCOL_VERSION is not set). ${hint}`,
      );
    }
    const transport = env.SUPERVISOR_TRANSPORT ?? "stdio";
    let r;
    let w;
    if (transport === "fd") {
      r = openRead(3);
      w = openWrite(4);
    } else if (transport === "stdio") {
      if (process.stdin.isTTY) {
        throw new NotUnderSupervisor(`stdin is a terminal: this agent must be started by the supervisor. ${hint}`);
      }
      r = openRead(0);
      w = openWrite(1);
      // console.log must never write into the frame stream: stdout is ours now.
      process.stdout.write = process.stderr.write.bind(process.stderr);
    } else {
      throw new NotUnderSupervisor(`unknown SUPERVISOR_TRANSPORT ${JSON.stringify(transport)}`);
    }
    const peer = Number.parseInt(env.SUPERVISOR_PROTOCOL_VERSION, 10) || 1;
    await loadZstd();
    return Agent.open(r, w, {
      ...opts,
      version: Math.min(opts.version ?? 2, peer),
      role: env.SUPERVISOR_ROLE ?? "primary",
      restorePending: env.SUPERVISOR_RESTORE_PENDING === "1",
    });
  }

  /** Connect over a pair of streams; waits for the pending restore when restorePending is set. */
  static async open(readable, writable, opts = {}) {
    await loadZstd();
    const agent = new Agent(readable, writable, opts);
    if (opts.restorePending) {
      await new Promise((resolve, reject) => {
        agent._restoreWait = { resolve, reject };
      });
    }
    agent._startHeartbeats();
    return agent;
  }

  // ---------- sending ----------

  /** Write one frame now (frames reach the pipe in call order); resolves once the pipe has room again. */
  _writeFrame(frame) {
    if (this.closed) return Promise.reject(new Disconnected(`the supervisor is gone: ${this.closeReason?.message ?? "closed"}`));
    const w = this._w;
    if (!this._corked && typeof w.cork === "function") {
      // Frames written in one tick go out in one system call.
      this._corked = true;
      w.cork();
      process.nextTick(() => {
        this._corked = false;
        w.uncork();
      });
    }
    const ok = w.write(frame);
    if (ok && this._drain === null) return WROTE;
    if (this._drain === null) {
      this._drain = new Promise((resolve) => {
        const done = () => {
          w.off("drain", done);
          w.off("close", done);
          this._drain = null;
          resolve();
        };
        w.on("drain", done);
        w.on("close", done);
      });
    }
    return this._drain;
  }

  _stamp(msg) {
    if (msg.timestamp === undefined) msg.timestamp = now();
    if (this.version >= 2 && msg.version === undefined) msg.version = this.version;
    return msg;
  }

  /** Send any message as is (timestamp and version added). For tests and extensions. */
  send(msg) {
    return this._writeFrame(encodeFrame(this._stamp(msg)));
  }

  /** Send one heartbeat (the client sends them by itself every second). */
  heartbeat() {
    return this.send({ type: "heartbeat", accepts: ["cancel_request"] });
  }

  /** Report metrics: a map of numbers. */
  metrics(values) {
    return this.send({ type: "metrics", data: values });
  }

  /** Report an error of the agent's. */
  reportError(code, message, context) {
    const error = { code, message };
    if (context) error.context = context;
    return this.send({ type: "error", error });
  }

  /** Ask the supervisor to trial a change of code (an evolution_intent). */
  evolutionIntent({ target, newCode, reason = "", expectedImprovement }) {
    const hypothesis = { reason, target, new_code: newCode };
    if (expectedImprovement) hypothesis.expected_improvement = expectedImprovement;
    return this.send({ type: "evolution_intent", hypothesis });
  }

  _startHeartbeats() {
    if (this.heartbeatInterval <= 0 || this.closed) return;
    this.heartbeat().catch(() => {});
    this._hb = setInterval(() => {
      if (!this.closed) this.heartbeat().catch(() => {});
    }, this.heartbeatInterval);
    this._hb.unref();
  }

  // ---------- WAL ----------

  /** The highest sequence this client has numbered (or restored). */
  get lastSequence() {
    return this._seq;
  }

  /** The highest sequence the supervisor has acknowledged as durable. */
  get durableSequence() {
    return this._durable;
  }

  _waitAck(first, last) {
    return new Promise((resolve, reject) => {
      this._ackWaiters.push({ first, last, resolve, reject, done: false });
    });
  }

  _sendEntry(frame, first, last) {
    const p = this._waitAck(first, last);
    const wrote = this._writeFrame(frame);
    // Back-pressure: with the pipe full, the caller also waits for it to drain.
    return wrote === WROTE ? p : Promise.all([p, wrote]).then(() => last);
  }

  /**
   * Log one entry (ack: true); resolves with its sequence once it is durable. Rejects with WalFull, WalFailed,
   * SequenceConflict, InvalidMessage or NotDurable. An entry over walEntryLimit rejects with InvalidMessage at once
   * and is not sent: the supervisor's refusal of it names no sequence, so it would fail every entry in flight.
   */
  log(operation, params = {}) {
    if (this.closed) return Promise.reject(new NotDurable(`connection ended: ${this.closeReason?.message}`));
    const seq = this._seq + 1;
    const frame = encodeFrame(this._stamp({ type: "wal_entry", ack: true, data: { operation, params, sequence: seq } }));
    if (frame.length - 4 > this.walEntryLimit) {
      const size = frame.length - 4;
      return Promise.reject(
        new InvalidMessage(
          `INVALID_MESSAGE: wal_entry (${JSON.stringify(operation)}) of ${size} bytes is over the supervisor's wal_entry limit of ${this.walEntryLimit} bytes (10 KiB by default): nothing was sent. Log a key to data stored elsewhere.`,
          { type: "wal_entry", field: "", rule: "too_large", size, limit: this.walEntryLimit },
          "INVALID_MESSAGE",
        ),
      );
    }
    this._seq = seq;
    return this._sendEntry(frame, seq, seq);
  }

  /** Log 1 to 100 entries ([operation, params] pairs) as one unit; resolves with the last sequence once durable. */
  logBatch(entries) {
    if (!Array.isArray(entries) || entries.length < 1 || entries.length > 100) {
      return Promise.reject(new RangeError("a batch holds 1 to 100 entries"));
    }
    if (this.closed) return Promise.reject(new NotDurable(`connection ended: ${this.closeReason?.message}`));
    const first = this._seq + 1;
    const data = entries.map(([operation, params], i) => ({ operation, params: params ?? {}, sequence: first + i }));
    const frame = encodeFrame(this._stamp({ type: "wal_batch", ack: true, data }));
    if (frame.length - 4 > this.walEntryLimit) {
      // The supervisor checks every entry of a batch against the wal_entry limit, and its refusal names no
      // sequence: sent, an oversized entry would fail every entry in flight beside the batch, as in log().
      for (const e of data) {
        const size = encodeValue(e).length;
        if (size > this.walEntryLimit) {
          return Promise.reject(
            new InvalidMessage(
              `INVALID_MESSAGE: wal_batch entry (${JSON.stringify(e.operation)}) of ${size} bytes is over the supervisor's wal_entry limit of ${this.walEntryLimit} bytes (10 KiB by default): nothing was sent. Log a key to data stored elsewhere.`,
              { type: "wal_batch", field: "", rule: "too_large", size, limit: this.walEntryLimit },
              "INVALID_MESSAGE",
            ),
          );
        }
      }
    }
    this._seq = first + entries.length - 1;
    return this._sendEntry(frame, first, this._seq);
  }

  /** Send an entry without ack: true (the supervisor still logs it; nothing to wait for). Returns its sequence. */
  logNoAck(operation, params = {}) {
    if (this.closed) throw new Disconnected(`the supervisor is gone: ${this.closeReason?.message}`);
    const seq = ++this._seq;
    this.send({ type: "wal_entry", data: { operation, params, sequence: seq } }).catch(() => {});
    return seq;
  }

  _ack(s) {
    if (s > this._durable) this._durable = s;
    const ws = this._ackWaiters;
    let i = this._ackHead;
    while (i < ws.length && (ws[i].done || ws[i].last <= this._durable)) {
      const w = ws[i];
      if (!w.done) {
        w.done = true;
        w.resolve(w.last);
      }
      i++;
    }
    this._compactWaiters(i);
  }

  _compactWaiters(head) {
    if (head >= this._ackWaiters.length) {
      this._ackWaiters = [];
      this._ackHead = 0;
    } else if (head > 1024 && head * 2 > this._ackWaiters.length) {
      this._ackWaiters = this._ackWaiters.slice(head);
      this._ackHead = 0;
    } else {
      this._ackHead = head;
    }
  }

  _walError(first, last, err) {
    for (let i = this._ackHead; i < this._ackWaiters.length; i++) {
      const w = this._ackWaiters[i];
      if (!w.done && w.first <= last && first <= w.last) {
        w.done = true;
        w.reject(err);
      }
    }
    let head = this._ackHead;
    while (head < this._ackWaiters.length && this._ackWaiters[head].done) head++;
    this._compactWaiters(head);
  }

  // ---------- checkpoints ----------

  /** Store the whole state; resolves with the checkpoint id once acknowledged. The client adds its step table. */
  checkpoint(state) {
    if (this.closed) return Promise.reject(new NotDurable(`connection ended: ${this.closeReason?.message}`));
    const data = this._withSteps(state);
    const msg = { type: "checkpoint" };
    let body = null;
    if (this.version >= 2 && zstdInfo().canCompress) {
      const enc = new Encoder({ useBigInt64: true, ignoreUndefined: true }).encode(data);
      if (enc.length > COMPRESS_OVER) body = compress(enc);
    }
    if (body !== null) {
      msg.compressed = true;
      msg.compression = "zstd";
      msg.data = body;
    } else {
      msg.data = data;
    }
    const frame = encodeFrameOnce(this._stamp(msg));
    if (frame.length - 4 > CHECKPOINT_FRAME_LIMIT) {
      const size = frame.length - 4;
      return Promise.reject(
        new InvalidMessage(
          `INVALID_MESSAGE: checkpoint of ${size} bytes${body !== null ? " (compressed)" : ""} is over the supervisor's largest frame of ${CHECKPOINT_FRAME_LIMIT} bytes (100 MiB of data): nothing was sent`,
          { type: "checkpoint", field: "data", rule: "too_large", size, limit: CHECKPOINT_FRAME_LIMIT },
          "INVALID_MESSAGE",
        ),
      );
    }
    const p = new Promise((resolve, reject) => this._cpWaiters.push({ resolve, reject }));
    this._writeFrame(frame).catch(() => {});
    return p;
  }

  _withSteps(state) {
    if (!isMap(state)) throw new TypeError("a checkpoint's state is a map (a plain object)");
    if (this._steps.size === 0) {
      if (!(STEPS_KEY in state)) return state;
      const { [STEPS_KEY]: _omit, ...rest } = state;
      return rest;
    }
    return { ...state, [STEPS_KEY]: this.stepTable() };
  }

  /** The table of logged steps of requests not yet answered: {requestId: [{index, name, result}]}. */
  stepTable() {
    const out = {};
    for (const [rid, steps] of this._steps) {
      out[rid] = [...steps].map(([index, s]) => ({ index, name: s.name, result: s.result }));
    }
    return out;
  }

  // ---------- steps and answers ----------

  async _step(req, name, fn) {
    const rid = req.requestId;
    const index = req._nextIndex++;
    const done = this._steps.get(rid)?.get(index);
    if (done !== undefined) {
      if (done.name !== name) {
        throw new StepMismatch(
          `step ${index} of request ${rid} was logged as ${JSON.stringify(done.name)} but the handler now calls ${JSON.stringify(name)}: ` +
            "a handler must call its steps in the same order on every delivery; fail the request",
          { request_id: rid, index, logged: done.name, called: name },
        );
      }
      if (done.pending) await done.pending;
      return done.result;
    }
    req.signal.throwIfAborted();
    const result = await fn(req.signal);
    if (req.signal.aborted) {
      // Cancelled while fn ran: the request is over and never delivered
      // again, so the result is not logged (its steps are gone).
      this._dropSteps(rid);
      req.signal.throwIfAborted();
    }
    if (this.closed) throw new NotDurable(`connection ended before step ${index} (${name}) was logged: ${this.closeReason?.message}`);
    const seq = this._seq + 1;
    const msg = this._stamp({
      type: "wal_entry",
      ack: true,
      data: { sequence: seq, operation: "request_step", params: { request_id: rid, index, name, result } },
    });
    const payload = encodeValue(msg);
    if (payload.length > this.walEntryLimit) {
      throw new StepResultTooLarge(
        `step ${index} (${name}) of request ${rid}: its result makes a WAL entry of ${payload.length} bytes, over the limit of ${this.walEntryLimit} bytes (10 KiB, the supervisor's limit): ` +
          "store big results elsewhere (a file, an object store) and return their key from the step",
        { request_id: rid, index, name, size: payload.length, limit: this.walEntryLimit },
      );
    }
    this._seq = seq;
    let steps = this._steps.get(rid);
    if (steps === undefined) {
      steps = new Map();
      this._steps.set(rid, steps);
    }
    // In the table from the moment it is sent: a checkpoint taken while the
    // ack is pending must hold it (the checkpoint covers the entry).
    const entry = { name, result, pending: null };
    steps.set(index, entry);
    entry.pending = this._sendEntry(frameOf(payload), seq, seq);
    try {
      await entry.pending;
    } catch (e) {
      if (steps.get(index) === entry) steps.delete(index);
      if (steps.size === 0 && this._steps.get(rid) === steps) this._steps.delete(rid);
      throw e;
    } finally {
      entry.pending = null;
    }
    return result;
  }

  async _answer(req, body) {
    if (req.answered) throw new SupervisorError(`request ${req.requestId} was already answered`);
    const msg = this._stamp({ type: "request_result", request_id: req.requestId, ...body });
    const payload = encodeValue(msg);
    if (payload.length > RESULT_LIMIT) {
      throw new SupervisorError(
        `the answer to request ${req.requestId} is ${payload.length} bytes, over the 1 MiB limit of a request_result: answer with a key to data stored elsewhere`,
        { request_id: req.requestId, size: payload.length },
      );
    }
    req.answered = true;
    if (this._inflight.get(req.requestId) === req) this._inflight.delete(req.requestId);
    const written = this._writeFrame(frameOf(payload));
    if (this._steps.has(req.requestId)) {
      // The steps may be forgotten: logged (without ack) after the answer,
      // never before, or a restart could redeliver the request with its steps
      // gone (docs/protocol.md). Queued right behind the answer, in order.
      this._steps.delete(req.requestId);
      this.logNoAck("request_done", { request_id: req.requestId });
    }
    await written;
  }

  /** Forget a finished request's steps: request_done (without ack) when it had any. */
  _dropSteps(rid) {
    if (!this._steps.has(rid)) return;
    this._steps.delete(rid);
    if (!this.closed) this.logNoAck("request_done", { request_id: rid });
  }

  // ---------- receiving ----------

  _applyRestore(m) {
    let snap = m.snapshot ?? {};
    const compressed = m.compressed === true;
    if (compressed) {
      let body = snap;
      if (typeof body === "string") body = Buffer.from(body, "base64");
      if (!(body instanceof Uint8Array)) throw new ProtocolError("a compressed restore's snapshot is not bin");
      snap = decodeValue(decompress(body, MAX_DECOMPRESSED));
    }
    if (!isMap(snap)) snap = {};
    const entries = Array.isArray(m.wal_entries) ? m.wal_entries.filter(isMap) : [];
    let last = toInt(m.last_sequence);
    if (last === null) last = entries.reduce((a, e) => Math.max(a, toInt(e.sequence) ?? 0), 0);
    const checkpointId = String(m.checkpoint_id ?? "");

    const table = new Map();
    const saved = checkpointId !== "" ? snap[STEPS_KEY] : undefined;
    if (isMap(saved)) {
      for (const [rid, list] of Object.entries(saved)) {
        if (!Array.isArray(list)) continue;
        const steps = new Map();
        for (const s of list) {
          const idx = isMap(s) ? toInt(s.index) : null;
          if (idx !== null) steps.set(idx, { name: String(s.name ?? ""), result: s.result, pending: null });
        }
        if (steps.size) table.set(rid, steps);
      }
    }
    for (const e of entries) {
      const p = isMap(e.params) ? e.params : {};
      if (e.operation === "request_step") {
        const idx = toInt(p.index);
        if (idx === null) continue;
        const rid = String(p.request_id ?? "");
        if (!table.has(rid)) table.set(rid, new Map());
        table.get(rid).set(idx, { name: String(p.name ?? ""), result: p.result, pending: null });
      } else if (e.operation === "request_done") {
        table.delete(String(p.request_id ?? ""));
      }
    }
    // Steps of requests still running in this process stay known.
    for (const [rid, steps] of this._steps) {
      if (!this._inflight.has(rid)) continue;
      const t = table.get(rid) ?? new Map();
      for (const [i, s] of steps) if (!t.has(i)) t.set(i, s);
      table.set(rid, t);
    }
    this._steps = table;

    let userSnap = snap;
    if (STEPS_KEY in snap) {
      const { [STEPS_KEY]: _omit, ...rest } = snap;
      userSnap = rest;
    }
    const userEntries = entries.filter((e) => !STEP_OPS.has(e.operation));
    this.restore = new Restore(checkpointId, userSnap, userEntries, last, compressed, { ...m, snapshot: snap });
    if (last > this._seq) this._seq = last;
    if (last > this._durable) this._durable = last;
  }

  _dispatch(m) {
    const t = m.type;
    if (this._restoreWait !== null) {
      const w = this._restoreWait;
      this._restoreWait = null;
      if (t !== "restore") {
        const e = new ProtocolError(`expected a restore first, got ${JSON.stringify(t)}`);
        w.reject(e);
        throw e;
      }
      try {
        this._applyRestore(m);
      } catch (e) {
        w.reject(e);
        throw e;
      }
      w.resolve();
      return;
    }
    switch (t) {
      case "wal_ack": {
        const s = toInt(m.sequence);
        if (s !== null) this._ack(s);
        return;
      }
      case "checkpoint_ack": {
        const w = this._cpWaiters.shift();
        if (w) w.resolve(String(m.checkpoint_id ?? ""));
        return;
      }
      case "process_request": {
        const req = new Request(this, m);
        this._inflight.set(req.requestId, req);
        this._pushRequest(req);
        return;
      }
      case "cancel_request": {
        const rid = String(m.request_id ?? "");
        const req = this._inflight.get(rid);
        if (req !== undefined) req._controller.abort();
        // Cancelled is final (never delivered again): its steps, restored or
        // logged, are forgotten (request_done), as the Python clients do, or
        // they would stay in every checkpoint's step table for good.
        this._dropSteps(rid);
        this._emit("cancel_request", m);
        return;
      }
      case "error":
        this._onError(m);
        return;
      case "restore":
        this._applyRestore(m);
        this._emit("restore", this.restore);
        return;
      case "hot_reload":
      case "evolution_result":
        this._emit(t, m);
        return;
      case "shutdown":
        this._onShutdownMessage(m);
        return;
      default:
        this._emit("message", m);
    }
  }

  /**
   * Call event's listeners, as emit does, except that one that throws (or returns a promise that rejects) is
   * reported on stderr and the others still run: a listener's bug must not close the connection, nor reject
   * the shutdown path before onShutdown's final checkpoint.
   */
  _emit(event, ...args) {
    for (const listener of this.rawListeners(event)) {
      try {
        const r = listener.apply(this, args);
        if (r !== null && typeof r === "object" && typeof r.then === "function") {
          r.then(undefined, (e) => reportListenerError(event, e));
        }
      } catch (e) {
        reportListenerError(event, e);
      }
    }
  }

  _onError(m) {
    const err = fromErrorMessage(m.error);
    const d = err.details;
    if (err.code === "CHECKPOINT_FAILED" || (err.code === "INVALID_MESSAGE" && d.type === "checkpoint")) {
      const w = this._cpWaiters.shift();
      if (w) {
        w.reject(err instanceof CheckpointFailed || err.code === "INVALID_MESSAGE" ? err : new CheckpointFailed(err.message, d, err.code));
        return;
      }
    } else if (
      ["WAL_FULL", "WAL_FAILED", "SEQUENCE_CONFLICT"].includes(err.code) ||
      (err.code === "INVALID_MESSAGE" && (d.type === "wal_entry" || d.type === "wal_batch"))
    ) {
      let first = toIntSafe(d.first_sequence);
      let last = toIntSafe(d.last_sequence ?? d.first_sequence);
      if (err.code === "SEQUENCE_CONFLICT" && first !== null) {
        // last_sequence is the log's; the whole frame was refused
        last = first + (toIntSafe(d.entries) ?? 1) - 1;
      }
      if (first === null || last === null) {
        // unknown range: every entry still waiting fails
        first = this._durable + 1;
        last = Math.max(this._seq, first);
      }
      this._walError(first, last, err);
      this._emit("supervisor_error", err);
      return;
    }
    this._emit("supervisor_error", err);
  }

  async _onShutdownMessage(m) {
    this.shutdownMessage = m;
    this._emit("shutdown", m);
    if (m.create_checkpoint === true && this.onShutdown) {
      try {
        const state = await this.onShutdown(m);
        if (state) await this.checkpoint(state);
      } catch (e) {
        process.stderr.write(`supervisor-agent: final checkpoint failed: ${e.message}\n`);
      }
    }
    this._endRequests();
  }

  _pushRequest(req) {
    const p = this._pullers.shift();
    if (p) p(req);
    else this._queue.push(req);
  }

  _endRequests() {
    this._requestsEnded = true;
    for (const p of this._pullers.splice(0)) p(null);
  }

  /** The user requests, as they arrive, until shutdown or disconnect. Handle them concurrently by not awaiting each. */
  async *requests() {
    for (;;) {
      if (this._queue.length > 0) {
        yield this._queue.shift();
        continue;
      }
      if (this._requestsEnded) return;
      const req = await new Promise((resolve) => this._pullers.push(resolve));
      if (req === null) return;
      yield req;
    }
  }

  /** The in-flight requests by id (delivered, not answered). */
  get inflight() {
    return this._inflight;
  }

  _close(reason) {
    if (this.closed) return;
    this.closed = true;
    this.closeReason = reason;
    if (this._hb) clearInterval(this._hb);
    if (this._restoreWait) {
      this._restoreWait.reject(reason);
      this._restoreWait = null;
    }
    const notDurable = (what) => new NotDurable(`connection ended before ${what}: ${reason.message}`);
    for (let i = this._ackHead; i < this._ackWaiters.length; i++) {
      const w = this._ackWaiters[i];
      if (!w.done) {
        w.done = true;
        w.reject(notDurable(`entry ${w.last} was durable`));
      }
    }
    this._ackWaiters = [];
    this._ackHead = 0;
    for (const w of this._cpWaiters.splice(0)) w.reject(notDurable("the checkpoint was acknowledged"));
    for (const req of this._inflight.values()) req._controller.abort(reason);
    this._endRequests();
    this._r.off("data", this._onData);
    if (typeof this._r.destroy === "function" && this._r !== process.stdin) this._r.destroy();
    else if (typeof this._r.pause === "function") this._r.pause();
    if (this._r === process.stdin && typeof process.stdin.destroy === "function") process.stdin.destroy();
    try {
      this._w.end();
    } catch {
      // already gone
    }
    this._emit("close", reason);
  }

  /** Stop heartbeats and close both pipes (the supervisor sees the agent's end of input). */
  close() {
    this._close(new Disconnected("closed by the agent"));
  }
}

function reportListenerError(event, e) {
  process.stderr.write(`supervisor-agent: ${event} listener threw: ${(e && e.stack) || e}\n`);
}

function toIntSafe(v) {
  try {
    return toInt(v);
  } catch {
    return null;
  }
}
