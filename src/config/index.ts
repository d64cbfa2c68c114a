import path from "node:path";
import os from "node:os";
import { fileURLToPath } from "node:url";
import { z } from "zod";

/** Repository root (src/config → ../..; dist/src/config → ../../..). */
export const ROOT = (() => {
  let dir = path.dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < 5; i++) {
    if (path.basename(dir) === "src" || path.basename(dir) === "dist") {
      const up = path.dirname(dir);
      return path.basename(up) === "dist" ? path.dirname(up) : up;
    }
    dir = path.dirname(dir);
  }
  return process.cwd();
})();

const bool = z
  .enum(["1", "0", "true", "false", "yes", "no"])
  .transform((v) => v === "1" || v === "true" || v === "yes");

/** Every setting, its default and its unit, validated once at boot. */
const Env = z.object({
  PORT: z.coerce.number().int().min(0).max(65535).default(8000),
  HOST: z.string().default("127.0.0.1"),
  LOG_LEVEL: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info"),
  /** Where the embedded store (SQLite) and the first-start key file live. */
  ASSAY_DATA_DIR: z.string().default(path.join(ROOT, ".cache", "state")),
  /** Exported model folders (manifest.json, model.onnx, tokenizer.json). */
  ASSAY_MODELS_DIR: z.string().default(path.join(ROOT, "models", "cache")),
  /** Public model names → model folders; see models/README.md. */
  ASSAY_MODELS_CONFIG: z.string().default(path.join(ROOT, "models", "models.json")),
  /** `cpu` or `cuda`. */
  ASSAY_EXECUTION_PROVIDER: z.enum(["cpu", "cuda"]).default("cpu"),
  /** Comma-separated CUDA device ids: one worker per GPU. */
  ASSAY_CUDA_DEVICES: z.string().default("0"),
  /** Start on CPU when CUDA cannot start (otherwise boot fails). */
  ASSAY_CUDA_FALLBACK_CPU: bool.default(false),
  /** CPU workers (each owns one onnxruntime session per model). */
  ASSAY_WORKERS: z.coerce.number().int().min(1).optional(),
  /** onnxruntime intra-op threads per worker; workers × threads ≈ cores. */
  ASSAY_INTRA_OP_THREADS: z.coerce.number().int().min(1).optional(),
  /** Requests waiting for a worker beyond which the service answers 529. */
  ASSAY_QUEUE_MAX: z.coerce.number().int().min(0).default(64),
  /** Longest packed sequence (state + questions + label tokens) one request may need. */
  ASSAY_MAX_PACKED_TOKENS: z.coerce.number().int().min(64).default(8192),
  /** Remove option-position bias by averaging over cyclic shifts (choice/score). */
  ASSAY_DEBIAS: z.enum(["off", "cyclic"]).default("off"),
});

export type Config = Readonly<{
  port: number;
  host: string;
  logLevel: z.infer<typeof Env>["LOG_LEVEL"];
  dataDir: string;
  modelsDir: string;
  modelsConfig: string;
  provider: "cpu" | "cuda";
  cudaDevices: number[];
  cudaFallbackCpu: boolean;
  workers: number;
  intraOpThreads: number;
  queueMax: number;
  maxPackedTokens: number;
  debias: "off" | "cyclic";
}>;

export function loadConfig(env: NodeJS.ProcessEnv = process.env, overrides: Partial<Config> = {}): Config {
  const parsed = Env.safeParse(env);
  if (!parsed.success) {
    const msg = parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ");
    throw new Error(`invalid configuration: ${msg}`);
  }
  const e = parsed.data;
  const cores = Math.max(1, os.availableParallelism());
  const cudaDevices = e.ASSAY_CUDA_DEVICES.split(",").map((s) => Number(s.trim()));
  if (cudaDevices.some((d) => !Number.isInteger(d) || d < 0)) {
    throw new Error(`invalid configuration: ASSAY_CUDA_DEVICES must list device ids, got "${e.ASSAY_CUDA_DEVICES}"`);
  }
  // One worker per GPU; on CPU one worker using every core, because a single
  // packed forward pass already fills the cores and two would fight for cache.
  const workers = e.ASSAY_WORKERS ?? (e.ASSAY_EXECUTION_PROVIDER === "cuda" ? cudaDevices.length : 1);
  const intraOpThreads = e.ASSAY_INTRA_OP_THREADS ?? Math.max(1, Math.floor(cores / workers));
  return Object.freeze({
    port: e.PORT,
    host: e.HOST,
    logLevel: e.LOG_LEVEL,
    dataDir: e.ASSAY_DATA_DIR,
    modelsDir: e.ASSAY_MODELS_DIR,
    modelsConfig: e.ASSAY_MODELS_CONFIG,
    provider: e.ASSAY_EXECUTION_PROVIDER,
    cudaDevices,
    cudaFallbackCpu: e.ASSAY_CUDA_FALLBACK_CPU,
    workers,
    intraOpThreads,
    queueMax: e.ASSAY_QUEUE_MAX,
    maxPackedTokens: e.ASSAY_MAX_PACKED_TOKENS,
    debias: e.ASSAY_DEBIAS,
    ...overrides,
  });
}
