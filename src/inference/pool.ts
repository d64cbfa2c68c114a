import path from "node:path";
import fs from "node:fs";
import { Piscina } from "piscina";
import { ROOT, type Config } from "../config/index.js";
import { AssayError } from "../errors/catalogue.js";
import type { PackedTensors } from "./pack.js";
import type { InferOk, LaneOptions, LoadOk, Task, TaskResult } from "./protocol.js";

/** Compiled worker: piscina loads JavaScript, so the build must exist. */
export const WORKER_FILE = path.join(ROOT, "dist", "src", "inference", "worker.js");

/**
 * Inference lanes. A lane is one worker thread with its own onnxruntime
 * sessions: one lane per GPU on CUDA, and on CPU by default one lane using
 * every core (a packed pass already fills them). Each lane's queue is bounded;
 * when every lane is full the request is refused at once with 529.
 */
export class InferencePool {
  private readonly lanes: { pool: Piscina; opts: LaneOptions }[];

  constructor(config: Config) {
    if (!fs.existsSync(WORKER_FILE)) {
      throw new Error(`worker ${WORKER_FILE} is not built; run npm run build (npm start/test do it for you)`);
    }
    const opts: LaneOptions[] =
      config.provider === "cuda"
        ? config.cudaDevices.map((deviceId) => ({
            provider: "cuda",
            deviceId,
            intraOpThreads: config.intraOpThreads,
            cudaFallbackCpu: config.cudaFallbackCpu,
          }))
        : Array.from({ length: config.workers }, () => ({
            provider: "cpu",
            deviceId: 0,
            intraOpThreads: config.intraOpThreads,
            cudaFallbackCpu: false,
          }));
    const perLaneQueue = Math.max(0, Math.ceil(config.queueMax / opts.length));
    this.lanes = opts.map((o) => ({
      opts: o,
      pool: new Piscina({
        filename: WORKER_FILE,
        minThreads: 1,
        maxThreads: 1,
        concurrentTasksPerWorker: 1,
        maxQueue: perLaneQueue,
        idleTimeout: Number.POSITIVE_INFINITY,
        workerData: o,
      }),
    }));
  }

  get laneCount(): number {
    return this.lanes.length;
  }

  /** Requests waiting for a worker, over all lanes. */
  get queued(): number {
    return this.lanes.reduce((s, l) => s + l.pool.queueSize, 0);
  }

  private pick() {
    let best = this.lanes[0]!;
    let load = Infinity;
    for (const l of this.lanes) {
      const n = l.pool.queueSize + l.pool.utilization;
      if (n < load) {
        best = l;
        load = n;
      }
    }
    return best;
  }

  private async submit(pool: Piscina, task: Task, transfer: ArrayBufferLike[], signal?: AbortSignal): Promise<TaskResult> {
    try {
      return (await pool.run(task, { transferList: transfer as ArrayBuffer[], ...(signal ? { signal } : {}) })) as TaskResult;
    } catch (e) {
      const msg = e instanceof Error ? e.message : String(e);
      if (/queue is at limit/i.test(msg)) {
        throw new AssayError("MODEL_BUSY", "the model is busy: the inference queue is full; retry after about one second", 1);
      }
      if ((e as { name?: string })?.name === "AbortError") {
        throw new AssayError("TIMEOUT", "the request was cancelled before inference finished");
      }
      throw new AssayError("MODEL_FAILED", `the model worker failed: ${msg}`);
    }
  }

  async infer(model: string, p: PackedTensors, signal?: AbortSignal): Promise<InferOk> {
    const task: Task = {
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
    // Copies are sent so the caller's PackedRequest stays readable.
    const r = await this.submit(this.pick().pool, task, [], signal);
    if (!r.ok) throw new AssayError(r.code, `the model failed: ${r.message}`);
    return r as InferOk;
  }

  /** Load (or unload) a model on every lane. */
  async setLoaded(model: string, loaded: boolean): Promise<LoadOk[]> {
    const out = await Promise.all(
      this.lanes.map((l) => this.submit(l.pool, { kind: loaded ? "load" : "unload", model }, [])),
    );
    for (const r of out) if (!r.ok) throw new AssayError(r.code, r.message);
    return out as LoadOk[];
  }

  async close(): Promise<void> {
    await Promise.all(this.lanes.map((l) => l.pool.destroy()));
  }
}
