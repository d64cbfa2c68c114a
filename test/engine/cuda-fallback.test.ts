/**
 * A CUDA lane that cannot start CUDA (this machine has no GPU, and the npm
 * package's CUDA binaries are not installed) and is allowed to fall back
 * (ASSAY_CUDA_FALLBACK_CPU=1) runs on the CPU, on the real model, and
 * answers exactly as the CPU provider does. With the CUDA provider the engine
 * picks a build's s8 × s8 graph (models/int8.ts); the fallen-back lane runs
 * the graph this CPU runs exactly in its place (LaneOptions.cpuGraph). The
 * build here is the 0.5B's folder by links, with `model.s8s8.onnx` an empty
 * file: a lane that did not swap it would fail to load.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ROOT } from "../../src/config/index.js";
import type { EnginePipeline } from "../../src/pipeline/index.js";
import { ask, startEngine } from "./engine.js";

const SMALL = path.join(ROOT, "models", "cache", "qwen2.5-coder-0.5b-instruct");
const MODEL = "vendor/judge-9B";
const STATE = "The parcel was left at the neighbour's door because nobody was home. The customer asks for it to be redelivered.";
const QUESTIONS = {
  redeliver: { type: "noul" as const, instructions: "Does the customer want the parcel delivered again?" },
  topic: { type: "choice" as const, instructions: "What is this about?", criteria: { delivery: null, billing: null, sizing: null } },
};

let dir: string;
let cuda: EnginePipeline | undefined;
let cpu: EnginePipeline | undefined;

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-cuda-fallback-"));
  const build = path.join(dir, "build");
  fs.mkdirSync(build);
  for (const f of fs.readdirSync(SMALL)) if (f !== "model.s8s8.onnx" && f !== "model.s8s8.onnx.data") fs.symlinkSync(path.join(SMALL, f), path.join(build, f));
  fs.writeFileSync(path.join(build, "model.s8s8.onnx"), "");
  const config = path.join(dir, "models.json");
  fs.writeFileSync(
    config,
    JSON.stringify({ default: MODEL, builds: { "qwen2.5-coder-0.5b": { dir: build } }, models: { [MODEL]: { family: "general", build: "qwen2.5-coder-0.5b" } } }),
  );
  const env = { ASSAY_MODELS_CONFIG: config, ASSAY_PREFIX_CACHE_MB: "0" };
  cuda = await startEngine({ ...env, ASSAY_EXECUTION_PROVIDER: "cuda", ASSAY_CUDA_DEVICES: "0", ASSAY_CUDA_FALLBACK_CPU: "1" });
  cpu = await startEngine({ ...env, ASSAY_EXECUTION_PROVIDER: "cpu" });
}, 300_000);

afterAll(async () => {
  await cuda?.close();
  await cpu?.close();
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
});
