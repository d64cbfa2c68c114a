import path from "node:path";
import fs from "node:fs";
import { Piscina } from "piscina";
// Keeps onnxruntime's native binding loaded in the main thread for the life
// of the process. Without it, when a worker thread dies the library is
// unloaded with it, and the replacement thread's load fails with "Module did
// not self-register" (static initialisers do not run twice in one process).
import "onnxruntime-node";
import { ROOT, type Config } from "../config/index.js";
import { AssayError } from "../errors/catalogue.js";
import { metrics } from "../observability/metrics.js";
import type { PassShape } from "./cost.js";
import { batchGraphOf } from "./batch.js";
import { FairQueue } from "./fair-queue.js";
import type { EnqueueOptions, Express, Job, Lane, Work } from "./jobs.js";
import type { LaneOptions, LoadOk, Task, TaskResult } from "./protocol.js";

/**
 * The lanes' workers: spawning them (one piscina thread each, and a lane's
 * express worker), the provider and settings each lane runs, running a job
 * on a worker, loading, preloading and unloading graphs on every lane, a
 * dead worker's restart (502 for its task, then the reloads), and close's
 * drain of what the workers hold.
 */

/** Compiled worker: piscina loads JavaScript, so the build must exist. */
export const WORKER_FILE = path.join(ROOT, "dist", "src", "inference", "worker.js");

/**
 * The least close() waits for the tasks in the workers' hands (a model load, a pass, cancelled or not)
 * before it terminates the workers; a running pass estimated longer gets twice its estimate left
 * (closeWaitMs). Passes are bounded by ASSAY_MAX_PACKED_TOKENS, but not in time: a 3,700-token pass
 * of the 1.5B build took 67 s on a 2-core machine without AVX-512.
 */
const TASK_DRAIN_MS = 60_000;

/** Each lane's worker settings: the provider it runs and, on CUDA, its device. */
function laneOptions(config: Config, fallback: Pick<LaneOptions, "cpuGraph">): LaneOptions[] {
  const testFaults = config.testFaults === true;
  const lane = { intraOpThreads: config.intraOpThreads, spinning: config.intraOpSpinning, gpuFallbackCpu: config.gpuFallbackCpu, testFaults };
  // A GPU lane runs its passes alone: the batch graph is the W8A8 build's, for the CPU (LoadOk.batches).
  return config.provider === "cpu"
    ? Array.from({ length: config.workers }, () => ({
        ...lane,
        provider: "cpu",
        deviceId: 0,
        batching: config.batch.preload && config.batch.maxTokens > 0 && config.batch.maxPasses > 1,
      }))
    : (config.provider === "cuda" ? config.cudaDevices : Array.from({ length: config.workers }, () => 0)).map((deviceId) => ({
        ...lane,
        provider: config.provider,
        deviceId,
        ...(fallback.cpuGraph ? { cpuGraph: fallback.cpuGraph } : {}),
      }));
}

function worker(o: LaneOptions, name: string): Piscina {
  const pool = new Piscina({
    filename: WORKER_FILE,
    minThreads: 1,
    maxThreads: 1,
    concurrentTasksPerWorker: 1,
    idleTimeout: Number.POSITIVE_INFINITY,
    workerData: o,
  });
  // A worker that fails with no task in hand is reported as an 'error'
  // event; unhandled, EventEmitter would take the whole process down.
  pool.on("error", (err: unknown) => console.error(`[assay] inference ${name}: ${String(err)}`));
  return pool;
}

/** What the lanes ask of the pool that composes them. */
export interface LaneHost {
  closed(): boolean;
  /** A worker of `lane` is free (or a model became ready in its express worker): start what can start. */
  dispatch(lane: Lane): void;
  /** Queues a load or unload on `lane` (Queues.enqueue). */
  enqueue(lane: Lane, task: Task, opts: EnqueueOptions): Promise<TaskResult>;
  estimateLoadMs(model: string): number;
  /** A pass ran alone on its cores: its shape and run time (Admission.passTimed). */
  passTimed(file: string, shape: PassShape, runMs: number): void;
  /** A load ran on a main worker (Admission.loadTimed). */
  loadTimed(model: string, ms: number): void;
  /** An organization used `ms` of the lane (Admission.recordUsage). */
  recordUsage(lane: Lane, org: string, ms: number, now: number): void;
}

export class Lanes {
  readonly all: Lane[];
  /** Models loaded on every lane (onnx paths), reloaded into a replacement worker. */
  private readonly loaded = new Set<string>();
  /** Model files whose graph runs several requests' passes as one (LoadOk.batches on every lane). */
  private readonly batchable = new Set<string>();
  /** Every task a worker holds (loads, unloads, passes): close() lets them finish before it terminates the threads. */
  private readonly inWorkers = new Set<Promise<void>>();
  private readonly batch: Config["batch"];
  /** Workers that died and were replaced since start. */
  restarts = 0;

  constructor(
    config: Config,
    fallback: Pick<LaneOptions, "cpuGraph">,
    /** Whether each lane has an express worker (expressMaxMs > 0). */
    withExpress: boolean,
    private readonly host: LaneHost,
  ) {
    if (!fs.existsSync(WORKER_FILE)) {
      throw new Error(`worker ${WORKER_FILE} is not built; run npm run build (npm start/test do it for you)`);
    }
    this.batch = config.batch;
    this.all = laneOptions(config, fallback).map((o, index) => {
      const express: Express | null = withExpress
        ? { pool: worker({ ...o, batching: false }, `lane ${index} (express)`), running: null, runningSince: 0, ready: new Set(), loading: null }
        : null;
      // Beside an express worker the main one runs at a higher nice value: a short pass gets most of the cores while both run.
      const pool = worker(express && config.mainWorkerNice > 0 ? { ...o, nice: config.mainWorkerNice } : o, `lane ${index}`);
      return { index, pool, opts: o, express, queue: new FairQueue<Job>(), system: [], running: null, runningSince: 0, works: new Set<Work>(), batchWait: null, usage: new Map() };
    });
  }

  /** Tasks running in a worker now, over all lanes. */
  get running(): number {
    return this.all.reduce((s, l) => s + (l.running ? 1 : 0) + (l.express?.running ? 1 : 0), 0);
  }

  /** Whether `model` is loaded on every lane's main worker. */
  isLoaded(model: string): boolean {
    return this.loaded.has(model);
  }

  /** Whether `model`'s graph runs several requests' passes as one on every lane. */
  batches(model: string): boolean {
    return this.batchable.has(model);
  }

  /** Runs a job on the lane's main worker (`x` null) or its express worker. */
  start(lane: Lane, job: Job, x: Express | null): void {
    const since = x ? x.runningSince : lane.runningSince;
    for (const m of job.members ?? [job]) metrics.queueWait.observe((since - m.enqueuedAt) / 1000);
    if (!x && (job.task.kind === "infer" || job.task.kind === "batch")) {
      const members = job.members ?? [job];
      metrics.runPasses.observe(members.length);
      metrics.runRequests.observe(new Set(members.map((m) => m.work ?? m)).size);
      metrics.runTokens.observe(job.tokens);
    }
    // Structured clone, not transfer: the caller's PackedRequest stays readable (a prefix's shared memory is shared, not copied).
    const run = this.held((x ? x.pool : lane.pool).run(job.task));
    run
      .then(
        (r: unknown) => {
          const res = r as TaskResult;
          // Every pass that ran alone on its cores teaches its build's estimate, whether or not its caller still
          // waits; an express pass shared them, so its time is not what the model's pass costs.
          if (!x && res.ok && (job.task.kind === "infer" || job.task.kind === "batch") && job.shape && "runMs" in res) {
            const file = job.task.kind === "batch" ? batchGraphOf(job.task.model) : job.task.model;
            this.host.passTimed(file, job.shape, res.runMs);
          }
          if (!x && res.ok && job.task.kind === "load" && !job.task.batch && "loaded" in res && res.loaded) {
            this.host.loadTimed(job.task.model, res.loadMs);
          }
          job.resolve(res);
        },
        (e: unknown) => {
          if (this.host.closed()) {
            job.reject(new AssayError("UNAVAILABLE", "the inference pool was closed before the task finished; the service is shutting down", 1));
            return;
          }
          // The worker thread died with the task in hand (an error escaped it, or it exited).
          const msg = e instanceof Error ? e.message : String(e);
          this.restarts++;
          metrics.workerRestarts.inc();
          console.error(`[assay] inference lane ${lane.index}${x ? " (express)" : ""}: worker died (${msg}); piscina starts a replacement`);
          job.reject(new AssayError("MODEL_FAILED", `the model worker failed and was restarted: ${msg}; retry the request`));
          // The express worker's replacement loads models again on first need.
          if (x) {
            x.ready.clear();
            return;
          }
          // Reload before anything else runs on the new thread (not when a load itself killed it: no loop).
          if (job.task.kind !== "infer" && job.task.kind !== "batch") return;
          for (const model of this.loaded) {
            this.host.enqueue(lane, { kind: "load", model }, { bounded: false, front: true, cost: this.host.estimateLoadMs(model) }).then(
              (r) => {
                if (!r.ok) console.error(`[assay] inference lane ${lane.index}: reload of ${model} failed: ${r.message}`);
              },
              (err: unknown) => console.error(`[assay] inference lane ${lane.index}: reload of ${model} failed: ${String(err)}`),
            );
          }
        },
      )
      .finally(() => {
        const now = performance.now();
        if (job.bounded) {
          // A batch's time is shared among its passes' organizations by their estimates.
          const members = job.members ?? [job];
          const total = members.reduce((t, m) => t + Math.max(m.cost, 1e-6), 0);
          for (const m of members) this.host.recordUsage(lane, m.org, ((now - since) * Math.max(m.cost, 1e-6)) / total, now);
        }
        if (x) x.running = null;
        else lane.running = null;
        this.host.dispatch(lane);
      });
  }

  /**
   * Load (or unload) a model on every lane. Never refused for a full queue; runs once the inference tasks
   * queued before it have started. `entered`: a load's test counter (TestHooks.armLoad).
   */
  async setLoaded(model: string, loaded: boolean, entered: Int32Array | null = null): Promise<LoadOk[]> {
    const cost = loaded ? this.host.estimateLoadMs(model) : 0;
    const task: Task = { kind: loaded ? "load" : "unload", model, ...(entered ? { testEntered: entered } : {}) };
    const out = await Promise.all(this.all.map((l) => this.host.enqueue(l, task, { bounded: false, cost })));
    for (const r of out) if (!r.ok) throw new AssayError(r.code, r.message);
    if (loaded) {
      this.loaded.add(model);
      if (out.every((r) => r.ok && "batches" in r && r.batches)) this.batchable.add(model);
    } else {
      this.loaded.delete(model);
      this.batchable.delete(model);
      for (const x of this.all.map((l) => l.express)) {
        if (!x?.ready.delete(model)) continue;
        this.held(x.pool.run({ kind: "unload", model } satisfies Task)).catch((e: unknown) => console.error(`[assay] express unload of ${model} failed: ${String(e)}`));
      }
    }
    return out as LoadOk[];
  }

  /** Loads `model` into the lane's express worker (one load at a time); resolves when it is ready there, or not. */
  loadExpress(lane: Lane, model: string): Promise<void> {
    const x = lane.express;
    if (!x || x.loading !== null || x.ready.has(model) || !this.loaded.has(model) || this.host.closed()) return Promise.resolve();
    x.loading = model;
    const load = this.held(x.pool.run({ kind: "load", model } satisfies Task));
    return load
      .then(
        (r: unknown) => {
          if (!(r as TaskResult).ok) return;
          if (this.loaded.has(model)) x.ready.add(model);
          else void this.held(x.pool.run({ kind: "unload", model } satisfies Task)).catch(() => {}); // unloaded meanwhile
        },
        (e: unknown) => console.error(`[assay] inference lane ${lane.index} (express): load of ${model} failed: ${String(e)}`),
      )
      .finally(() => {
        x.loading = null;
        this.host.dispatch(lane);
      });
  }

  /**
   * Loads a model already on the main workers into every express worker now,
   * instead of on first need. Boot does it for the default build: loaded on
   * first need, the first short pass of a flood's victim waited behind the
   * long pass and the load (2.5–3 s for the 1.5B build: the small
   * organization's p99 in the overload test, docs/experiments/admission-and-fairness.md). Costs one
   * more session's memory per lane.
   */
  async preloadExpress(model: string): Promise<void> {
    await Promise.all(this.all.map((l) => this.loadExpress(l, model)));
  }

  /**
   * Loads the batch graph of a model already loaded, on every lane's main worker, now instead of on the
   * first batch. The server does it for the default build before it reports ready: loaded on the first
   * batch, the first burst after readiness waited for it (eight small requests sent at once: 20 s each on
   * the 1.5B, against 0.25 s for one alone). Nothing where the lanes do not batch (a GPU, batching off).
   */
  async preloadBatch(model: string): Promise<void> {
    if (!this.batchable.has(model) || this.batch.maxTokens <= 0 || this.batch.maxPasses <= 1) return;
    const out = await Promise.all(this.all.map((l) => this.host.enqueue(l, { kind: "load", model, batch: true }, { bounded: false, cost: this.host.estimateLoadMs(model) })));
    for (const r of out) if (!r.ok) throw new AssayError(r.code, r.message);
  }

  /** A task handed to a worker thread, tracked until it settles: close() lets it finish before the threads are terminated. */
  private held<T>(p: Promise<T>): Promise<T> {
    const done: Promise<void> = p.then(
      () => undefined,
      () => undefined,
    );
    this.inWorkers.add(done);
    void done.finally(() => this.inWorkers.delete(done));
    return p;
  }

  /** How long close() would now wait for what the workers hold: twice the longest running task's estimate left, TASK_DRAIN_MS at least. */
  closeWaitMs(): number {
    const now = performance.now();
    let rest = 0;
    for (const l of this.all) {
      if (l.running) rest = Math.max(rest, l.running.cost - (now - l.runningSince));
      if (l.express?.running) rest = Math.max(rest, l.express.running.cost - (now - l.express.runningSince));
    }
    return Math.max(TASK_DRAIN_MS, 2 * rest);
  }

  /** close(), once nothing waits any more: what the workers hold finishes (for at most `wait` ms), then the threads end. */
  async drain(wait: number): Promise<void> {
    // A worker terminated inside onnxruntime's native code (creating a session, or running a pass whose
    // request was cancelled) aborts the whole process: a native error thrown through N-API, "terminate
    // called after throwing an instance of 'Napi::Error'" (exit 134). Seen when a test's app closed
    // during the express worker's lazy load, and when a drain's deadline cancelled a request mid-pass.
    // What the workers hold finishes first, for at most `wait`.
    if (this.inWorkers.size > 0) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([Promise.all([...this.inWorkers]), new Promise<void>((r) => (timer = setTimeout(r, wait)))]);
      clearTimeout(timer);
    }
    await Promise.all(this.all.flatMap((l) => [l.pool.destroy(), ...(l.express ? [l.express.pool.destroy()] : [])]));
  }
}
