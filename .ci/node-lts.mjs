#!/usr/bin/env node
/**
 * The fast test tier on the other supported lines of Node. `npm test` runs the
 * whole suite on the line scripts/node.mjs picks (26 in CI); this runs the
 * tests that need no model and no database server (test/unit, test/http:
 * the whole HTTP contract on a fake pipeline, request decompression included)
 * on each line below, from the npm registry (`npx -p node@<version>`, the
 * official binary), with the project's own node_modules: its two native
 * modules, better-sqlite3 and onnxruntime-node, are Node-API binaries that
 * load on every line.
 *
 *   node .ci/node-lts.mjs                     the lines CI runs (CI_LINES)
 *   node .ci/node-lts.mjs 22                  one line
 *   node .ci/node-lts.mjs 22 test/http/content-encoding.test.ts
 */
import { spawnSync } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { envFor, fetchNode } from "../scripts/node.mjs";

/**
 * Pinned versions: 24 is the Maintenance LTS line; 22's is the oldest release
 * `engines` admits (better-sqlite3's binary needs Node-API 10, from 22.14; on
 * 22.13 it crashes on load), and one whose zstd is fzstd's (node:zlib has it
 * from 22.15).
 */
const LINES = { 24: "24.21.0", 22: "22.14.0" };
const CI_LINES = ["24", "22"];
/** The fast tier as vitest.config.ts defines it (test/unit, test/http), not a second list of it. */
const DEFAULT_FILES = ["--project", "fast", "--fileParallelism"];

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const say = (line) => process.stderr.write(`[node-lts] ${line}\n`);

function run(line, files) {
  const version = LINES[line];
  if (!version) throw new Error(`unknown line ${line}; known: ${Object.keys(LINES).join(", ")}`);
  const bin = fetchNode(version);
  say(`Node ${version}: vitest run ${files.join(" ")}`);
  const vitest = path.join(ROOT, "node_modules", "vitest", "vitest.mjs");
  const r = spawnSync(bin, [vitest, "run", ...files], { cwd: ROOT, stdio: "inherit", env: envFor(bin) });
  return r.status ?? 1;
}

const [first, ...rest] = process.argv.slice(2);
const lines = first && /^\d+$/.test(first) ? [first] : CI_LINES;
const files = first && /^\d+$/.test(first) ? rest : process.argv.slice(2);
let failed = 0;
for (const line of lines) {
  const status = run(line, files.length > 0 ? files : DEFAULT_FILES);
  if (status !== 0) {
    say(`Node ${LINES[line]}: FAILED (${status})`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);
