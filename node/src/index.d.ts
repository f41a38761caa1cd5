// Types of supervisor-agent (the sources are plain ESM JavaScript: nothing to build).
import { EventEmitter } from "node:events";
import type { Readable, Writable } from "node:stream";

/** Any value MessagePack carries: what params, state, results and answers may hold. */
export type Value =
  | null
  | boolean
  | number
  | bigint
  | string
  | Uint8Array
  | Date
  | Value[]
  | { [key: string]: Value };
export type ValueMap = { [key: string]: Value };

/** A message as it arrives from the supervisor (a decoded map). */
export type Message = { type: string; timestamp: number; [key: string]: unknown };

export interface AgentOptions {
  /** Milliseconds between heartbeats (default 1000; 0 sends none). Heartbeats run on the event loop: keep it unblocked. */
  heartbeatInterval?: number;
  /** The highest protocol version to speak (default 2 when a zstd decoder is available, else 1). */
  version?: number;
  /** The largest frame accepted from the supervisor (default 128 MiB); a longer declared length is a ProtocolError. */
  maxFrame?: number;
  /** The WAL entry limit (encoded message, bytes) a log() or step entry must fit in (default 10240, the supervisor's default); a bigger one is refused unsent. */
  walEntryLimit?: number;
  /** Called on shutdown with create_checkpoint: return the state to store as the final checkpoint (or nothing). */
  onShutdown?: (msg: Message) => ValueMap | null | undefined | Promise<ValueMap | null | undefined>;
}

export interface OpenOptions extends AgentOptions {
  /** The first frame will be a restore: open() waits for it. */
  restorePending?: boolean;
  role?: string;
}

export declare class Restore {
  /** The checkpoint restored, or "" when only WAL entries follow. */
  readonly checkpointId: string;
  /** The checkpoint's data, without the client's step table. */
  readonly snapshot: ValueMap;
  /** The logged entries after the checkpoint, in order, without request_step / request_done. */
  readonly walEntries: { operation: string; params: ValueMap; sequence: number }[];
  /** The WAL's last sequence: new entries are numbered above it. */
  readonly lastSequence: number;
  /** The snapshot arrived zstd-compressed. */
  readonly compressed: boolean;
  /** The restore message as it arrived (snapshot decompressed, step entries included). */
  readonly raw: Message;
}

export declare class Request {
  readonly requestId: string;
  readonly message: string;
  readonly context: ValueMap;
  readonly userId: string;
  /** 1 on first delivery; higher when delivered again after the agent restarted. */
  readonly attempt: number;
  /** Aborted by cancel_request (a caller's DELETE) or when the connection ends: pass it to fetch and LLM SDKs. */
  readonly signal: AbortSignal;
  readonly cancelled: boolean;
  readonly answered: boolean;
  readonly raw: Message;
  /**
   * Run fn once for this request. Its result is logged durably (request_step, acknowledged by wal_ack)
   * before step() resolves; on redelivery a completed step resolves with the logged result without calling fn.
   * Rejects with StepMismatch (another name was logged at this index), StepResultTooLarge (over the WAL entry
   * limit: store big results elsewhere), the signal's AbortError when cancelled before fn starts, or WalFull/WalFailed/NotDurable.
   */
  step<T>(name: string, fn: (signal: AbortSignal) => T | Promise<T>): Promise<T>;
  /** Answer with data (request_result). Resolves once the frame is handed to the pipe. */
  reply(data: ValueMap): Promise<void>;
  /** Answer with an error. */
  fail(code: string, message: string): Promise<void>;
}

export declare class Agent extends EventEmitter {
  /** Connect through the supervisor's environment contract (SUPERVISOR_* variables); throws NotUnderSupervisor without one. */
  static connect(options?: AgentOptions): Promise<Agent>;
  /** Connect over any pair of streams (tests, in-process fakes). */
  static open(readable: Readable, writable: Writable, options?: OpenOptions): Promise<Agent>;

  /** What the supervisor restored at start (null when it had no state). */
  restore: Restore | null;
  readonly role: string;
  readonly version: number;
  /** The shutdown message, once one arrived. */
  shutdownMessage: Message | null;
  readonly closed: boolean;
  readonly closeReason: Error | null;
  /** The highest sequence numbered (or restored). */
  readonly lastSequence: number;
  /** The highest sequence acknowledged as durable. */
  readonly durableSequence: number;
  /** Delivered requests not yet answered, by id. */
  readonly inflight: Map<string, Request>;

  /** Log one entry with ack: true; resolves with its sequence once durable. An entry over walEntryLimit rejects with InvalidMessage at once, unsent. */
  log(operation: string, params?: ValueMap): Promise<number>;
  /** Log 1 to 100 [operation, params] entries as one unit; resolves with the last sequence once durable. */
  logBatch(entries: [string, ValueMap][]): Promise<number>;
  /** Log an entry without asking for an ack; returns its sequence. */
  logNoAck(operation: string, params?: ValueMap): number;
  /** Store the whole state; resolves with the checkpoint id once acknowledged. The step table is added for you. */
  checkpoint(state: ValueMap): Promise<string>;
  /** The requests, as they arrive, until shutdown or disconnect. */
  requests(): AsyncGenerator<Request, void, undefined>;
  /** The logged steps of requests not yet answered. */
  stepTable(): { [requestId: string]: { index: number; name: string; result: Value }[] };
  heartbeat(): Promise<void>;
  metrics(values: { [key: string]: number }): Promise<void>;
  reportError(code: string, message: string, context?: ValueMap): Promise<void>;
  evolutionIntent(h: { target: string; newCode: string; reason?: string; expectedImprovement?: { [key: string]: number } }): Promise<void>;
  /** Send any message as is (timestamp and version added). */
  send(msg: { type: string; [key: string]: unknown }): Promise<void>;
  /** Stop heartbeats and close both pipes. */
  close(): void;

  on(event: "hot_reload" | "evolution_result" | "shutdown" | "cancel_request" | "message", listener: (msg: Message) => void): this;
  on(event: "restore", listener: (restore: Restore) => void): this;
  on(event: "supervisor_error", listener: (err: SupervisorError) => void): this;
  on(event: "close", listener: (reason: Error) => void): this;
  on(event: string | symbol, listener: (...args: any[]) => void): this;
}

export declare const STEPS_KEY: "__supervisor_steps__";
export declare const DEFAULT_WAL_ENTRY_LIMIT: number;
export declare const DEFAULT_MAX_FRAME: number;

export declare class SupervisorError extends Error {
  code: string;
  details: { [key: string]: unknown };
  constructor(message: string, details?: { [key: string]: unknown }, code?: string);
}
export declare class NotUnderSupervisor extends SupervisorError {}
export declare class ProtocolError extends SupervisorError {}
export declare class Disconnected extends SupervisorError {}
export declare class WalFull extends SupervisorError {}
export declare class WalFailed extends SupervisorError {}
export declare class SequenceConflict extends SupervisorError {}
export declare class InvalidMessage extends SupervisorError {}
export declare class CheckpointFailed extends SupervisorError {}
export declare class NotDurable extends SupervisorError {}
export declare class StepMismatch extends SupervisorError {}
export declare class StepResultTooLarge extends SupervisorError {}
export declare function fromErrorMessage(err: unknown): SupervisorError;

/** Cuts a byte stream into frame payloads; refuses a declared length over maxFrame before keeping anything. */
export declare class FrameReader {
  constructor(maxFrame?: number);
  readonly buffered: number;
  push(chunk: Uint8Array): Buffer[];
  end(): void;
}
export declare function decodePayload(payload: Uint8Array): Message;
export declare function decodeValue(bytes: Uint8Array): unknown;
export declare function encodeValue(value: unknown): Uint8Array;
export declare function encodeFrame(msg: unknown): Buffer;
export declare function zstdInfo(): { canDecompress: boolean; canCompress: boolean; source: "node:zlib" | "fzstd" | "none" };
