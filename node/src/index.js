export { Agent, Request, Restore, STEPS_KEY, DEFAULT_WAL_ENTRY_LIMIT } from "./agent.js";
export * from "./errors.js";
export { FrameReader, DEFAULT_MAX_FRAME, decodePayload, decodeValue, encodeFrame, encodeValue } from "./framing.js";
export { zstdInfo } from "./zstd.js";
