/**
 * The llama.cpp baseline through node-llama-cpp (a devDependency; its
 * prebuilt CPU binaries come from the npm registry as @node-llama-cpp/*
 * platform packages). Nothing is downloaded or built at run time: `build:
 * "never"`, `skipDownload: true`.
 *
 * It evaluates exactly the token ids assay packs (assay's tokenizer, same
 * vocabulary), on the GGUF file the default model was exported from, so
 * both engines do the same work on the same weights (llama.cpp on the
 * GGUF's own quantization, assay on its int8 export of it).
 */
import fs from "node:fs";
import path from "node:path";
import type { Token } from "node-llama-cpp";
import { ROOT } from "../src/config/index.js";

export interface LlamaBaseline {
  description: string;
  /** One causal pass of `tokens` from an empty context (the last token's logits computed); ms. */
  evaluate(tokens: number[]): Promise<number>;
  /**
   * The state read once and each question after it: evaluate `prefix`, then
   * for each suffix evaluate it and erase it from the KV cache again (what a
   * llama.cpp server does with prompt caching); ms for the whole request.
   */
  sharedPrefix(prefix: number[], suffixes: number[][]): Promise<number>;
  close(): Promise<void>;
}

export async function openLlama(opts: { gguf: string; threads: number; contextSize: number }): Promise<LlamaBaseline> {
  if (!fs.existsSync(opts.gguf)) throw new Error(`GGUF file ${opts.gguf} does not exist (run npm start or npm test once to bootstrap it, or pass --gguf)`);
  let mod: typeof import("node-llama-cpp");
  try {
    mod = await import("node-llama-cpp");
  } catch (e) {
    throw new Error(`node-llama-cpp is not installed (npm install): ${(e as Error).message}`);
  }
  const { getLlama, LlamaLogLevel } = mod;
  const llama = await getLlama({
    gpu: false,
    build: "never",
    skipDownload: true,
    usePrebuiltBinaries: true,
    progressLogs: false,
    maxThreads: opts.threads,
    logLevel: LlamaLogLevel.error,
  });
  const model = await llama.loadModel({ modelPath: opts.gguf });
  const context = await model.createContext({ contextSize: opts.contextSize, threads: { ideal: opts.threads, min: opts.threads } });
  const seq = context.getSequence();
  const pkg = JSON.parse(fs.readFileSync(path.join(ROOT, "node_modules", "node-llama-cpp", "package.json"), "utf8")) as {
    version: string;
  };
  const description =
    `node-llama-cpp ${pkg.version} (llama.cpp ${llama.llamaCppRelease.release}, ${llama.buildType} binary, CPU), ` +
    `${opts.threads} threads, context ${opts.contextSize}, batch ${context.batchSize}, flash attention ${context.flashAttention}`;
  return {
    description,
    async evaluate(tokens) {
      await seq.clearHistory();
      const t = performance.now();
      await seq.evaluateWithoutGeneratingNewTokens(tokens as Token[]);
      return performance.now() - t;
    },
    async sharedPrefix(prefix, suffixes) {
      await seq.clearHistory();
      const t = performance.now();
      await seq.evaluateWithoutGeneratingNewTokens(prefix as Token[]);
      for (const s of suffixes) {
        await seq.evaluateWithoutGeneratingNewTokens(s as Token[]);
        await seq.eraseContextTokenRanges([{ start: prefix.length, end: prefix.length + s.length }]);
      }
      return performance.now() - t;
    },
    async close() {
      await context.dispose();
      await model.dispose();
      await llama.dispose();
    },
  };
}
