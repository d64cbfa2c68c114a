#!/usr/bin/env node
// Where onnxruntime places a graph's nodes on an execution provider, as JSON on stdout:
//   node scripts/placement.mjs GRAPH [webgpu|cuda|cpu]
//   {"provider":"webgpu","ok":true,"nodes":{"WebGpuExecutionProvider":{"MatMul":169,...},"CPUExecutionProvider":{...}}}
//   where it fails, "ok":false, "error" (onnxruntime's message) and "summary" (the same, short)
// onnxruntime says it only in its verbose log, which its native logger writes to this process's
// stderr: no API returns it. So this runs as a process of its own (the engine's tests and the
// device check spawn it), creates one session with verbose logging and reads its own stderr back.
// With ASSAY_PLACEMENT_CHILD set it is that child; otherwise it spawns itself and parses.
import { spawnSync } from "node:child_process";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const [graph, provider = "webgpu"] = process.argv.slice(2);
if (!graph) {
  console.error("usage: node scripts/placement.mjs GRAPH [webgpu|cuda|cpu]");
  process.exit(2);
}

if (process.env.ASSAY_PLACEMENT_CHILD) {
  // ASSAY_ORT_DIR: a folder holding node_modules/onnxruntime-node, where this checkout has none (the device check).
  const require = createRequire(path.join(process.env.ASSAY_ORT_DIR ?? path.join(path.dirname(fileURLToPath(import.meta.url)), ".."), "package.json"));
  const ort = require("onnxruntime-node");
  try {
    const session = await ort.InferenceSession.create(graph, {
      executionProviders: [provider],
      logSeverityLevel: 0,
      logVerbosityLevel: 0,
      graphOptimizationLevel: "all",
    });
    await session.release();
    process.exit(0);
  } catch (e) {
    console.error(`ASSAY_PLACEMENT_FAILED ${e instanceof Error ? e.message : String(e)}`);
    process.exit(3);
  }
}

const child = spawnSync(process.execPath, [fileURLToPath(import.meta.url), graph, provider], {
  env: { ...process.env, ASSAY_PLACEMENT_CHILD: "1" },
  encoding: "utf8",
  maxBuffer: 512 * 1024 * 1024,
});
const log = `${child.stdout ?? ""}${child.stderr ?? ""}`;
// onnxruntime's session log (each line behind its own "[V:onnxruntime:, session_state.cc:N Verify...]" prefix):
// per provider "Node(s) placed on [XExecutionProvider]. Number of nodes: N", then one "  OpType (node name)" line per node.
const nodes = {};
let current = null;
for (const line of log.split("\n")) {
  const body = /VerifyEachNodeIsAssignedToAnEp\](.*)$/.exec(line)?.[1];
  if (body === undefined) continue;
  const head = /Node\(s\) placed on \[(\w+)\]/.exec(body);
  if (head) {
    current = head[1];
    nodes[current] ??= {};
    continue;
  }
  const node = current && /^\s{2,}(\w+) \(/.exec(body);
  if (node) nodes[current][node[1]] = (nodes[current][node[1]] ?? 0) + 1;
}
const failed = /ASSAY_PLACEMENT_FAILED (.*)/.exec(log);
const out = { provider, graph, ok: child.status === 0, nodes };
if (!out.ok) {
  out.error = failed ? failed[1] : `exit ${child.status ?? child.signal}: ${log.split("\n").filter(Boolean).slice(-3).join(" | ")}`;
  // The same without onnxruntime's source paths and template signatures (a CUDA failure: its number, words and call).
  const cuda = /(CUDA failure \d+: [^;]*?)\s*;.*?expr=([^;]*);/.exec(out.error);
  out.summary = cuda ? `${cuda[1]} (${cuda[2].trim()})` : out.error.replace(/\/onnxruntime_src\/\S+ /g, "").replace(/std::conditional_t<.*?\] /g, "").slice(0, 400);
}
console.log(JSON.stringify(out));
process.exit(out.ok ? 0 : 1);
