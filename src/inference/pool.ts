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
import type { PackedTensors } from "./pack.js";
import type { InferOk, InferTask, LaneOptions, LoadOk, Task, TaskResult, TestFault } from "./protocol.js";

/** Compiled worker: piscina loads JavaScript, so the build must exist. */
export const WORKER_FILE = path.join(ROOT, "dist", "src", "inference", "worker.js");

/**
 * Inference lanes. A lane is one worker thread with its own onnxruntime
 * sessions: one lane per GPU on CUDA, and on CPU by default one lane using
 * every core (a packed pass already fills them).
 *
 * Each lane keeps its own FIFO in front of piscina and hands the worker one
 * task at a time, so the pool always knows whether a task is waiting or
 * running:
 *
 *   infer ─► [waiting … waiting] ─► running ─► worker thread
 *              │ full → 529           │ aborted → caller gets 504/503 now;
 *              │ aborted → dropped    │ the pass finishes and is discarded
 *
 * Piscina would instead terminate a worker whose running task is aborted,
 * throwing away its loaded sessions; a late answer is cheaper than a reload.
 * When a worker dies (crash, exit), piscina starts a new thread; the pool
 * counts the restart, fails that task with 502, and loads the models that
 * were loaded into the new thread before the lane takes more work.
 */
interface Job {
  task: Task;
  /** Counted against the queue bound (infer) or not (load/unload must never be refused). */
  bounded: boolean;
  resolve(r: TaskResult): void;
  reject(e: unknown): void;
  enqueuedAt: number;
  settled: boolean;
  cleanup(): void;
}

interface Lane {
  index: number;
  pool: Piscina;
  opts: LaneOptions;
  waiting: Job[];
  running: Job | null;
}

const BUSY_DETAIL = "the model is busy: the inference queue is full; retry after about one second";

/** An abort reason as the error the caller should get: ours when it is an AssayError, else 504. */
function abortError(signal: AbortSignal): AssayError {
  const r: unknown = signal.reason;
  if (r instanceof AssayError) return r;
  return new AssayError("TIMEOUT", "the request was cancelled before inference finished");
}

export class InferencePool {
  private readonly lanes: Lane[];
  private readonly perLaneQueue: number;
  /** Models loaded on every lane (onnx paths), reloaded into a replacement worker. */
  private readonly loaded = new Set<string>();
  private readonly testFaults: boolean;
  private nextFault: TestFault | null = null;
  private closed = false;
  /** Workers that died and were replaced since start. */
  restarts = 0;

  constructor(config: Config) {
    if (!fs.existsSync(WORKER_FILE)) {
      throw new Error(`worker ${WORKER_FILE} is not built; run npm run build (npm start/test do it for you)`);
    }
    this.testFaults = config.testFaults === true;
    const testFaults = this.testFaults;
    const opts: LaneOptions[] =
      config.provider === "cuda"
        ? config.cudaDevices.map((deviceId) => ({
            provider: "cuda",
            deviceId,
            intraOpThreads: config.intraOpThreads,
            cudaFallbackCpu: config.cudaFallbackCpu,
            testFaults,
          }))
        : Array.from({ length: config.workers }, () => ({
            provider: "cpu",
            deviceId: 0,
            intraOpThreads: config.intraOpThreads,
            cudaFallbackCpu: false,
            testFaults,
          }));
    this.perLaneQueue = Math.max(0, Math.ceil(config.queueMax / opts.length));
    this.lanes = opts.map((o, index) => {
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
      pool.on("error", (err: unknown) => console.error(`[assay] inference lane ${index}: ${String(err)}`));
      return { index, pool, opts: o, waiting: [], running: null };
    });
  }

  get laneCount(): number {
    return this.lanes.length;
  }

  /** Requests waiting for a worker, over all lanes. */
  get queued(): number {
    return this.lanes.reduce((s, l) => s + l.waiting.filter((j) => j.bounded).length, 0);
  }

  /** Tasks running in a worker now, over all lanes. */
  get running(): number {
    return this.lanes.reduce((s, l) => s + (l.running ? 1 : 0), 0);
  }

  private pick(): Lane {
    let best = this.lanes[0]!;
    let load = Infinity;
    for (const l of this.lanes) {
      const n = l.waiting.length + (l.running ? 1 : 0);
      if (n < load) {
        best = l;
        load = n;
      }
    }
    return best;
  }

  private enqueue(lane: Lane, task: Task, bounded: boolean, signal?: AbortSignal, front = false): Promise<TaskResult> {
    if (this.closed) return Promise.reject(new AssayError("UNAVAILABLE", "the inference pool is closed; the service is shutting down", 1));
    if (signal?.aborted) return Promise.reject(abortError(signal));
    if (bounded && (lane.running || lane.waiting.length > 0)) {
      const waiting = lane.waiting.filter((j) => j.bounded).length;
      if (waiting >= this.perLaneQueue) return Promise.reject(new AssayError("MODEL_BUSY", BUSY_DETAIL, 1));
    }
    return new Promise<TaskResult>((resolve, reject) => {
      const job: Job = {
        task,
        bounded,
        enqueuedAt: performance.now(),
        settled: false,
        resolve: (r) => {
          if (job.settled) return;
          job.settled = true;
          job.cleanup();
          resolve(r);
        },
        reject: (e) => {
          if (job.settled) return;
          job.settled = true;
          job.cleanup();
          reject(e);
        },
        cleanup: () => {},
      };
      if (signal) {
        const onAbort = () => {
          const i = lane.waiting.indexOf(job);
          if (i >= 0) {
            // Still queued: dropped, never reaches the worker.
            lane.waiting.splice(i, 1);
            if (job.bounded) metrics.queueDepth.dec();
          }
          job.reject(abortError(signal));
        };
        signal.addEventListener("abort", onAbort, { once: true });
        job.cleanup = () => signal.removeEventListener("abort", onAbort);
      }
      if (front) lane.waiting.unshift(job);
      else lane.waiting.push(job);
      if (bounded) metrics.queueDepth.inc();
      this.dispatch(lane);
    });
  }

  private dispatch(lane: Lane): void {
    if (lane.running || this.closed) return;
    const job = lane.waiting.shift();
    if (!job) return;
    if (job.bounded) metrics.queueDepth.dec();
    lane.running = job;
    metrics.queueWait.observe((performance.now() - job.enqueuedAt) / 1000);
    const transfer: ArrayBuffer[] = [];
    lane.pool
      .run(job.task, { transferList: transfer })
      .then(
        (r: unknown) => job.resolve(r as TaskResult),
        (e: unknown) => {
          if (this.closed) {
            job.reject(new AssayError("UNAVAILABLE", "the inference pool was closed before the task finished; the service is shutting down", 1));
            return;
          }
          // The worker thread died with the task in hand (an error escaped it, or it exited).
          const msg = e instanceof Error ? e.message : String(e);
          this.restarts++;
          metrics.workerRestarts.inc();
          console.error(`[assay] inference lane ${lane.index}: worker died (${msg}); piscina starts a replacement`);
          job.reject(new AssayError("MODEL_FAILED", `the model worker failed and was restarted: ${msg}; retry the request`));
          // Reload before anything else runs on the new thread (not when a load itself killed it: no loop).
          if (job.task.kind !== "infer") return;
          for (const model of this.loaded) {
            this.enqueue(lane, { kind: "load", model }, false, undefined, true).then(
              (r) => {
                if (!r.ok) console.error(`[assay] inference lane ${lane.index}: reload of ${model} failed: ${r.message}`);
              },
              (err: unknown) => console.error(`[assay] inference lane ${lane.index}: reload of ${model} failed: ${String(err)}`),
            );
          }
        },
      )
      .finally(() => {
        lane.running = null;
        this.dispatch(lane);
      });
  }

  async infer(model: string, p: PackedTensors, signal?: AbortSignal): Promise<InferOk> {
    const task: InferTask = {
      kind: "infer",
      model,
      inputIds: p.inputIds,
      positionIds: p.positionIds,
      subtreeEnd: p.subtreeEnd,
      gatherIdx: p.gatherIdx,
      targetIds: p.targetIds,
      rows: p.rows,
      width: p.width,
      branchSlots: p.branchSlots,
      slotOf: p.slotOf,
      branches: p.branches,
      branchWidth: p.branchWidth,
    };
    if (this.nextFault) {
      task.testFault = this.nextFault;
      this.nextFault = null;
    }
    // Copies are sent so the caller's PackedRequest stays readable.
    const r = await this.enqueue(this.pick(), task, true, signal);
    if (!r.ok) throw new AssayError(r.code, `the model failed: ${r.message}`);
    return r as InferOk;
  }

  /** Load (or unload) a model on every lane. Never refused for a full queue; runs after the tasks before it. */
  async setLoaded(model: string, loaded: boolean): Promise<LoadOk[]> {
    const out = await Promise.all(this.lanes.map((l) => this.enqueue(l, { kind: loaded ? "load" : "unload", model }, false)));
    for (const r of out) if (!r.ok) throw new AssayError(r.code, r.message);
    if (loaded) this.loaded.add(model);
    else this.loaded.delete(model);
    return out as LoadOk[];
  }

  /**
   * TEST ONLY (ASSAY_TEST_FAULTS=1, refused otherwise): the next infer task
   * carries `fault` (see TestFault). For `stall`, returns the function that
   * lets the stalled task go on.
   */
  injectFaultForTest(kind: TestFault["kind"]): () => void {
    if (!this.testFaults) throw new Error("fault injection is off: start with ASSAY_TEST_FAULTS=1 (tests only)");
    if (kind !== "stall") {
      this.nextFault = { kind };
      return () => {};
    }
    const flag = new Int32Array(new SharedArrayBuffer(4));
    this.nextFault = { kind, flag };
    return () => {
      Atomics.store(flag, 0, 1);
      Atomics.notify(flag, 0);
    };
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const l of this.lanes) {
      for (const j of l.waiting.splice(0)) {
        if (j.bounded) metrics.queueDepth.dec();
        j.reject(new AssayError("UNAVAILABLE", "the inference pool is closed; the service is shutting down", 1));
      }
    }
    await Promise.all(this.lanes.map((l) => l.pool.destroy()));
  }
}
