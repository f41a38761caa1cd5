// The fdatasync probe of the benchmarks (as test/durable_bench_test.go's):
// 1 KiB written into a preallocated 1 MiB file on the data directory's file
// system, then fdatasync, timed. Shared by bench_agent.js and floor_agent.js
// (which must not load the client).
import fs from "node:fs";

export function openProbe(path) {
  const fd = fs.openSync(path, "w+");
  fs.writeSync(fd, Buffer.alloc(1 << 20));
  fs.fsyncSync(fd);
  const block = Buffer.alloc(1024, 1);
  let i = 0;
  return {
    /** One timed write + fdatasync, in ms. */
    once() {
      const t = performance.now();
      fs.writeSync(fd, block, 0, block.length, (i++ % 1024) * 1024);
      fs.fdatasyncSync(fd);
      return performance.now() - t;
    },
    close() {
      fs.closeSync(fd);
      fs.rmSync(path, { force: true });
    },
  };
}

/** The median of xs. */
export const p50 = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
