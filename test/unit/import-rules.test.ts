/**
 * The import rules of src/README.md and the folder READMEs, as checked by
 * dependency-cruiser (.dependency-cruiser.cjs): the service keeps them, and
 * the rule set does catch a break (a fixture tree that imports across a
 * forbidden edge).
 */
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";

const ROOT = path.resolve(import.meta.dirname, "../..");
const PKG = path.join(ROOT, "node_modules", "dependency-cruiser");
// The file behind its `depcruise` command, as its package.json names it (the file has been renamed before).
const CLI = path.join(PKG, (JSON.parse(fs.readFileSync(path.join(PKG, "package.json"), "utf8")) as { bin: Record<string, string> }).bin["depcruise"]!);
const CONFIG = path.join(ROOT, ".dependency-cruiser.cjs");

interface Violation {
  from: string;
  to: string;
  rule: { name: string };
}

function cruise(cwd: string): Violation[] {
  const r = spawnSync(process.execPath, [CLI, "src", "--config", CONFIG, "--output-type", "json"], { cwd, encoding: "utf8", maxBuffer: 64 << 20 });
  if (!r.stdout) throw new Error(`dependency-cruiser printed nothing (exit ${r.status}): ${r.stderr}`);
  return (JSON.parse(r.stdout) as { summary: { violations: Violation[] } }).summary.violations;
}

let tmp: string | null = null;
afterEach(() => {
  if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  tmp = null;
});

/** A tree with the project's tsconfig and the given files under src/. */
function fixture(files: Record<string, string>): string {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), "assay-imports-"));
  fs.copyFileSync(path.join(ROOT, "tsconfig.json"), path.join(tmp, "tsconfig.json"));
  for (const [name, text] of Object.entries(files)) {
    fs.mkdirSync(path.dirname(path.join(tmp, "src", name)), { recursive: true });
    fs.writeFileSync(path.join(tmp, "src", name), text);
  }
  return tmp;
}

describe("import rules", () => {
  it("src/ keeps every rule", () => {
    expect(cruise(ROOT).map((v) => `${v.rule.name}: ${v.from} → ${v.to}`)).toEqual([]);
  });

  it("the rule set catches the HTTP layer importing the engine, a family reading the pool, served code importing an offline tool, a low layer importing a high one, and a cycle", () => {
    const dir = fixture({
      "http/routes.ts": 'import { run } from "../inference/pool.js";\nexport const r = run;\n',
      "inference/pool.ts": "export const run = 1;\n",
      "observability/metrics.ts": 'import { p } from "../pipeline/index.js";\nexport const m = p;\n',
      "pipeline/index.ts": 'import { m } from "../observability/metrics.js";\nexport const p = 1;\nexport const q = m;\n',
      "families/general.ts": 'import { db } from "../accounts/store.js";\nexport const g = db;\n',
      "families/codesearch.ts": 'import { run } from "../inference/pool.js";\nexport const c = run;\n',
      "probability/calibration.ts": 'import { fit } from "../eval/fitting.js";\nexport const f = fit;\n',
      "eval/fitting.ts": "export const fit = 1;\n",
      "accounts/store.ts": "export const db = 1;\n",
    });
    const found = cruise(dir).map((v) => `${v.rule.name}: ${v.from} → ${v.to}`);
    expect(found).toContain("http-never-the-engine: src/http/routes.ts → src/inference/pool.ts");
    expect(found).toContain("observability-imports-nothing: src/observability/metrics.ts → src/pipeline/index.ts");
    expect(found).toContain("families-pipeline-never-http-accounts: src/families/general.ts → src/accounts/store.ts");
    expect(found).toContain("accounts-imported-by-the-edge-only: src/families/general.ts → src/accounts/store.ts");
    expect(found).toContain("families-never-inference: src/families/codesearch.ts → src/inference/pool.ts");
    expect(found).toContain("served-code-never-offline-tools: src/probability/calibration.ts → src/eval/fitting.ts");
    expect(found.some((f) => f.startsWith("no-circular:"))).toBe(true);
  });

  it("the rule set catches a room of the pool importing another or the lanes, a record importing a room, test hooks reached past the pool, and the planner running passes", () => {
    const dir = fixture({
      "inference/queue.ts": 'import { spawn } from "./lanes.js";\nexport const q = spawn;\n',
      "inference/admission.ts": 'import { q } from "./queue.js";\nexport const a = q;\n',
      "inference/lanes.ts": "export const spawn = 1;\n",
      "inference/jobs.ts": 'import { a } from "./admission.js";\nexport const j = a;\n',
      "inference/test-hooks.ts": "export const hooks = 1;\n",
      "inference/pool.ts": 'import { hooks } from "./test-hooks.js";\nexport const run = hooks;\n',
      "engine/index.ts": 'import { hooks } from "../inference/test-hooks.js";\nexport const e = hooks;\n',
      "engine/planner.ts": 'import { run } from "../inference/pool.js";\nexport const p = run;\n',
      "pipeline/index.ts": 'import { j } from "../inference/jobs.js";\nexport const x = j;\n',
    });
    const found = cruise(dir).map((v) => `${v.rule.name}: ${v.from} → ${v.to}`);
    expect(found).toContain("inference-rooms-apart: src/inference/queue.ts → src/inference/lanes.ts");
    expect(found).toContain("inference-rooms-apart: src/inference/admission.ts → src/inference/queue.ts");
    expect(found).toContain("inference-records-and-policy-below-the-rooms: src/inference/jobs.ts → src/inference/admission.ts");
    expect(found).toContain("inference-test-hooks-via-the-pool: src/engine/index.ts → src/inference/test-hooks.ts");
    expect(found).not.toContain("inference-test-hooks-via-the-pool: src/inference/pool.ts → src/inference/test-hooks.ts");
    expect(found).toContain("engine-planner-never-runs: src/engine/planner.ts → src/inference/pool.ts");
    expect(found).toContain("inference-surface-is-the-pool: src/pipeline/index.ts → src/inference/jobs.ts");
  });
});
