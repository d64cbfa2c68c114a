import path from "node:path";
import os from "node:os";
import { fileURLToPath } from "node:url";
import { z } from "zod";
import { parseUsd } from "../accounts/money.js";

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

/** Where a lane runs its sessions: onnxruntime's CPU provider, or a GPU provider (CUDA, WebGPU) on each build's GPU graph. */
export type ExecutionProvider = "cpu" | "cuda" | "webgpu";

const bool = z
  .enum(["1", "0", "true", "false", "yes", "no"])
  .transform((v) => v === "1" || v === "true" || v === "yes");

/** Every setting, its default and its unit, validated once at boot. */
const Env = z.object({
  PORT: z.coerce.number().int().min(0).max(65535).default(8000).meta({ doc: "listen port" }),
  HOST: z.string().default("127.0.0.1").meta({ doc: "listen address" }),
  LOG_LEVEL: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info").meta({ doc: "pino level" }),
  /** Where the embedded store (SQLite) and the first-start key file live. */
  ASSAY_DATA_DIR: z.string().default(path.join(ROOT, ".cache", "state")).meta({ doc: "SQLite store (`assay.db`) and the first-start key file", shown: "`.cache/state`" }),
  /** Exported model folders (manifest.json, model.onnx, tokenizer.json). */
  ASSAY_MODELS_DIR: z.string().default(path.join(ROOT, "models", "cache")).meta({ doc: "where relative build folders live", shown: "`models/cache`" }),
  /** Read by scripts/bootstrap.mjs and scripts/build-llama.mjs (before node_modules exists); listed here so the table documents it. */
  ASSAY_CACHE_DIR: z.string().default(path.join(ROOT, ".cache")).meta({ doc: "the checkout's own working files: the links to the build cache's venv (`pyenv`) and GGUF files (`weights/`), the bench's llama.cpp, the SDK clients' venvs", shown: "`.cache`" }),
  /** Read by scripts/bootstrap.mjs (scripts/build-cache.mjs) only; listed here so the table documents it. */
  ASSAY_BUILD_CACHE: z.string().optional().meta({ doc: "the per-user build cache every checkout on the machine shares: model builds keyed by everything they are made from, their GGUF files, the converter's venv ([the build cache](docs/operations.md#the-build-cache))", shown: "`$XDG_CACHE_HOME/assay`, else `~/.cache/assay`" }),
  /** Public model names → model folders; see models/README.md. */
  ASSAY_MODELS_CONFIG: z.string().default(path.join(ROOT, "models", "models.json")).meta({ doc: "public names → builds", shown: "`models/models.json`" }),
  /** `cpu`, `cuda` or `webgpu`; on a GPU provider every build runs its GPU graph (scripts/gpu_graph.py). */
  ASSAY_EXECUTION_PROVIDER: z.enum(["cpu", "cuda", "webgpu"]).default("cpu").meta({ doc: "`cpu`, `cuda` (NVIDIA: the CUDA provider from PyPI, or onnxruntime-node's CUDA 12 binaries) or `webgpu` (any Vulkan GPU, in the npm package); a GPU provider runs each build's GPU graph (`model.gpu.onnx`, written by the bootstrap when this is set). See [GPU](docs/operations.md#gpu)" }),
  ASSAY_INT8_PRODUCTS: z.enum(["auto", "u8s8", "u8u8", "s8s8"]).default("auto").meta({ doc: "which graph of a W8A8 build runs: `u8s8` (`model.onnx`: exact only on a CPU with VNNI or AMX, where it is fastest), `u8u8` (`model.u8u8.onnx`: the same products, exact on every CPU), `s8s8` (`model.s8s8.onnx`: the same products with a kernel on the CUDA provider, whose MatMulInteger takes int8 × int8 only); `auto` picks `s8s8` on CUDA, `u8s8` on a CPU with `avx512_vnni`, `avx_vnni` or `amx_int8`, else `u8u8`" }),
  ASSAY_GPU_PRECISION: z.enum(["half", "float32"]).default("half").meta({ doc: "on CUDA, which GPU graph a build serves: `half` (`model.gpu16.onnx`, float16 products and weights, where the build has it; else the float32 one, with a warning) or `float32` (`model.gpu.onnx`); WebGPU serves the float32 one. See [GPU](docs/operations.md#gpu)" }),
  /** Comma-separated CUDA device ids: one worker per GPU. */
  ASSAY_CUDA_DEVICES: z.string().default("0").meta({ doc: "GPUs, one lane each" }),
  /** Read by the launcher (scripts/cuda-provider.mjs), not the server: it must be on LD_LIBRARY_PATH before Node starts. */
  ASSAY_CUDA_LIBS: z.string().optional().meta({ doc: "a folder holding the CUDA 13 libraries already (a PyTorch cu130 install's `site-packages/nvidia/cu13/lib`): the launcher puts it on `LD_LIBRARY_PATH` and the bootstrap fetches only the provider. See [GPU](docs/operations.md#gpu)", shown: "unset" }),
  /** Start on CPU when the GPU provider cannot start (otherwise boot fails). */
  ASSAY_GPU_FALLBACK_CPU: bool.optional().meta({ doc: "run a lane on the CPU (its CPU graph) when the GPU provider cannot start; otherwise boot fails with the reason", shown: "`0`" }),
  /** The name this setting had before WebGPU: read where ASSAY_GPU_FALLBACK_CPU is unset. */
  ASSAY_CUDA_FALLBACK_CPU: bool.default(false).meta({ doc: "the earlier name of `ASSAY_GPU_FALLBACK_CPU`, read where that is unset", shown: "`0`" }),
  /** CPU workers (each owns one onnxruntime session per model). */
  ASSAY_WORKERS: z.coerce.number().int().min(1).optional().meta({ doc: "inference lanes", shown: "1 on CPU, one per GPU" }),
  /** onnxruntime intra-op threads per worker; workers × threads ≈ cores. */
  ASSAY_INTRA_OP_THREADS: z.coerce.number().int().min(1).optional().meta({ doc: "onnxruntime threads per lane", shown: "cores / lanes" }),
  /** Whether onnxruntime's threads spin while they wait (see LaneOptions.spinning). */
  ASSAY_INTRA_OP_SPINNING: bool.default(true).meta({ doc: "onnxruntime's threads spin while they wait for work; `0` makes them sleep: about 9% slower on an idle machine, fairer under load (a short pass beside a long one)", shown: "`1`" }),
  /**
   * CPU only: a second worker per lane runs a short pass (estimated at most
   * this many ms) beside a long one instead of behind it; 0 turns it off.
   * Default 1,500 on CPU, 0 on CUDA. See "The express worker" in docs/architecture.md.
   */
  ASSAY_EXPRESS_MAX_MS: z.coerce.number().int().min(0).optional().meta({ doc: "a short pass (at most this many estimated ms) of another organization runs on a second worker beside a long pass instead of behind it; `0` turns it off. See [the express worker](docs/architecture.md#the-express-worker)", shown: "`1500` on CPU, `0` on a GPU" }),
  /**
   * CPU with the express worker on: a pass also counts as short when its estimate is at most the
   * build's estimate for a pass of this many fresh tokens, so "short" follows the build and the
   * machine: 1,500 ms covers a primary-cell request on the 0.5B but not on the 1.5B, whose such a
   * request then waited behind a flood's pass (docs/experiments/admission-and-fairness.md). 0: the ms bound alone.
   */
  ASSAY_EXPRESS_MAX_TOKENS: z.coerce.number().int().min(0).default(1024).meta({ doc: "CPU with the express worker on: a pass also counts as short when it is estimated at most as long as a pass of this many tokens on the same build, so the bound follows the build and the machine; `0` leaves `ASSAY_EXPRESS_MAX_MS` alone. See [the express worker](docs/architecture.md#the-express-worker)" }),
  /**
   * CPU: the nice value of a lane's main worker while it has an express worker beside it, so that a
   * short pass beside a long one gets most of the cores (CFS weights 1024 against 110 at nice 10;
   * nice 5, 1024 against 335, was the default until 2026-11-26: docs/experiments/admission-and-fairness.md).
   */
  ASSAY_MAIN_WORKER_NICE: z.coerce.number().int().min(0).max(19).default(10).meta({ doc: "CPU with the express worker on: the nice value of each lane's main worker (onnxruntime's threads inherit it), so that a short pass beside a long one gets about nine tenths of the cores instead of half; `0` gives both workers equal priority. See [the express worker](docs/architecture.md#the-express-worker)" }),
  /**
   * Passes of different requests run as one (src/inference/batch.ts) when a lane takes work: the
   * waiting short passes of one build, in the fair queue's order, up to this many packed tokens.
   */
  ASSAY_BATCH_MAX_TOKENS: z.coerce.number().int().min(0).default(1024).meta({ doc: "a lane runs the waiting passes of different requests on the same build as one pass, taken in the fair queue's order, up to this many packed tokens (and within `ASSAY_PASS_ATTENTION_MB`); a pass joins a batch when it has at most a quarter of this. W8A8 builds, through the batch graph the bootstrap writes beside each served graph (`model.batch.onnx`). 0: every pass runs alone. See [batching](docs/architecture.md#batching-across-requests)" }),
  ASSAY_BATCH_MAX_PASSES: z.coerce.number().int().min(1).default(16).meta({ doc: "the most passes one batched run holds" }),
  ASSAY_BATCH_PRELOAD: bool.default(false).meta({ shown: "`0`", doc: "`1`: a lane's main worker loads every build's batch graph with the build (one more copy of its weights there, and the load at boot) instead of on the first batch, which otherwise waits for it (seconds for the 1.5B on 2 cores). The server loads the default build's before it reports ready whatever this says" }),
  ASSAY_BATCH_WAIT_MS: z.coerce.number().min(0).default(0).meta({ doc: "an idle lane waits up to this many ms for more passes to batch with the first one (throughput over latency); 0: a lone pass starts at once" }),
  /** Requests waiting for a worker beyond which the service answers 529. */
  ASSAY_QUEUE_MAX: z.coerce.number().int().min(0).default(64).meta({ doc: "admitted requests waiting (split over the lanes) before 529, whatever their work; see [Admission, deadlines and fairness](docs/architecture.md#admission-deadlines-and-fairness)" }),
  /** Longest packed sequence (state + questions + label tokens) one request may need. */
  ASSAY_MAX_PACKED_TOKENS: z.coerce.number().int().min(64).default(8192).meta({ doc: "longest packed sequence per forward pass; a longer request is read in several passes over the same state, and a state too long to share a pass with its widest question is computed alone in chunks (attention within limit² pairs per pass; builds of export format v3). 422 only when the state and one question exceed the model's context (a v2 build: this limit)" }),
  /** A state above twice this is computed apart from its questions in chunks of this many tokens' attention (Engine.stateChunk). */
  ASSAY_STATE_CHUNK_TOKENS: z.coerce.number().int().min(0).default(2048).meta({ doc: "a state longer than twice this (on builds of export format v3) is computed apart from its questions, in chunks of at most this many tokens' attention (c·(p + c) ≤ this² pairs), and cached like any state; a single pass computes the causal half of its attention for nothing. 0: only a state too long to share a pass with its widest question is" }),
  /** The most memory one pass's attention scores take per layer (Engine.maxPairs). */
  ASSAY_PASS_ATTENTION_MB: z.coerce.number().min(0).default(256).meta({ doc: "the most memory one pass's attention scores may take per layer (heads × rows × keys × 4 bytes; builds of export format v3): a request's passes are planned within it, and a state whose own scores would exceed it is computed in chunks. onnxruntime keeps the largest buffers a worker has built for the worker's life, so this and the pass limit, not the largest request ever sent, set the workers' working memory (2–3 GB above the loaded models for the largest requests at 256, against 3–5.5 GB unbounded; docs/experiments/attention-and-long-states.md). 0: only `ASSAY_MAX_PACKED_TOKENS` bounds a pass (up to 3 GB per score tensor at 8,192 tokens)" }),
  /** Remove option-position bias by averaging over cyclic shifts (choice/score); default = DEFAULT_DEBIAS in src/prompt. */
  ASSAY_DEBIAS: z.enum(["off", "cyclic"]).default("cyclic").meta({ doc: "option-order debiasing: `cyclic` (extra presentations, averaged) or `off` (asked once, in the caller's order)" }),
  /** Under `cyclic`, a choice question with up to this many options is asked in all its cyclic shifts; with more, in the canonical order only. */
  ASSAY_DEBIAS_MAX_SHIFTS: z.coerce.number().int().min(1).max(255).default(8).meta({ doc: "a choice question with up to this many options is asked in all its cyclic shifts, one with more in the canonical order only; every presentation is kept at any request size" }),
  /** A choice question with more options than are numbered is read again over its this-many likeliest options (0: off). */
  ASSAY_PREFIX_CACHE_MB: z.coerce.number().min(0).default(1024).meta({ doc: "memory for the keys and values of recent prefixes (system text + state), per process, shared by all builds: a request whose state was read before skips its prefill (the `x-prefix-cache-tokens` header says how many tokens); `0` turns the cache off. 1,024 MB holds about 18,000 tokens of the 1.5B build (57 KB each) or 42,000 of the 0.5B (24 KB)" }),
  ASSAY_PREFIX_CACHE_SCOPE: z.enum(["organization", "shared"]).default("organization").meta({ doc: "who a cached entry serves, in the prefix cache and the cache of questions' content-free priors. `organization`: only the organization whose request made it (a hit is faster, and timing must not tell one organization what another sent or asked); `shared`: any request with the same prefix or question, for a single-tenant deployment" }),
  ASSAY_SHORTLIST: z.coerce.number().int().min(0).max(8).default(8).meta({ doc: "a choice question with more options than that (and than 8) is read again over its this-many likeliest options, numbered, in all their shifts (one more pass); `0` turns it off. A build's fit may lower it (`shortlist` in `models/calibration/<build>.json`): the 0.5B ships `0`, where it did not help" }),
  /**
   * When builds marked `"availability": "scheduled"` in models.json (the large
   * model) are kept loaded: `always`, `never`, or `<days> HH:MM-HH:MM <IANA zone>`
   * with days like `mon-fri` or `mon,wed,sat`. Outside it they unload when idle.
   */
  ASSAY_MODEL_SCHEDULE: z.string().default("mon-fri 07:30-19:00 America/Los_Angeles").meta({ doc: "when scheduled builds (the large one) stay loaded: `always`, `never`, or `<days> HH:MM-HH:MM <zone>`" }),
  /** Seconds a scheduled build may sit idle outside its schedule before it is unloaded. */
  ASSAY_MODEL_IDLE_UNLOAD_SECONDS: z.coerce.number().min(0).default(600).meta({ doc: "idle time after which a scheduled build is unloaded outside its schedule" }),
  /** Fact check: documents longer than this many tokens are read in overlapping chunks of this size. */
  ASSAY_FACTCHECK_CHUNK_TOKENS: z.coerce.number().int().min(256).default(2048).meta({ doc: "fact check window size (documents longer than this are read in windows)" }),
  /** Tokens each fact check chunk shares with the one before it. */
  ASSAY_FACTCHECK_CHUNK_OVERLAP: z.coerce.number().int().min(0).default(256).meta({ doc: "tokens each window shares with the one before" }),
  /** Fact check: above 0 (the default), a document longer than one window is read, per claim, from its passage most like the claim, up to this many tokens; 0 reads every window. */
  ASSAY_FACTCHECK_EVIDENCE_TOKENS: z.coerce.number().int().min(0).default(1024).meta({ doc: "a document longer than one window is read, for each claim, from the passage of the document most like the claim (consecutive lines, summed BM25) of up to this many tokens (at most one window); `0` reads every window for every claim instead (the windows: cheaper for many claims on a document of few windows, less accurate on both long-document forms measured)" }),

  // Accounts, credit and concurrency (docs/operations.md, "Keys, credit, limits and prices").
  /** PostgreSQL URL: accounts and ledger shared by replicas. Unset = the embedded SQLite store. */
  ASSAY_DATABASE_URL: z.string().min(1).optional().meta({ doc: "PostgreSQL URL: accounts and ledger shared by replicas", shown: "unset (SQLite)" }),
  /** PostgreSQL schema for the store (created if missing); unset = the server's search_path. */
  ASSAY_DATABASE_SCHEMA: z.string().regex(/^[A-Za-z_][A-Za-z0-9_]{0,62}$/).optional().meta({ doc: "PostgreSQL schema to use, created if missing", shown: "unset (`search_path`)" }),
  /** Redis URL: concurrency slots shared by replicas. Unset = counted in this process. */
  ASSAY_REDIS_URL: z.string().min(1).optional().meta({ doc: "Redis URL: concurrency slots shared by replicas", shown: "unset (in-process)" }),
  /** Prefix of every Redis key this deployment writes. */
  ASSAY_REDIS_PREFIX: z.string().min(1).default("assay:").meta({ doc: "prefix of every Redis key" }),
  /** Prices per model (USD per million input tokens). */
  ASSAY_PRICES: z.string().default(path.join(ROOT, "models", "prices.json")).meta({ doc: "prices per model", shown: "`models/prices.json`" }),
  /** Free credit for every new organization, USD (not a purchase). */
  ASSAY_STARTING_GRANT_USD: z.string().regex(/^\d{1,9}(\.\d{1,6})?$/, "USD with at most 6 decimals").default("1").meta({ doc: "free credit for every new organization (`0` = none)" }),
  /** Requests in flight per organization before its first purchase, and after. */
  ASSAY_CONCURRENCY_BEFORE_PURCHASE: z.coerce.number().int().min(1).default(4).meta({ doc: "requests in flight per organization until its first purchase" }),
  ASSAY_CONCURRENCY_AFTER_PURCHASE: z.coerce.number().int().min(1).default(100).meta({ doc: "… and after it" }),
  /** Seconds a credit hold lives without renewal (renewed while the request runs). */
  ASSAY_HOLD_TTL_SECONDS: z.coerce.number().min(1).default(120).meta({ doc: "a credit hold's life without renewal (renewed every third while the request runs)" }),
  /** Seconds between sweeps that release expired holds; 0 = only on the next admission or read. */
  ASSAY_HOLD_SWEEP_SECONDS: z.coerce.number().min(0).default(30).meta({ doc: "period of the sweep that releases expired holds (`0` = none)" }),
  /** Seconds a Redis concurrency slot lives without renewal (renewed every third while the request runs). */
  ASSAY_SLOT_LEASE_SECONDS: z.coerce.number().min(0.3).default(30).meta({ doc: "a Redis slot's lease (renewed every third while the request runs)" }),
  /** `Retry-After` seconds on 429. */
  ASSAY_RETRY_AFTER_SECONDS: z.coerce.number().int().min(0).default(1).meta({ doc: "`Retry-After` on 429" }),

  // Operating it (docs/operations.md).
  /** A request's deadline, from arrival to answer, in milliseconds; past it → 504 and its queued work is dropped. */
  ASSAY_REQUEST_TIMEOUT_MS: z.coerce.number().int().min(1).default(60_000).meta({ doc: "a request's deadline from arrival; past it → 504, queued work dropped, no charge. A request that would not finish by it is refused at admission (529); one whose own estimated work needs longer gets its estimate × 4; an admitted one runs until twice its estimated finish where that is later" }),
  /**
   * The longest deadline a request's estimated work may earn (ms): one whose own work needs longer than
   * ASSAY_REQUEST_TIMEOUT_MS gets its estimate × 4 (DEADLINE_MARGIN), up to this; work beyond it is refused up front (422).
   */
  ASSAY_REQUEST_TIMEOUT_MAX_MS: z.coerce.number().int().min(1).default(600_000).meta({ doc: "the longest deadline a request's estimated work can earn; work that cannot finish within it even on an idle machine is refused up front (422). Read as `ASSAY_REQUEST_TIMEOUT_MS` when smaller. Behind a proxy, its read timeout must exceed this" }),
  /** On SIGTERM, seconds in-flight requests get to finish before they are cancelled (503, no charge). */
  ASSAY_DRAIN_SECONDS: z.coerce.number().min(0).default(30).meta({ doc: "on SIGTERM, how long in-flight requests may finish before they are cancelled (503, no charge)" }),
  /** Test-only fault injection into the inference workers (off by default; see "Test-only fault injection" in docs/architecture.md). */
  ASSAY_TEST_FAULTS: bool.default(false).meta({ doc: "**tests only**: fault injection into the inference workers (see [docs/architecture.md](docs/architecture.md#test-only-fault-injection))", shown: "`0`" }),
});

/** A setting's entry in the README's configuration table: `doc` its meaning, `shown` its default where the schema's is not what a reader should see (a computed path, a default set in loadConfig). */
interface SettingDoc {
  doc: string;
  shown?: string;
}

/**
 * The README's configuration table, generated from the schema so that a
 * setting, its default and its meaning are written once
 * (`npm run docs:config` writes it between the README's config-table
 * markers; test/unit/config-table.test.ts checks that it is current).
 */
export function configTable(): string {
  const rows = Object.entries(Env.shape).map(([name, schema]) => {
    const meta = schema.meta() as SettingDoc | undefined;
    if (!meta?.doc) throw new Error(`config setting ${name} has no .meta({ doc }) for the README table`);
    const def = (schema as { def: { type: string; defaultValue?: unknown } }).def;
    const shown = meta.shown ?? (def.type === "default" ? `\`${String(def.defaultValue)}\`` : "unset");
    return `| \`${name}\` | ${shown} | ${meta.doc} |`;
  });
  return ["| variable | default | meaning |", "|---|---|---|", ...rows].join("\n") + "\n";
}

const TABLE_START = "<!-- config-table:start (generated by npm run docs:config from src/config/index.ts) -->";
const TABLE_END = "<!-- config-table:end -->";

/**
 * `readme` with the text between its config-table markers replaced by
 * `configTable()`: what `npm run docs:config` writes, and what the test
 * compares the README with.
 */
export function withConfigTable(readme: string): string {
  const from = readme.indexOf(TABLE_START);
  const to = readme.indexOf(TABLE_END);
  if (from < 0 || to < from) throw new Error(`no ${TABLE_START} … ${TABLE_END} section`);
  return `${readme.slice(0, from + TABLE_START.length)}\n${configTable()}${readme.slice(to)}`;
}

export type Config = Readonly<{
  port: number;
  host: string;
  logLevel: z.infer<typeof Env>["LOG_LEVEL"];
  dataDir: string;
  modelsDir: string;
  modelsConfig: string;
  provider: ExecutionProvider;
  /** Which graph of a W8A8 build runs (models/int8.ts). */
  int8Products: "auto" | "u8s8" | "u8u8" | "s8s8";
  cudaDevices: number[];
  gpuFallbackCpu: boolean;
  gpuPrecision: "half" | "float32";
  workers: number;
  intraOpThreads: number;
  intraOpSpinning: boolean;
  /** 0: no express worker. */
  expressMaxMs: number;
  /** A pass also counts as short up to the build's estimate for this many fresh tokens (0: the ms bound alone). */
  expressMaxTokens: number;
  /** The main worker's nice value beside an express worker (0: unchanged). */
  mainWorkerNice: number;
  queueMax: number;
  /** Batching across requests (0 tokens: off). */
  batch: { maxTokens: number; maxPasses: number; waitMs: number; preload: boolean };
  maxPackedTokens: number;
  stateChunkTokens: number;
  /** ASSAY_PASS_ATTENTION_MB in bytes. */
  passAttentionBytes: number;
  /** Prefix cache budget in bytes (ASSAY_PREFIX_CACHE_MB) and who may hit an entry. */
  prefixCache: { bytes: number; scope: "organization" | "shared" };
  debias: "off" | "cyclic";
  debiasMaxShifts: number;
  shortlist: number;
  modelSchedule: string;
  modelIdleUnloadMs: number;
  factcheckChunkTokens: number;
  factcheckChunkOverlap: number;
  factcheckEvidenceTokens: number;
  databaseUrl: string | null;
  databaseSchema: string | null;
  redisUrl: string | null;
  redisPrefix: string;
  pricesFile: string;
  startingGrantMicro: number;
  concurrencyBeforePurchase: number;
  concurrencyAfterPurchase: number;
  holdTtlMs: number;
  holdSweepMs: number;
  slotLeaseMs: number;
  retryAfterSeconds: number;
  requestTimeoutMs: number;
  /** Never below requestTimeoutMs. */
  requestTimeoutMaxMs: number;
  drainMs: number;
  testFaults: boolean;
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
  // WebGPU: one lane, on the adapter Dawn picks (onnxruntime-node has no adapter choice).
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
    int8Products: e.ASSAY_INT8_PRODUCTS,
    cudaDevices,
    gpuFallbackCpu: e.ASSAY_GPU_FALLBACK_CPU ?? e.ASSAY_CUDA_FALLBACK_CPU,
    gpuPrecision: e.ASSAY_GPU_PRECISION,
    workers,
    intraOpThreads,
    intraOpSpinning: e.ASSAY_INTRA_OP_SPINNING,
    expressMaxMs: e.ASSAY_EXPRESS_MAX_MS ?? (e.ASSAY_EXECUTION_PROVIDER === "cpu" ? 1_500 : 0),
    expressMaxTokens: e.ASSAY_EXPRESS_MAX_TOKENS,
    mainWorkerNice: e.ASSAY_MAIN_WORKER_NICE,
    queueMax: e.ASSAY_QUEUE_MAX,
    batch: { maxTokens: e.ASSAY_BATCH_MAX_TOKENS, maxPasses: e.ASSAY_BATCH_MAX_PASSES, waitMs: e.ASSAY_BATCH_WAIT_MS, preload: e.ASSAY_BATCH_PRELOAD },
    maxPackedTokens: e.ASSAY_MAX_PACKED_TOKENS,
    stateChunkTokens: e.ASSAY_STATE_CHUNK_TOKENS,
    passAttentionBytes: Math.round(e.ASSAY_PASS_ATTENTION_MB * 1024 * 1024),
    prefixCache: { bytes: Math.round(e.ASSAY_PREFIX_CACHE_MB * 1024 * 1024), scope: e.ASSAY_PREFIX_CACHE_SCOPE },
    debias: e.ASSAY_DEBIAS,
    debiasMaxShifts: e.ASSAY_DEBIAS_MAX_SHIFTS,
    shortlist: e.ASSAY_SHORTLIST,
    modelSchedule: e.ASSAY_MODEL_SCHEDULE,
    modelIdleUnloadMs: Math.round(e.ASSAY_MODEL_IDLE_UNLOAD_SECONDS * 1000),
    factcheckChunkTokens: e.ASSAY_FACTCHECK_CHUNK_TOKENS,
    factcheckChunkOverlap: Math.min(e.ASSAY_FACTCHECK_CHUNK_OVERLAP, Math.floor(e.ASSAY_FACTCHECK_CHUNK_TOKENS / 2)),
    factcheckEvidenceTokens: Math.min(e.ASSAY_FACTCHECK_EVIDENCE_TOKENS, e.ASSAY_FACTCHECK_CHUNK_TOKENS),
    databaseUrl: e.ASSAY_DATABASE_URL ?? null,
    databaseSchema: e.ASSAY_DATABASE_SCHEMA ?? null,
    redisUrl: e.ASSAY_REDIS_URL ?? null,
    redisPrefix: e.ASSAY_REDIS_PREFIX,
    pricesFile: e.ASSAY_PRICES,
    startingGrantMicro: parseUsd(e.ASSAY_STARTING_GRANT_USD),
    concurrencyBeforePurchase: e.ASSAY_CONCURRENCY_BEFORE_PURCHASE,
    concurrencyAfterPurchase: e.ASSAY_CONCURRENCY_AFTER_PURCHASE,
    holdTtlMs: Math.round(e.ASSAY_HOLD_TTL_SECONDS * 1000),
    holdSweepMs: Math.round(e.ASSAY_HOLD_SWEEP_SECONDS * 1000),
    slotLeaseMs: Math.round(e.ASSAY_SLOT_LEASE_SECONDS * 1000),
    retryAfterSeconds: e.ASSAY_RETRY_AFTER_SECONDS,
    requestTimeoutMs: e.ASSAY_REQUEST_TIMEOUT_MS,
    requestTimeoutMaxMs: Math.max(e.ASSAY_REQUEST_TIMEOUT_MS, e.ASSAY_REQUEST_TIMEOUT_MAX_MS),
    drainMs: Math.round(e.ASSAY_DRAIN_SECONDS * 1000),
    testFaults: e.ASSAY_TEST_FAULTS,
    ...overrides,
  });
}
