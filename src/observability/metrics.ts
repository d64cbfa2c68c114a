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
