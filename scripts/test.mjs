#!/usr/bin/env node
// `npm test`: the whole suite in the order that stops cheapest first: bootstrap (npm dependencies, build),
// typecheck, the fast tier, the models (built, or linked from the per-user build cache), the engine tier,
// the process tier. It prints each phase's duration at the end, passed or not, so a slow CI run shows
// where its time went; with ASSAY_PHASE_LOG set it appends the same lines to that file (.ci/run does).
//
// Node built-ins only: its first phase installs node_modules.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const bin = (name) => path.join(ROOT, "node_modules", ".bin", name);

const PHASES = [
  ["bootstrap", process.execPath, ["scripts/bootstrap.mjs", "--no-models"]],
  ["typecheck", () => bin("tsc"), ["-p", "tsconfig.test.json"]],
  ["fast tier", () => bin("vitest"), ["run", "--project", "fast", "--fileParallelism"]],
  // The 0.5B's GPU graph for the WebGPU tests on llvmpipe; the converter's venv for a test's self-check.
  ["models", process.execPath, ["scripts/bootstrap.mjs", "--gpu-graph", "qwen2.5-coder-0.5b", "--venv", "--cuda-provider"]],
  ["engine tier", () => bin("vitest"), ["run", "--project", "engine"]],
  ["process tier", () => bin("vitest"), ["run", "--project", "process"]],
];

const times = [];
const fmt = (s) => `${Math.floor(s / 60)} min ${String(Math.round(s % 60)).padStart(2, " ")} s`;

function report(failed) {
  const lines = times.map(([name, s, ok]) => `[test] ${name.padEnd(13)} ${fmt(s).padStart(11)}${ok ? "" : "  FAILED"}`);
  const total = times.reduce((a, [, s]) => a + s, 0);
  lines.push(`[test] ${"npm test".padEnd(13)} ${fmt(total).padStart(11)}${failed ? "  FAILED" : ""}`);
  process.stderr.write(`\n${lines.join("\n")}\n`);
  if (process.env.ASSAY_PHASE_LOG) fs.appendFileSync(process.env.ASSAY_PHASE_LOG, `${lines.join("\n")}\n`);
}

for (const [name, cmd, argv] of PHASES) {
  const t0 = performance.now();
  const r = spawnSync(typeof cmd === "function" ? cmd() : cmd, argv, { cwd: ROOT, stdio: "inherit" });
  const ok = r.status === 0;
  times.push([name, (performance.now() - t0) / 1000, ok]);
  if (!ok) {
    report(true);
    process.exit(r.status ?? 1);
  }
}
report(false);
