#!/usr/bin/env node
// Launcher for the compiled CLI (src/cli/index.ts; `npm run build`, which npm start and npm test do).
// On a Node outside package.json's `engines` (a machine's own Node 20, say) better-sqlite3 crashes the
// process as it loads, with no message: the CLI then runs itself on the Node that npm start runs on,
// from the npm registry (scripts/node.mjs), saying so in one line. Nothing here may load a native module
// before that check: the CLI is imported after it.
import { spawn } from "node:child_process";
import fs from "node:fs";
import { fileURLToPath } from "node:url";
import { withLibraryPath } from "../scripts/cuda-provider.mjs";
import { NODE_VERSION, envFor, fetchNode, mirror, satisfies, supportedRange } from "../scripts/node.mjs";

const here = process.versions.node;
const range = supportedRange();
// The CUDA libraries must be on LD_LIBRARY_PATH when the process starts (scripts/cuda-provider.mjs):
// where they are not, the CLI runs itself again with them.
const cudaEnv = process.env.ASSAY_EXECUTION_PROVIDER === "cuda" ? withLibraryPath(process.env) : null;
if (cudaEnv && cudaEnv.LD_LIBRARY_PATH !== process.env.LD_LIBRARY_PATH) {
  mirror(spawn(process.execPath, [fileURLToPath(import.meta.url), ...process.argv.slice(2)], { stdio: "inherit", env: cudaEnv }));
} else if (!satisfies(here, range)) {
  let bin;
  try {
    bin = fetchNode(NODE_VERSION);
  } catch (e) {
    const why = e instanceof Error ? e.message.split("\n")[0] : String(e);
    console.error(
      `assay: Node ${here} is not supported (it needs ${range}), and Node ${NODE_VERSION} could not be fetched from the npm registry (${why}).\n` +
        `  Install Node 22.14 or later, 24 or 26, or run: node scripts/node.mjs 'node bin/assay.js ${process.argv.slice(2).join(" ")}'`,
    );
    process.exit(1);
  }
  console.error(`assay: Node ${here} is not supported (${range}); running on Node ${NODE_VERSION} from the npm registry`);
  mirror(spawn(bin, [fileURLToPath(import.meta.url), ...process.argv.slice(2)], { stdio: "inherit", env: envFor(bin) }));
} else {
  const cli = new URL("../dist/src/cli/index.js", import.meta.url);
  if (!fs.existsSync(cli)) {
    console.error("assay: the CLI is not built; run npm run build (npm start and npm test build it)");
    process.exit(1);
  }
  const { runCli } = await import(cli.href);
  process.exitCode = await runCli(process.argv);
}
