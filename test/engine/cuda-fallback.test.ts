/**
 * A CUDA lane that cannot start CUDA (this machine has no GPU, and the npm
 * package's CUDA binaries are not installed) and is allowed to fall back
 * (ASSAY_CUDA_FALLBACK_CPU=1, the earlier name of ASSAY_GPU_FALLBACK_CPU) runs
 * on the CPU, on the real model, and answers exactly as the CPU provider does.
 * With the CUDA provider the engine picks a build's half-precision GPU graph, else its
 * float32 GPU graph (models/manifest.ts, gpuGraph), or its s8 × s8 graph (models/int8.ts) where it has neither; the
 * fallen-back lane runs the graph this CPU runs exactly in its place
 * (LaneOptions.cpuGraph). The builds here are the 0.5B's folder by links, with
 * the graph CUDA would run an empty file: a lane that did not swap it would fail to load.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOT } from "../../src/config/index.js";
import { GPU16_GRAPH, GPU_GRAPH } from "../../src/models/manifest.js";
import type { EnginePipeline } from "../../src/pipeline/index.js";
import { ask, oneBuildConfig, startEngine } from "./engine.js";

const SMALL = path.join(ROOT, "models", "cache", "qwen2.5-coder-0.5b-instruct");
const MODEL = "vendor/judge-9B";
const STATE = "The parcel was left at the neighbour's door because nobody was home. The customer asks for it to be redelivered.";
const QUESTIONS = {
  redeliver: { type: "noul" as const, instructions: "Does the customer want the parcel delivered again?" },
  topic: { type: "choice" as const, instructions: "What is this about?", criteria: { delivery: null, billing: null, sizing: null } },
};

let dir: string;
let cuda: EnginePipeline | undefined;
let cudaGpuGraph: EnginePipeline | undefined;
let cudaHalfGraph: EnginePipeline | undefined;
let cpu: EnginePipeline | undefined;

/** The 0.5B's folder by links, but for `empty`: an empty file; and without the files `drop`. */
function buildLike(name: string, empty: string, drop: (f: string) => boolean): string {
  const build = path.join(dir, name);
  fs.mkdirSync(build);
  for (const f of fs.readdirSync(SMALL)) if (f !== empty && !drop(f)) fs.symlinkSync(path.join(SMALL, f), path.join(build, f));
  fs.writeFileSync(path.join(build, empty), "");
  return build;
}

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-cuda-fallback-"));
  // No GPU graph: CUDA's is the s8 x s8 graph. A GPU graph: CUDA's is it.
  // No GPU graph: CUDA's is the s8 x s8 graph. A GPU graph: CUDA's is it. A half-precision one beside it: CUDA's is that.
  const int8 = buildLike("int8", "model.s8s8.onnx", (f) => f.startsWith("model.gpu") || f.startsWith("model.s8s8."));
  const gpu = buildLike("gpu", "model.gpu.onnx", (f) => f.startsWith("model.gpu"));
  const half = buildLike("half", "model.gpu16.onnx", (f) => f.startsWith("model.gpu"));
  const { build_hash } = JSON.parse(fs.readFileSync(path.join(SMALL, "manifest.json"), "utf8")) as { build_hash: string };
  for (const b of [gpu, half]) fs.writeFileSync(path.join(b, GPU_GRAPH.facts), JSON.stringify({ format: GPU_GRAPH.format, build_hash, weights: "float32" }));
  fs.writeFileSync(path.join(half, GPU_GRAPH.file), "");
  fs.writeFileSync(path.join(half, GPU16_GRAPH.facts), JSON.stringify({ format: GPU16_GRAPH.format, build_hash, dtype: "float16" }));
  const env = { ASSAY_PREFIX_CACHE_MB: "0" };
  const fallback = { ASSAY_EXECUTION_PROVIDER: "cuda", ASSAY_CUDA_DEVICES: "0", ASSAY_CUDA_FALLBACK_CPU: "1" };
  // Started together: a load is mostly one core's work (the CUDA provider's refusal, the graph's optimization).
  [cuda, cudaGpuGraph, cudaHalfGraph, cpu] = await Promise.all([
    startEngine({ ...env, ...fallback, ASSAY_MODELS_CONFIG: oneBuildConfig(int8, MODEL) }),
    startEngine({ ...env, ...fallback, ASSAY_MODELS_CONFIG: oneBuildConfig(gpu, MODEL) }),
    startEngine({ ...env, ...fallback, ASSAY_MODELS_CONFIG: oneBuildConfig(half, MODEL) }),
    startEngine({ ...env, ASSAY_EXECUTION_PROVIDER: "cpu", ASSAY_MODELS_CONFIG: oneBuildConfig(SMALL, MODEL) }),
  ]);
}, 300_000);

afterAll(async () => {
  for (const engine of [cuda, cudaGpuGraph, cudaHalfGraph, cpu]) await engine?.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

describe("a CUDA lane that falls back to the CPU", () => {
  it("picks the s8 x s8 graph for CUDA, runs this CPU's exact graph in its place, and answers as the CPU provider does", async () => {
    expect(path.basename(cuda!.build(MODEL).build.onnxPath)).toBe("model.s8s8.onnx");
    expect(path.basename(cpu!.build(MODEL).build.onnxPath)).toMatch(/^model(\.u8u8)?\.onnx$/);
    const a = await ask(cuda!, STATE, QUESTIONS, MODEL);
    const b = await ask(cpu!, STATE, QUESTIONS, MODEL);
    expect(a.answers).toEqual(b.answers);
  });

  it("picks the GPU graph for CUDA where the build has one, runs this CPU's exact graph in its place, and answers as the CPU provider does", async () => {
    expect(path.basename(cudaGpuGraph!.build(MODEL).build.onnxPath)).toBe("model.gpu.onnx");
    const a = await ask(cudaGpuGraph!, STATE, QUESTIONS, MODEL);
    const b = await ask(cpu!, STATE, QUESTIONS, MODEL);
    expect(a.answers).toEqual(b.answers);
  });

  it("picks the half-precision GPU graph for CUDA where the build has one, runs this CPU's exact graph in its place, and answers as the CPU provider does", async () => {
    expect(path.basename(cudaHalfGraph!.build(MODEL).build.onnxPath)).toBe(GPU16_GRAPH.file);
    const a = await ask(cudaHalfGraph!, STATE, QUESTIONS, MODEL);
    const b = await ask(cpu!, STATE, QUESTIONS, MODEL);
    expect(a.answers).toEqual(b.answers);
  });
});
