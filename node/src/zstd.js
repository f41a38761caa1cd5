// Optional v2 compression. Node's own zlib has zstd from Node 22.15 / 23.8:
// with it the client compresses and decompresses. On older Node (Debian's
// Node 20) the client decompresses with the pure-JavaScript `fzstd` package
// when the agent's project has installed it, and sends everything
// uncompressed (which the protocol always allows). Without either, the
// client speaks version 1 and the supervisor never compresses a restore.
import zlib from "node:zlib";
import { ProtocolError } from "./errors.js";

/** A zstd frame's declared content size, or -1 when the header does not declare one. */
export function declaredContentSize(b) {
  if (b.length < 6 || b.readUInt32LE(0) !== 0xfd2fb528) return -1;
  const fhd = b[4];
  const fcsFlag = fhd >> 6;
  const single = (fhd >> 5) & 1;
  const dictFlag = fhd & 3;
  let pos = 5 + (single ? 0 : 1) + [0, 1, 2, 4][dictFlag];
  const size = fcsFlag === 0 ? (single ? 1 : 0) : [0, 2, 4, 8][fcsFlag];
  if (size === 0 || b.length < pos + size) return -1;
  switch (size) {
    case 1:
      return b[pos];
    case 2:
      return b.readUInt16LE(pos) + 256;
    case 4:
      return b.readUInt32LE(pos);
    default:
      return Number(b.readBigUInt64LE(pos));
  }
}

let fzstd = null;
let tried = false;

/** Load what is available; returns {canDecompress, canCompress, source}. */
export async function loadZstd() {
  if (!tried) {
    tried = true;
    if (typeof zlib.zstdDecompressSync !== "function") {
      try {
        fzstd = await import("fzstd");
      } catch {
        fzstd = null;
      }
    }
  }
  return zstdInfo();
}

export function zstdInfo() {
  const native = typeof zlib.zstdDecompressSync === "function";
  return {
    canDecompress: native || fzstd !== null,
    canCompress: typeof zlib.zstdCompressSync === "function",
    source: native ? "node:zlib" : fzstd !== null ? "fzstd" : "none",
  };
}

/** Decompress a body, at most `limit` bytes out; more is a ProtocolError (a zstd bomb). */
export function decompress(body, limit) {
  const buf = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  const declared = declaredContentSize(buf);
  if (declared > limit) {
    throw new ProtocolError(`compressed body declares ${declared} bytes, over the limit of ${limit}`);
  }
  if (typeof zlib.zstdDecompressSync === "function") {
    try {
      return zlib.zstdDecompressSync(buf, { maxOutputLength: limit });
    } catch (e) {
      throw new ProtocolError(`cannot decompress a zstd body: ${e.message}`);
    }
  }
  if (fzstd === null) {
    throw new ProtocolError(
      "a compressed message arrived but no zstd decoder is available: install the `fzstd` package (npm install fzstd) or use Node >= 22.15",
    );
  }
  const chunks = [];
  let total = 0;
  try {
    const d = new fzstd.Decompress((chunk) => {
      total += chunk.length;
      if (total > limit) throw new ProtocolError(`compressed body inflates beyond the limit of ${limit} bytes`);
      chunks.push(chunk);
    });
    d.push(buf, true);
  } catch (e) {
    if (e instanceof ProtocolError) throw e;
    throw new ProtocolError(`cannot decompress a zstd body: ${e.message}`);
  }
  return Buffer.concat(chunks, total);
}

/** Compress bytes with zstd (declaring the content size), or null when this Node cannot. */
export function compress(bytes) {
  if (typeof zlib.zstdCompressSync !== "function") return null;
  return zlib.zstdCompressSync(bytes, {
    params: { [zlib.constants.ZSTD_c_compressionLevel]: 3, [zlib.constants.ZSTD_c_contentSizeFlag]: 1 },
  });
}
