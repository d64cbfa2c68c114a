/**
 * The Prometheus metrics of the process, on a registry of our own (served by
 * GET /metrics). One set per process: the pool, the HTTP layer and the
 * accounts hooks all count into it, so several apps in one test process add
 * up — tests compare before/after values, never absolutes.
 *
 * Label values are bounded: `model` is a configured public name or "other",
 * `status` an HTTP status, `stage` a Timings stage.
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";

/** Seconds: 1 ms … ~65 s, covering a cached tiny request up to the default 60 s deadline. */
const LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60];

export class Metrics {
  readonly registry = new Registry();

  readonly requests = new Counter({
    name: "assay_requests_total",
    help: "Requests answered on the scoring routes, by model name sent and HTTP status.",
    labelNames: ["model", "status"] as const,
    registers: [this.registry],
  });

  readonly stageSeconds = new Histogram({
    name: "assay_request_stage_seconds",
    help: "Time per request spent in each stage (validate, auth, admission, prompt, tokenize, queue, inference, probability, total).",
    labelNames: ["stage"] as const,
    buckets: LATENCY_BUCKETS,
    registers: [this.registry],
  });

  readonly inputTokens = new Counter({
    name: "assay_input_tokens_total",
    help: "usage.input_tokens of answered requests, by model name sent.",
    labelNames: ["model"] as const,
    registers: [this.registry],
  });

  readonly inFlight = new Gauge({
    name: "assay_requests_in_flight",
    help: "Scoring requests admitted and not yet finished (slot and hold not yet released).",
    registers: [this.registry],
  });

  readonly queueDepth = new Gauge({
    name: "assay_inference_queue_depth",
    help: "Inference tasks waiting for a worker, over all lanes.",
    registers: [this.registry],
  });

  readonly queueWait = new Histogram({
    name: "assay_inference_queue_wait_seconds",
    help: "Time an inference task waited in its lane's queue before a worker took it.",
    buckets: LATENCY_BUCKETS,
    registers: [this.registry],
  });

  /**
   * What the inference pools report of the work they have admitted and not
   * yet run (queued passes and the planned passes of admitted requests),
   * read at scrape time. A pool registers one source and removes it at close.
   */
  readonly queueSources = new Set<() => { tokens: number; ms: number }>();

  readonly queueTokens = new Gauge({
    name: "assay_inference_queue_tokens",
    help: "Packed tokens of the inference work admitted and not yet started (queued passes and the planned passes of admitted requests), over all lanes.",
    registers: [this.registry],
    collect: () => this.collectQueue(),
  });

  readonly queueWorkSeconds = new Gauge({
    name: "assay_inference_queue_work_seconds",
    help: "Estimated seconds of that work, by each build's cost model, over all lanes.",
    registers: [this.registry],
    collect: () => this.collectQueue(),
  });

  readonly admissionRefused = new Counter({
    name: "assay_admission_refused_total",
    help: "Requests refused before any model work by the work admission: deadline (529, would not finish in time), queue_full (529, ASSAY_QUEUE_MAX), too_large (422, beyond ASSAY_REQUEST_TIMEOUT_MAX_MS).",
    labelNames: ["reason"] as const,
    registers: [this.registry],
  });

  readonly prefixCacheLookups = new Counter({
    name: "assay_prefix_cache_lookups_total",
    help: "Passes that looked up their prefix's keys and values (src/engine/prefix-cache.ts): result hit or miss.",
    labelNames: ["result"] as const,
    registers: [this.registry],
  });

  readonly prefixCacheEvictions = new Counter({
    name: "assay_prefix_cache_evictions_total",
    help: "Prefix cache entries dropped to stay within ASSAY_PREFIX_CACHE_MB.",
    registers: [this.registry],
  });

  readonly prefixCacheBytes = new Gauge({
    name: "assay_prefix_cache_bytes",
    help: "Bytes of keys and values held by the prefix cache.",
    registers: [this.registry],
  });

  readonly prefixCacheTokensSaved = new Counter({
    name: "assay_prefix_cache_tokens_saved_total",
    help: "Prefix tokens whose keys and values came from the cache instead of a prefill.",
    registers: [this.registry],
  });

  readonly preambleTokensSaved = new Counter({
    name: "assay_preamble_tokens_saved_total",
    help: "Prefix tokens read from a build's preamble (system text, computed once per build) instead of computed by the pass.",
    registers: [this.registry],
  });

  readonly buildMsPerToken = new Gauge({
    name: "assay_build_ms_per_token",
    help: "The cost estimate in use per model build: milliseconds per packed token (live, fitted on the passes run).",
    labelNames: ["build"] as const,
    registers: [this.registry],
  });

  readonly buildLoadSeconds = new Gauge({
    name: "assay_build_load_seconds",
    help: "How long the last load of each model build into a main worker took; a reload after a worker crash is estimated at this.",
    labelNames: ["build"] as const,
    registers: [this.registry],
  });

  readonly buildMsPerPair = new Gauge({
    name: "assay_build_ms_per_attention_pair",
    help: "The cost estimate in use per model build: milliseconds per query-key pair of attention.",
    labelNames: ["build"] as const,
    registers: [this.registry],
  });

  readonly admissionSafety = new Gauge({
    name: "assay_admission_safety",
    help: "The admission check's headroom on estimated work: SAFETY, raised while recent passes overran their estimates.",
    registers: [this.registry],
  });

  private collectQueue(): void {
    let tokens = 0;
    let ms = 0;
    for (const source of this.queueSources) {
      const q = source();
      tokens += q.tokens;
      ms += q.ms;
    }
    this.queueTokens.set(tokens);
    this.queueWorkSeconds.set(ms / 1000);
  }

  readonly expressPasses = new Counter({
    name: "assay_express_passes_total",
    help: "Short passes run by a lane's express worker beside a long pass instead of behind it (ASSAY_EXPRESS_MAX_MS).",
    registers: [this.registry],
  });

  readonly runPasses = new Histogram({
    name: "assay_inference_run_passes",
    help: "Passes per run of a main worker: 1 alone, more when waiting passes of different requests were batched (ASSAY_BATCH_MAX_TOKENS).",
    buckets: [1, 2, 3, 4, 6, 8, 12, 16, 32, 64],
    registers: [this.registry],
  });

  readonly runRequests = new Histogram({
    name: "assay_inference_run_requests",
    help: "Distinct requests per run of a main worker (passes of work not admitted as a request, such as the batch CLI's, count one each).",
    buckets: [1, 2, 3, 4, 6, 8, 12, 16, 32, 64],
    registers: [this.registry],
  });

  readonly runTokens = new Histogram({
    name: "assay_inference_run_tokens",
    help: "Packed tokens per run of a main worker, batched or not.",
    buckets: [64, 128, 256, 512, 1024, 2048, 4096, 8192],
    registers: [this.registry],
  });

  readonly workerRestarts = new Counter({
    name: "assay_worker_restarts_total",
    help: "Inference workers that died (crashed or exited) and were replaced.",
    registers: [this.registry],
  });

  readonly holds = new Counter({
    name: "assay_credit_holds_total",
    help: "Credit holds by what happened to them: placed, settled (charged), released (no charge).",
    labelNames: ["event"] as const,
    registers: [this.registry],
  });

  readonly chargedMicroUsd = new Counter({
    name: "assay_credit_charged_micro_usd_total",
    help: "Micro-USD charged for answered requests, by model name sent.",
    labelNames: ["model"] as const,
    registers: [this.registry],
  });

  readonly ready = new Gauge({
    name: "assay_ready",
    help: "1 when the default model is warm and the process is not draining, else 0.",
    registers: [this.registry],
  });

  constructor() {
    collectDefaultMetrics({ register: this.registry, prefix: "assay_" });
  }
}

export const metrics = new Metrics();
