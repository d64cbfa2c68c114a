#!/usr/bin/env node
// The device check's timing: the engine's packed passes (bench/gpu-check-passes.json, written by
// `npm run bench -- gpu-passes`) run on a build folder's graphs, one lane after another in one process:
//   cuda, webgpu:            model.gpu.onnx   (scripts/gpu_graph.py, float32 products)
//   cuda-fp16, webgpu-fp16:  model.gpu16.onnx (scripts/half_graph.py, half-precision products)
//   cpu:                     model.onnx       (the W8A8 graph the CPU serves)
// and tokens per second for each cell. Each lane's figures go to RESULTS/LANE.json; the table printed
// at the end reads every lane file in RESULTS, those of earlier calls and the PyTorch peer's
// (bench/gpu-peer.py writes RESULTS/peer.json in the same form) included, and gives each figure over
// the CPU's and over the peer's (same machine). A lane that fails (a provider that does not load, a
// driver too old for its CUDA) is a row that says why, not a crash.
// Node built-ins and onnxruntime-node only (ASSAY_ORT_DIR: a folder holding node_modules/onnxruntime-node,
// where the repository's own node_modules is absent): a lent GPU machine has no build of this repository.
// bench/gpu-check.sh runs it; so can anyone:
//   node bench/gpu-check.mjs --graphs models/cache/qwen2.5-coder-0.5b-instruct --lanes webgpu,cpu --results /tmp/r --table
//   node bench/gpu-check.mjs --graphs DIR --lanes '' --results DIR2 --table   the table of what DIR2 holds, measuring nothing
import fs from "node:fs";
import { createRequire } from "node:module";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const { values: o } = parseArgs({
  options: {
    graphs: { type: "string" },
    lanes: { type: "string", default: "webgpu,cpu" },
    providers: { type: "string" }, // the former name of --lanes
    cells: { type: "string", default: "" },
    runs: { type: "string", default: "3" },
    "cpu-runs": { type: "string", default: "1" },
    concurrent: { type: "string", default: "8" },
    "budget-s": { type: "string", default: "0" },
    results: { type: "string" },
    out: { type: "string" },
    label: { type: "string", default: "" },
    table: { type: "boolean", default: false },
  },
});
if (!o.graphs) {
  console.error("usage: node bench/gpu-check.mjs --graphs BUILD_DIR [--lanes cuda,cuda-fp16,webgpu,cpu] [--cells primary,wide,small] [--runs 3] [--budget-s S] [--results DIR] [--table] [--out FILE]");
  process.exit(2);
}
const fixture = JSON.parse(fs.readFileSync(path.join(HERE, "gpu-check-passes.json"), "utf8"));
const factsFile = path.join(o.graphs, "model.gpu.json");
const facts = fs.existsSync(factsFile) ? JSON.parse(fs.readFileSync(factsFile, "utf8")) : {};
const kv = facts.kv;
const runs = Number(o.runs);
// The CPU column is the comparison point: one timed run by default, so that the whole check fits a short lease.
const cpuRuns = Number(o["cpu-runs"]);
const concurrent = Number(o.concurrent);
// A lane's time (0: none): a cell's timed runs are cut to what is left of it after its first run, down to
// none, and then its first run is its figure (one request). A slow lane must not eat a short lease.
const budgetMs = Number(o["budget-s"]) * 1000;
const cells = o.cells ? o.cells.split(",") : Object.keys(fixture.passes);
const lanes = (o.providers ?? o.lanes).split(",").filter(Boolean);
const resultsDir = o.results ?? fs.mkdtempSync(path.join(os.tmpdir(), "gpu-check-"));
fs.mkdirSync(resultsDir, { recursive: true });

/** A lane's provider and graph: `cuda-fp16` is the CUDA provider on model.gpu16.onnx. */
function lane(name) {
  const [provider, half] = name.split("-");
  if (!["cuda", "webgpu", "cpu"].includes(provider) || (half && (half !== "fp16" || provider === "cpu"))) throw new Error(`unknown lane ${name}`);
  return { provider, graph: provider === "cpu" ? "model.onnx" : half ? "model.gpu16.onnx" : "model.gpu.onnx" };
}

let ort;
function runtime() {
  const require = createRequire(path.join(process.env.ASSAY_ORT_DIR ?? path.join(HERE, ".."), "package.json"));
  ort ??= require("onnxruntime-node");
  return ort;
}

/** One recorded pass's feeds: a pass that continued a cached prefix gets that many zero keys and values. */
function feeds(p) {
  const i64 = (a, dims) => new ort.Tensor("int64", BigInt64Array.from(a, BigInt), dims);
  const T = p.inputIds.length;
  const past = [2, kv.layers, kv.kv_heads, p.pastTokens, kv.head_dim];
  return {
    input_ids: i64(p.inputIds, [T]),
    position_ids: i64(p.positionIds, [T]),
    subtree_end: i64(p.subtreeEnd, [T]),
    gather_idx: i64(p.gatherIdx, [p.rows]),
    target_ids: i64(p.targetIds, [p.rows, p.width]),
    branch_slots: i64(p.branchSlots, [p.branches, p.branchWidth]),
    slot_of: i64(p.slotOf, [p.slotOf.length]),
    past_kv: new ort.Tensor("float32", new Float32Array(past.reduce((a, b) => a * b, 1)), past),
  };
}

/** onnxruntime's error without its source paths and template signatures: a CUDA failure as its number, words and call. */
function brief(msg) {
  const cuda = /(CUDA failure \d+: [^;]*?)\s*;.*?expr=([^;]*);/s.exec(msg);
  if (cuda) return `${cuda[1]} (${cuda[2].trim()})`;
  return msg.replace(/\/onnxruntime_src\/\S+ /g, "").replace(/std::conditional_t<.*?\] /gs, "").replaceAll("\n", " ").slice(0, 400);
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const host = () => `${os.cpus()[0]?.model?.trim() ?? "?"} × ${os.availableParallelism()}`;

async function measure(name) {
  const { provider, graph } = lane(name);
  runtime();
  const file = path.join(o.graphs, graph);
  if (!fs.existsSync(file)) throw new Error(`${graph} is not in ${o.graphs}`);
  const t0 = performance.now();
  const ep = provider === "cuda" ? { name: "cuda", deviceId: 0 } : provider;
  const runner = await ort.InferenceSession.create(file, {
    executionProviders: [ep],
    graphOptimizationLevel: "all",
    interOpNumThreads: 1,
    intraOpNumThreads: Math.max(1, os.availableParallelism()),
  });
  const loadMs = performance.now() - t0;
  const laneStart = performance.now();
  const rows = [];
  for (const cell of cells) {
    if (!fixture.passes[cell]) throw new Error(`bench/gpu-check-passes.json records no cell ${cell} (it has ${Object.keys(fixture.passes).join(", ")})`);
    // A request's passes, as the engine ran them one after another (the prefix cache's keys fetched where it kept them).
    const passes = fixture.passes[cell].map((p) => ({ feeds: feeds(p), fetches: p.keep > 0 ? ["logprobs", "present_kv"] : ["logprobs"] }));
    const request = async () => {
      for (const p of passes) await runner.run(p.feeds, p.fetches);
    };
    const T = fixture.passes[cell].reduce((n, p) => n + p.inputIds.length, 0);
    const w0 = performance.now();
    await request(); // the first run of a shape compiles its kernels
    const firstMs = performance.now() - w0;
    let todo = provider === "cpu" ? cpuRuns : runs;
    const reqs = cell === "small" ? concurrent : 1;
    if (budgetMs > 0) todo = Math.max(0, Math.min(todo, Math.floor((budgetMs - (performance.now() - laneStart)) / (firstMs * reqs))));
    const firstOnly = todo === 0;
    const n = firstOnly ? 1 : reqs;
    const times = firstOnly ? [firstMs] : [];
    for (let r = 0; r < todo; r++) {
      const s = performance.now();
      for (let i = 0; i < n; i++) await request();
      times.push(performance.now() - s);
    }
    const ms = median(times);
    rows.push({ cell, tokens: T * n, passes: passes.length * n, requests: n, runs: firstOnly ? 0 : times.length, ...(firstOnly ? { first_only: true } : {}), first_ms: Math.round(firstMs), ms: Math.round(ms * 10) / 10, tok_s: Math.round(((T * n) / ms) * 1000) });
    console.error(`[gpu-check] ${name} ${cell}: ${T * n} tokens in ${passes.length * n} passes, ${ms.toFixed(1)} ms (${rows.at(-1).tok_s} tok/s; first run ${firstMs.toFixed(0)} ms)`);
  }
  await runner.release();
  return { lane: name, provider, graph, load_ms: Math.round(loadMs), rows };
}

let failed = false;
for (const name of lanes) {
  let r;
  try {
    r = await measure(name);
  } catch (e) {
    failed = true;
    const full = e instanceof Error ? e.message : String(e);
    r = { lane: name, provider: name.split("-")[0], error: brief(full), error_full: full };
    console.error(`[gpu-check] ${name}: ${r.error}`);
  }
  Object.assign(r, { runtime: `onnxruntime-node ${ort?.env.versions?.node ?? "?"}`, host: host(), at: new Date().toISOString() });
  fs.writeFileSync(path.join(resultsDir, `${name}.json`), JSON.stringify(r, null, 2));
}

if (!o.table) process.exit(failed ? 1 : 0);

// The table (--table): every lane file in the results folder, this call's and earlier ones'.
const ORDER = ["cuda", "cuda-fp16", "webgpu", "webgpu-fp16", "cpu", "peer", "peer-batch"];
const rank = (l) => (ORDER.includes(l) ? ORDER.indexOf(l) : ORDER.length);
const results = fs.readdirSync(resultsDir).filter((f) => f.endsWith(".json")).map((f) => JSON.parse(fs.readFileSync(path.join(resultsDir, f), "utf8")))
  .filter((r) => r.lane).sort((a, b) => rank(a.lane) - rank(b.lane));
const byLane = (l) => results.find((r) => r.lane === l && r.rows);
const cpu = byLane("cpu");
const peer = byLane("peer");
const shape = (cell) => {
  const c = fixture.cells[cell];
  return c ? `${c.state} × ${c.questions} × ${c.options}` : "?";
};
const fmt = (x) => x.toLocaleString("en-US");
const ratio = (row, base) => {
  // tokens per second of one request or of several one after another alike; a batch is compared with the requests one after another.
  const b = base?.rows.find((c) => c.cell === row.cell && !c.batched);
  return b ? (row.tok_s / b.tok_s).toFixed(2) : "–";
};
const gpu = process.env.GPU_CHECK_GPU;
const lines = [
  `device check ${o.label}${gpu ? `, ${gpu}` : ""} (random weights; ${results[0]?.host ?? host()})`,
  "",
  "| cell (state × questions × options) | passes | tokens | lane | graph | p50 ms | tokens/s | × CPU | × peer |",
  "|---|---|---|---|---|---|---|---|---|",
];
const shown = [...new Set([...cells, ...results.flatMap((r) => r.rows?.map((x) => x.cell) ?? [])])].filter((c) => results.some((r) => r.rows?.some((x) => x.cell === c)));
for (const cell of shown) {
  for (const r of results) {
    for (const row of r.rows?.filter((x) => x.cell === cell) ?? []) {
      const name = (row.requests > 1 ? `${cell} × ${row.requests}${row.batched ? ", one batch" : ""}` : cell) + (row.first_only ? ", first run only" : "");
      lines.push(`| ${name} (${shape(cell)}) | ${fmt(row.passes)} | ${fmt(row.tokens)} | ${r.lane} | ${r.graph} | ${fmt(row.ms)} | ${fmt(row.tok_s)} | ${ratio(row, cpu)} | ${ratio(row, peer)} |`);
    }
  }
}
for (const r of results.filter((x) => !x.rows)) lines.push(`| – | – | – | ${r.lane} | – | failed: ${r.error.replaceAll("|", "/")} | – | – | – |`);
lines.push("");
for (const r of results.filter((x) => x.rows)) lines.push(`${r.lane}: ${r.runtime}${r.device ? `, ${r.device}` : ""}, ${r.graph} loaded in ${fmt(r.load_ms)} ms, ${r.rows.map((x) => `${x.cell} ${x.first_only ? "first run only" : `${x.runs} timed after a first`}`).join(", ")}${r.note ? `; ${r.note}` : ""}`);
console.log(lines.join("\n"));
if (o.out) fs.writeFileSync(o.out, JSON.stringify({ label: o.label, gpu, facts, cells: fixture.cells, results }, null, 2));
process.exit(failed ? 1 : 0);
