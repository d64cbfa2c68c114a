#!/usr/bin/env node
// The device check's timing: the engine's packed passes (bench/gpu-check-passes.json, written by
// `npm run bench -- gpu-passes`) run on a build folder's graphs, per execution provider, in one process:
//   GPU providers (webgpu, cuda): model.gpu.onnx (scripts/gpu_graph.py)
//   cpu:                          model.onnx (the W8A8 graph the CPU serves)
// and tokens per second for each cell, with each GPU provider's figure over the CPU's (same machine,
// same run). Node built-ins and onnxruntime-node only (ASSAY_ORT_DIR: a folder holding
// node_modules/onnxruntime-node, where the repository's own node_modules is absent): a lent GPU
// machine has no build of this repository. bench/gpu-check.sh runs it; so can anyone:
//   node bench/gpu-check.mjs --graphs models/cache/qwen2.5-coder-0.5b-instruct --providers webgpu,cpu
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
    providers: { type: "string", default: "webgpu,cpu" },
    cells: { type: "string", default: "primary,wide,small" },
    runs: { type: "string", default: "5" },
    "cpu-runs": { type: "string", default: "1" },
    concurrent: { type: "string", default: "8" },
    out: { type: "string" },
    label: { type: "string", default: "" },
  },
});
if (!o.graphs) {
  console.error("usage: node bench/gpu-check.mjs --graphs BUILD_DIR [--providers webgpu,cpu] [--cells primary,wide,small] [--runs 5] [--out FILE]");
  process.exit(2);
}
const require = createRequire(path.join(process.env.ASSAY_ORT_DIR ?? path.join(HERE, ".."), "package.json"));
const ort = require("onnxruntime-node");

const fixture = JSON.parse(fs.readFileSync(path.join(HERE, "gpu-check-passes.json"), "utf8"));
const facts = JSON.parse(fs.readFileSync(path.join(o.graphs, "model.gpu.json"), "utf8"));
const kv = facts.kv;
const runs = Number(o.runs);
// The CPU column is the comparison point: one timed run by default, so that the whole check fits a short lease.
const cpuRuns = Number(o["cpu-runs"]);
const concurrent = Number(o.concurrent);
const cells = o.cells.split(",");

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

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

async function measure(provider) {
  const graph = path.join(o.graphs, provider === "cpu" ? "model.onnx" : "model.gpu.onnx");
  const t0 = performance.now();
  const ep = provider === "cuda" ? { name: "cuda", deviceId: 0 } : provider;
  const session = await ort.InferenceSession.create(graph, {
    executionProviders: [ep],
    graphOptimizationLevel: "all",
    interOpNumThreads: 1,
    intraOpNumThreads: Math.max(1, os.availableParallelism()),
  });
  const loadMs = performance.now() - t0;
  const rows = [];
  for (const cell of cells) {
    // A request's passes, as the engine ran them one after another (the prefix cache's keys fetched where it kept them).
    const passes = fixture.passes[cell].map((p) => ({ feeds: feeds(p), fetches: p.keep > 0 ? ["logprobs", "present_kv"] : ["logprobs"] }));
    const request = async () => {
      for (const p of passes) await session.run(p.feeds, p.fetches);
    };
    const T = fixture.passes[cell].reduce((n, p) => n + p.inputIds.length, 0);
    const w0 = performance.now();
    await request(); // the first run of a shape compiles its kernels
    const firstMs = performance.now() - w0;
    const n = cell === "small" ? concurrent : 1;
    const times = [];
    for (let r = 0; r < (provider === "cpu" ? cpuRuns : runs); r++) {
      const s = performance.now();
      for (let i = 0; i < n; i++) await request();
      times.push(performance.now() - s);
    }
    const ms = median(times);
    rows.push({ cell, tokens: T * n, passes: passes.length * n, requests: n, first_ms: Math.round(firstMs), ms: Math.round(ms * 10) / 10, tok_s: Math.round(((T * n) / ms) * 1000) });
    console.error(`[gpu-check] ${provider} ${cell}: ${T * n} tokens in ${passes.length * n} passes, ${ms.toFixed(1)} ms (${rows.at(-1).tok_s} tok/s; first run ${firstMs.toFixed(0)} ms)`);
  }
  await session.release();
  return { provider, graph: path.basename(graph), load_ms: Math.round(loadMs), rows };
}

const results = [];
for (const provider of o.providers.split(",")) {
  try {
    results.push(await measure(provider));
  } catch (e) {
    results.push({ provider, error: e instanceof Error ? e.message.split("\n")[0] : String(e) });
    console.error(`[gpu-check] ${provider}: ${results.at(-1).error}`);
  }
}

const cpu = results.find((r) => r.provider === "cpu" && r.rows);
const lines = [
  `device check ${o.label} (${facts.weights} GPU graph, ${os.cpus()[0]?.model ?? "?"} × ${os.availableParallelism()}, onnxruntime-node ${ort.env.versions?.node ?? "?"})`,
  "",
  "| cell | passes | tokens | provider | graph | p50 ms | tokens/s | × CPU |",
  "|---|---|---|---|---|---|---|---|",
];
for (const r of results) {
  if (!r.rows) {
    lines.push(`| – | – | – | ${r.provider} | – | failed: ${r.error} | – | – |`);
    continue;
  }
  for (const row of r.rows) {
    const base = cpu?.rows.find((c) => c.cell === row.cell);
    const ratio = base ? (row.tok_s / base.tok_s).toFixed(2) : "–";
    const cell = row.requests > 1 ? `${row.cell} × ${row.requests}` : row.cell;
    lines.push(`| ${cell} | ${row.passes} | ${row.tokens} | ${r.provider} | ${r.graph} | ${row.ms} | ${row.tok_s} | ${ratio} |`);
  }
}
console.log(lines.join("\n"));
if (o.out) fs.writeFileSync(o.out, JSON.stringify({ label: o.label, facts, cells: fixture.cells, results }, null, 2));
process.exit(results.some((r) => r.error) ? 1 : 0);
