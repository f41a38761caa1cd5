// The TypeScript types (src/index.d.ts) compile against a typical agent, strictly.
import { execFileSync } from "node:child_process";
import path from "node:path";
import { test } from "node:test";

import { NODE_DIR } from "./harness.js";

test("src/index.d.ts type-checks a strict TypeScript agent", () => {
  const tsc = path.join(NODE_DIR, "node_modules", "typescript", "bin", "tsc");
  execFileSync(
    process.execPath,
    [tsc, "--noEmit", "--strict", "--module", "nodenext", "--moduleResolution", "nodenext", "--target", "es2022", "--types", "node", path.join("test", "types", "usage.mts")],
    { cwd: NODE_DIR, stdio: "inherit" },
  );
});
