/**
 * The GPU path, run here: the 0.5B's GPU graph (scripts/gpu_graph.py, which `npm test`'s bootstrap
 * writes) on onnxruntime-node's WebGPU provider, through Mesa's llvmpipe, a software Vulkan device
 * (scripts/mesa-vulkan.sh installs it). llvmpipe runs the shaders on the CPU: this shows that the GPU
 * graph's products are placed on the GPU provider and what it answers, not how fast a GPU is
 * (bench/gpu-check.sh measures that on a GPU).
 *
 * Two comparisons. The same GPU graph on the CPU provider (a build folder whose model.onnx is it):
 * WebGPU must read what the CPU reads, up to float rounding (SAME_GRAPH). And the CPU server's own
 * graph (W8A8): the GPU graph computes in float32, so the two differ by the int8 quantization's
 * error, the same chosen options with the numbers within W8A8 (measured on the 0.5B: noul 0.039 mean,
 * 0.075 most, score 0.043 / 0.11 over 25 dev requests; this request, each question presented once, 0.054
 * and 0.056;
 * docs/experiments/gpu.md).
 */
import { execFile } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOT } from "../../src/config/index.js";
import { GPU_GRAPH } from "../../src/models/manifest.js";
import type { EnginePipeline } from "../../src/pipeline/index.js";
import type { Question, SystemOneResponse } from "../../src/validate/schema.js";
import { ask, oneBuildConfig, startEngine } from "./engine.js";

const SMALL = path.join(ROOT, "models", "cache", "qwen2.5-coder-0.5b-instruct");
const MODEL = "vendor/judge-9B";
const SAME_GRAPH = 0.005;
const W8A8 = { noul: 0.1, score: 0.2, probability: 0.1 };
/** Ops that carry a model's products: none may be placed on the CPU provider. */
const PRODUCTS = ["MatMul", "MatMulInteger", "MatMulNBits", "Gemm", "FusedMatMul", "Attention", "MultiHeadAttention", "GroupQueryAttention", "Softmax"];

const readme = (JSON.parse(fs.readFileSync(path.join(ROOT, "docs", "examples.json"), "utf8")) as { name: string; request: { state: string; questions: Record<string, Question> } }[]).find(
  (e) => e.name === "refund",
)!.request;

let dir: string;
let gpu: EnginePipeline | undefined;
let cpu: EnginePipeline | undefined;
let gpuGraphOnCpu: EnginePipeline | undefined;
let placement: Promise<{ stdout: string; stderr: string }>;

/** scripts/placement.mjs on the GPU graph, as a child process: its stdout (the placement as JSON) and stderr, whatever its exit. */
function placementOf(graph: string): Promise<{ stdout: string; stderr: string }> {
  return promisify(execFile)(process.execPath, [path.join(ROOT, "scripts", "placement.mjs"), graph, "webgpu"], { timeout: 300_000, maxBuffer: 64 << 20 }).catch(
    (e: { stdout?: string; stderr?: string }) => ({ stdout: e.stdout ?? "", stderr: e.stderr ?? "" }),
  );
}

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-webgpu-"));
  // The 0.5B's folder by links, with its GPU graph as model.onnx: the CPU provider runs the GPU graph.
  const asCpu = path.join(dir, "gpu-graph-on-cpu");
  fs.mkdirSync(asCpu);
  for (const f of ["manifest.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", `${GPU_GRAPH.file}.data`]) {
    if (fs.existsSync(path.join(SMALL, f))) fs.symlinkSync(path.join(SMALL, f), path.join(asCpu, f));
  }
  fs.symlinkSync(path.join(SMALL, GPU_GRAPH.file), path.join(asCpu, "model.onnx"));
  const slow = { ASSAY_REQUEST_TIMEOUT_MAX_MS: "1800000", ASSAY_REQUEST_TIMEOUT_MS: "1800000" };
  // The shortest passes that still read every kind of answer: each question presented once (no cyclic
  // shifts: on llvmpipe they doubled the request's time, 87 s against 44 s on the AVX-512 EPYC), the
  // same on all three engines, so each comparison is still one graph's reading against another's.
  const env = { ASSAY_PREFIX_CACHE_MB: "0", ASSAY_BATCH_MAX_TOKENS: "0", ASSAY_DEBIAS: "off" };
  // Started together, with the placement check's own session: each load is mostly one core's work.
  placement = placementOf(path.join(SMALL, GPU_GRAPH.file));
  [cpu, gpuGraphOnCpu, gpu] = await Promise.all([
    startEngine({ ...env, ASSAY_MODELS_CONFIG: oneBuildConfig(SMALL, MODEL), ASSAY_EXECUTION_PROVIDER: "cpu" }),
    startEngine({ ...env, ...slow, ASSAY_MODELS_CONFIG: oneBuildConfig(asCpu, MODEL), ASSAY_EXECUTION_PROVIDER: "cpu" }),
    startEngine({ ...env, ...slow, ASSAY_MODELS_CONFIG: oneBuildConfig(SMALL, MODEL), ASSAY_EXECUTION_PROVIDER: "webgpu" }),
  ]);
}, 600_000);

afterAll(async () => {
  for (const engine of [gpu, cpu, gpuGraphOnCpu]) await engine?.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

type Answers = SystemOneResponse["answers"];

/** The largest difference between two requests' answers, by kind; and whether every chosen option is the same. */
function distance(a: Answers, b: Answers): { noul: number; score: number; probability: number; sameChoices: boolean } {
  const d = { noul: 0, score: 0, probability: 0, sameChoices: true };
  for (const [id, x] of Object.entries(a)) {
    const y = b[id]!;
    if (x.type === "noul" && y.type === "noul") d.noul = Math.max(d.noul, Math.abs(x.noul - y.noul));
    if (x.type === "choice" && y.type === "choice") d.sameChoices &&= x.choice === y.choice;
    if (x.type === "score" && y.type === "score") d.score = Math.max(d.score, Math.abs(x.score - y.score));
    if ("probabilities" in x && "probabilities" in y) {
      for (const [k, p] of Object.entries(x.probabilities)) d.probability = Math.max(d.probability, Math.abs(p - (y.probabilities as Record<string, number>)[k]!));
    }
  }
  return d;
}

describe("the WebGPU provider on the GPU graph", () => {
  it("places every product of the GPU graph on the WebGPU provider", async () => {
    const r = await placement;
    const placed = JSON.parse(r.stdout) as { ok: boolean; error?: string; nodes: Record<string, Record<string, number>> };
    expect(placed.error, r.stderr.slice(-2000)).toBeUndefined();
    const onGpu = placed.nodes.WebGpuExecutionProvider ?? {};
    const onCpu = placed.nodes.CPUExecutionProvider ?? {};
    // The 0.5B: 7 products a layer (q, k, v, o, gate, up, down) in 24 layers, the two score and two
    // weighted-sum products of its attention, and the head; some fused to Gemm with their bias.
    expect((onGpu.MatMul ?? 0) + (onGpu.Gemm ?? 0)).toBeGreaterThanOrEqual(24 * 7);
    expect(Object.fromEntries(PRODUCTS.filter((op) => onCpu[op]).map((op) => [op, onCpu[op]]))).toEqual({});
  }, 300_000);

  it("serves the GPU graph, on the WebGPU provider", () => {
    expect(path.basename(gpu!.build(MODEL).build.onnxPath)).toBe(GPU_GRAPH.file);
    expect(path.basename(cpu!.build(MODEL).build.onnxPath)).toMatch(/^model(\.u8u8)?\.onnx$/);
    expect(gpu!.pool.laneCount).toBe(1);
  });

  it("answers the README's request as the GPU graph does on the CPU, and as the CPU server does up to its int8 quantization", async () => {
    const onGpu = await ask(gpu!, readme.state, readme.questions, MODEL);
    const sameGraph = await ask(gpuGraphOnCpu!, readme.state, readme.questions, MODEL);
    const server = await ask(cpu!, readme.state, readme.questions, MODEL);
    expect(onGpu.usage).toEqual(server.usage);
    const same = distance(onGpu.answers, sameGraph.answers);
    expect(same.sameChoices).toBe(true);
    expect(Math.max(same.noul, same.score, same.probability), JSON.stringify({ onGpu, sameGraph })).toBeLessThanOrEqual(SAME_GRAPH);
    const w8a8 = distance(onGpu.answers, server.answers);
    expect(w8a8.sameChoices).toBe(true);
    expect(w8a8.noul).toBeLessThanOrEqual(W8A8.noul);
    expect(w8a8.score).toBeLessThanOrEqual(W8A8.score);
    expect(w8a8.probability).toBeLessThanOrEqual(W8A8.probability);
    console.log(`[webgpu] README request, WebGPU vs the same graph on the CPU provider ${JSON.stringify(same)}; vs the CPU server (W8A8) ${JSON.stringify(w8a8)}`);
  }, 900_000);
});
