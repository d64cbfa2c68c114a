/**
 * The build cache's key (scripts/build-cache.mjs): a build is found again only when everything it was made
 * from is the same: the recipe, each script that writes one of its graphs (a comment added is enough), the
 * converter's pinned versions, the Python, the formats. Anything else would serve a stale build to every
 * checkout on the machine.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { BUILD_SCRIPTS, type BuildKeyInputs, buildKey, cacheRoot, markStage, pointAt, stagesDone, sweepPartials, unmarkStage, venvKey, withLock } from "../../scripts/build-cache.mjs";

const ROOT = path.resolve(import.meta.dirname, "../..");
const RECIPES = JSON.parse(fs.readFileSync(path.join(ROOT, "models", "recipes.json"), "utf8")) as Record<string, Record<string, unknown>>;
const RECIPE_NAME = "qwen2.5-coder-0.5b-instruct";

let tmp: string;
let inputs: BuildKeyInputs;

beforeAll(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), "assay-build-cache-"));
  fs.mkdirSync(path.join(tmp, "scripts"));
  for (const f of [...BUILD_SCRIPTS, "requirements.txt"]) fs.copyFileSync(path.join(ROOT, "scripts", f), path.join(tmp, "scripts", f));
  inputs = {
    recipeName: RECIPE_NAME,
    recipe: structuredClone(RECIPES[RECIPE_NAME]!),
    scriptsDir: path.join(tmp, "scripts"),
    requirements: path.join(tmp, "scripts", "requirements.txt"),
    python: "Python 3.11.7",
    formats: { export: "assay-packed-v4", batch: 2, gpu: "assay-gpu-v1" },
  };
});
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

const keyOf = (over: Partial<typeof inputs> = {}) => buildKey({ ...inputs, ...over }).key;

/** Runs `change` on a file, takes the key, and puts the file back. */
function keyWithFileChanged(file: string, change: (text: string) => string): string {
  const before = fs.readFileSync(file, "utf8");
  fs.writeFileSync(file, change(before));
  try {
    return keyOf();
  } finally {
    fs.writeFileSync(file, before);
  }
}

describe("build cache key", () => {
  it("is stable: the same inputs give the same key, and the recipe's key order does not matter", () => {
    const base = keyOf();
    expect(base).toMatch(/^[0-9a-f]{16}$/);
    expect(keyOf()).toBe(base);
    const reordered = Object.fromEntries(Object.entries(inputs.recipe as Record<string, unknown>).reverse());
    expect(keyOf({ recipe: reordered })).toBe(base);
  });

  it("changes with a comment added to each script a build is made from, and comes back when it is taken out", () => {
    const base = keyOf();
    const seen = new Set([base]);
    for (const f of BUILD_SCRIPTS) {
      const k = keyWithFileChanged(path.join(tmp, "scripts", f), (t) => `${t}\n# a comment\n`);
      expect(k, f).not.toBe(base);
      seen.add(k);
    }
    expect(seen.size).toBe(BUILD_SCRIPTS.length + 1);
    expect(keyOf()).toBe(base);
  });

  it("covers every Python script the bootstrap runs", () => {
    const bootstrap = fs.readFileSync(path.join(ROOT, "scripts", "bootstrap.mjs"), "utf8");
    const run = [...bootstrap.matchAll(/"scripts", "([a-z_0-9]+\.py)"/g)].map((m) => m[1]!);
    expect(run.length).toBeGreaterThanOrEqual(5);
    // half_graph.py writes from the build's own float32 GPU graph and is keyed apart: its facts carry the
    // script's sha256, and the bootstrap writes the graph again when it differs (ensureHalfGraphs).
    const keyedApart = ["half_graph.py"];
    for (const f of run) if (!keyedApart.includes(f)) expect(BUILD_SCRIPTS).toContain(f);
    expect(bootstrap).toContain("current.script_sha256 === scriptHash");
  });

  it("covers every script the graph writers import from scripts/", () => {
    for (const f of BUILD_SCRIPTS) {
      const text = fs.readFileSync(path.join(ROOT, "scripts", f), "utf8");
      for (const m of text.matchAll(/^\s*(?:from|import)\s+([A-Za-z_][A-Za-z0-9_]*)/gm)) {
        if (fs.existsSync(path.join(ROOT, "scripts", `${m[1]}.py`))) expect(BUILD_SCRIPTS, `${f} imports ${m[1]}`).toContain(`${m[1]}.py`);
      }
    }
  });

  it("changes with the weights' hashes, the packages, the export arguments and the recipe's name", () => {
    const base = keyOf();
    const recipe = inputs.recipe as { gguf_sha256: string; packages: { sha256: string; version: string }[]; export_args: string[] };
    const variants = [
      { ...recipe, gguf_sha256: "0".repeat(64) },
      { ...recipe, packages: recipe.packages.map((p, i) => (i === 0 ? { ...p, sha256: "f".repeat(64) } : p)) },
      { ...recipe, packages: recipe.packages.map((p, i) => (i === 0 ? { ...p, version: "9.9.9" } : p)) },
      { ...recipe, export_args: ["--weights", "int4"] },
    ];
    const keys = variants.map((recipe) => keyOf({ recipe }));
    for (const k of keys) expect(k).not.toBe(base);
    expect(new Set(keys).size).toBe(keys.length);
    expect(keyOf({ recipeName: "another-recipe" })).not.toBe(base);
  });

  it("changes with the converter's pinned versions, the Python and each format", () => {
    const base = keyOf();
    expect(keyWithFileChanged(inputs.requirements, (t) => t.replace("onnx==", "onnx==0.0.1+"))).not.toBe(base);
    expect(keyOf({ python: "Python 3.12.1" })).not.toBe(base);
    const formats = inputs.formats as Record<string, unknown>;
    for (const k of Object.keys(formats)) expect(keyOf({ formats: { ...formats, [k]: `${String(formats[k])}-next` } }), k).not.toBe(base);
  });

  it("the venv's key follows its requirements and the Python only", () => {
    const v = venvKey({ requirements: inputs.requirements, python: "Python 3.11.7" });
    expect(venvKey({ requirements: inputs.requirements, python: "Python 3.11.7" })).toBe(v);
    expect(venvKey({ requirements: inputs.requirements, python: "Python 3.12.1" })).not.toBe(v);
    const before = fs.readFileSync(inputs.requirements, "utf8");
    fs.writeFileSync(inputs.requirements, `${before}six==1.16.0\n`);
    try {
      expect(venvKey({ requirements: inputs.requirements, python: "Python 3.11.7" })).not.toBe(v);
    } finally {
      fs.writeFileSync(inputs.requirements, before);
    }
  });
});

describe("build cache entries", () => {
  it("lives where ASSAY_BUILD_CACHE says, else under the XDG cache folder", () => {
    expect(cacheRoot({ ASSAY_BUILD_CACHE: "/srv/assay-cache" })).toBe("/srv/assay-cache");
    expect(cacheRoot({ XDG_CACHE_HOME: "/var/cache/u" })).toBe("/var/cache/u/assay");
    expect(cacheRoot({})).toBe(path.join(os.homedir(), ".cache", "assay"));
  });

  it("records a step only once it is done, and forgets it when it is to run again", () => {
    const dir = fs.mkdtempSync(path.join(tmp, "entry-"));
    expect([...stagesDone(dir)]).toEqual([]);
    markStage(dir, "export");
    markStage(dir, "gpu");
    expect([...stagesDone(dir)].sort()).toEqual(["export", "gpu"]);
    unmarkStage(dir, "gpu");
    expect([...stagesDone(dir)]).toEqual(["export"]);
  });

  it("a checkout's folder becomes a link to the entry, an older real folder replaced", () => {
    const entry = fs.mkdtempSync(path.join(tmp, "entry-"));
    fs.writeFileSync(path.join(entry, "manifest.json"), "{}");
    const link = path.join(tmp, "checkout", "models", "cache", "b");
    fs.mkdirSync(link, { recursive: true });
    fs.writeFileSync(path.join(link, "stale.onnx"), "old");
    expect(pointAt(link, entry)).toBe(true);
    expect(fs.readlinkSync(link)).toBe(entry);
    expect(fs.existsSync(path.join(link, "manifest.json"))).toBe(true);
    expect(pointAt(link, entry)).toBe(false);
  });

  it("what a killed bootstrap left half-written is swept, whole entries kept", () => {
    const root = fs.mkdtempSync(path.join(tmp, "root-"));
    for (const p of ["builds/r-abc.partial-123/model.onnx", "builds/r-abc/manifest.json", "weights/r-1.partial", "weights/r-1.gguf"]) {
      fs.mkdirSync(path.dirname(path.join(root, p)), { recursive: true });
      fs.writeFileSync(path.join(root, p), "x");
    }
    sweepPartials(root);
    expect(fs.readdirSync(path.join(root, "builds"))).toEqual(["r-abc"]);
    expect(fs.readdirSync(path.join(root, "weights"))).toEqual(["r-1.gguf"]);
  });

  it("the lock is taken over from a holder that is gone, and let go after", () => {
    const root = fs.mkdtempSync(path.join(tmp, "root-"));
    fs.mkdirSync(path.join(root, "lock"));
    // A pid no process has: above the kernel's maximum.
    fs.writeFileSync(path.join(root, "lock", "pid"), String(2 ** 22 + 1));
    const said: string[] = [];
    expect(withLock(root, (m: string) => said.push(m), () => fs.readFileSync(path.join(root, "lock", "pid"), "utf8"))).toBe(String(process.pid));
    expect(said.join("\n")).toMatch(/taking over/);
    expect(fs.existsSync(path.join(root, "lock"))).toBe(false);
  });

  it("an async holder (the batch and GPU graphs written side by side) keeps the lock until it settles, resolved or rejected", async () => {
    const root = fs.mkdtempSync(path.join(tmp, "root-"));
    let finish!: () => void;
    const held = withLock(root, () => {}, () => new Promise<string>((resolve) => (finish = () => resolve("done")))) as Promise<string>;
    expect(fs.existsSync(path.join(root, "lock"))).toBe(true);
    finish();
    await expect(held).resolves.toBe("done");
    expect(fs.existsSync(path.join(root, "lock"))).toBe(false);
    await expect(withLock(root, () => {}, () => Promise.reject(new Error("step failed")))).rejects.toThrow("step failed");
    expect(fs.existsSync(path.join(root, "lock"))).toBe(false);
  });
});
