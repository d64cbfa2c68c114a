/**
 * `npx assay …` on a Node that package.json's `engines` does not admit: bin/assay.js runs itself on
 * the supported Node from the npm registry (scripts/node.mjs) and says so in one line; where it cannot
 * fetch that Node it names the Node it needs and the command that works. Never the segmentation fault
 * that better-sqlite3 gives on Node 20. Node 20 itself comes from the npm registry, as .ci/node-lts.mjs
 * fetches the other lines (cached by npx after the first run). Needs dist/ (the build).
 */
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOT } from "../../src/config/index.js";
// @ts-expect-error: a plain ES module of Node built-ins, without types
import { fetchNode, NODE_VERSION } from "../../scripts/node.mjs";

/** A line below `engines` (the machine image's own Node). */
const UNSUPPORTED = "20.20.2";

let node20 = "";
let dir = "";

beforeAll(() => {
  node20 = (fetchNode as (v: string) => string)(UNSUPPORTED);
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-cli-node-"));
}, 300_000);

afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

const assay = (args: string[], env: Record<string, string> = {}) =>
  spawnSync(node20, [path.join(ROOT, "bin", "assay.js"), ...args], {
    cwd: ROOT,
    encoding: "utf8",
    env: { ...process.env, ASSAY_DATA_DIR: dir, ...env },
    timeout: 240_000,
  });

describe(`bin/assay.js on Node ${UNSUPPORTED}`, () => {
  it("runs itself on the supported Node: key create, credit add and usage work as typed", () => {
    const key = assay(["key", "create", "--org", "x"]);
    expect(key.signal).toBeNull();
    expect(key.status, key.stderr).toBe(0);
    expect(key.stderr).toContain(`assay: Node ${UNSUPPORTED} is not supported`);
    expect(key.stderr).toContain(`running on Node ${String(NODE_VERSION)} from the npm registry`);
    expect(key.stdout.trim().split("\n").at(-1)).toMatch(/^sk-assay-/);
    const credit = assay(["credit", "add", "--org", "x", "--usd", "1"]);
    expect(credit.status, credit.stderr).toBe(0);
    const usage = assay(["usage", "--org", "x", "--json"]);
    expect(usage.status, usage.stderr).toBe(0);
    expect(JSON.parse(usage.stdout)).toMatchObject({ org: expect.anything() });
  }, 300_000);

  it("where it cannot fetch the supported Node, names the Node it needs and the command that works", () => {
    // No npx on PATH: the fetch cannot run.
    const r = assay(["key", "list", "--org", "x"], { PATH: path.join(dir, "empty") });
    expect(r.signal).toBeNull();
    expect(r.status).toBe(1);
    expect(r.stderr).toContain(`needs ^22.14.0 || ^24.0.0 || ^26.0.0`);
    expect(r.stderr).toContain(`node scripts/node.mjs 'node bin/assay.js key list --org x'`);
  }, 60_000);
});
