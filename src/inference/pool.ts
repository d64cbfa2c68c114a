import type { Config } from "../config/index.js";
import { AssayError } from "../errors/catalogue.js";
import { metrics } from "../observability/metrics.js";
import { Admission, expressMaxMs } from "./admission.js";
import { BatchForming } from "./batch-forming.js";
import { shapeOf, type CostModel, type PassShape } from "./cost.js";
import { ExpressPath } from "./express.js";
import type { AdmittedWork, Lane } from "./jobs.js";
import { Lanes } from "./lanes.js";
import type { PackedTensors } from "./pack.js";
import type { InferOk, InferTask, KvTask, LaneOptions, LoadOk } from "./protocol.js";
import { Queues } from "./queue.js";
import { attachTestHooks, TestHooks } from "./test-hooks.js";
import type { PlannedPass, WorkRequest } from "./work.js";

export type { AdmittedWork };

/**
 * Inference lanes. A lane is one worker thread with its own onnxruntime
 * sessions: one lane per GPU on CUDA, and on CPU by default one lane using
 * every core (a packed pass already fills them).
 *
 * Each lane keeps its own queue in front of piscina and hands the worker one
 * task at a time, so the pool always knows whether a task is waiting or
 * running:
 *
 *   admit ─► estimate ─► 529 / 422 now, or admitted (its planned work counted on a lane)
 *   infer ─► [org A: … | org B: … | loads] ─► running ─► worker thread
 *              │ fair by estimated work         │ aborted → caller gets 504/503 now;
 *              │ aborted → dropped              │ the pass finishes and is discarded
 *
 * Admission (`admit`, policy in work.ts) happens once per request, before
 * its credit hold and before any model work: the request's planned passes
 * are priced by each build's live cost model (cost.ts) against the work the
 * lane already has, and a request that would not finish by its deadline is
 * refused at once. An admitted request's passes are never refused later:
 * the request is pinned to one lane, and each pass it runs (found by the
 * request's AbortSignal, which every pass of it carries) moves its estimate
 * from "planned" to "queued". Passes are queued per organization and served
 * by start-time fair queueing (fair-queue.ts). Loads and unloads run once the
 * inference tasks queued before them have started; reloads after a crash first.
 *
 * Piscina would instead terminate a worker whose running task is aborted,
 * throwing away its loaded sessions; a late answer is cheaper than a reload.
 * When a worker dies (crash, exit), piscina starts a new thread; the pool
 * counts the restart, fails that task with 502, and loads the models that
 * were loaded into the new thread before the lane takes more work.
 *
 * This class only composes the parts (src/inference/README.md): the queue
 * (queue.ts), admission (admission.ts), batch forming (batch-forming.ts), the
 * express path (express.ts) and the lanes' workers (lanes.ts).
 */
export class InferencePool {
  private readonly lanes: Lane[];
  private readonly workers: Lanes;
  private readonly admission: Admission;
  private readonly queues: Queues;
  private readonly batching: BatchForming;
  private readonly express: ExpressPath;
  /** TEST ONLY: reached with testHooks(pool) (test-hooks.ts), never from the pool's surface. */
  private readonly hooks: TestHooks;
  private closed = false;
  private readonly queueSource = () => this.pending();
  /**
   * Called with every pass that teaches a cost model (one that ran alone on
   * its cores): its shape and its run time. For benches and tracing: the
   * `cost` bench replays these passes through cost models of its own.
   */
  onPassTimed: ((model: string, shape: PassShape, runMs: number) => void) | null = null;

  constructor(config: Config, fallback: Pick<LaneOptions, "cpuGraph"> = {}) {
    const closed = () => this.closed;
    this.workers = new Lanes(config, fallback, expressMaxMs(config) > 0, {
      closed,
      dispatch: (lane) => this.dispatch(lane),
      enqueue: (lane, task, opts) => this.queues.enqueue(lane, task, opts),
      estimateLoadMs: (model) => this.admission.estimateLoadMs(model),
      passTimed: (file, shape, runMs) => {
        this.admission.passTimed(file, shape, runMs);
        this.onPassTimed?.(file, shape, runMs);
      },
      loadTimed: (model, ms) => this.admission.loadTimed(model, ms),
      recordUsage: (lane, org, ms, now) => this.admission.recordUsage(lane, org, ms, now),
    });
    this.lanes = this.workers.all;
    const perLaneQueue = Math.max(0, Math.ceil(config.queueMax / this.lanes.length));
    this.admission = new Admission(config, this.lanes, perLaneQueue, closed);
    this.hooks = new TestHooks(config.testFaults === true, this);
    attachTestHooks(this, this.hooks);
    this.queues = new Queues(this.lanes, perLaneQueue, { closed, dispatch: (lane) => this.dispatch(lane), queued: () => this.hooks.queued() });
    this.batching = new BatchForming(config, {
      batches: (model) => this.workers.batches(model),
      costModel: (file) => this.admission.costModel(file),
      waited: (lane) => this.dispatch(lane, true),
    });
    this.express = new ExpressPath({
      closed,
      expressLimit: (model) => this.admission.expressLimit(model),
      isLoaded: (model) => this.workers.isLoaded(model),
      start: (lane, job, x) => this.workers.start(lane, job, x),
      loadExpress: (lane, model) => this.workers.loadExpress(lane, model),
    });
    metrics.queueSources.add(this.queueSource);
  }

  get laneCount(): number {
    return this.lanes.length;
  }

  /** Inference tasks waiting for a worker, over all lanes. */
  get queued(): number {
    return this.queues.queued;
  }

  /** Tasks running in a worker now, over all lanes. */
  get running(): number {
    return this.workers.running;
  }

  /** Workers that died and were replaced since start. */
  get restarts(): number {
    return this.workers.restarts;
  }

  /** Each organization's recent share of a lane's time (Admission.recentShares). */
  recentShares(): Map<string, number> {
    return this.admission.recentShares();
  }

  /** Requests admitted and not yet finished, over all lanes. */
  get admitted(): number {
    return this.admission.admitted;
  }

  /** The cost model of a model file (created from its manifest's size on first use). */
  costModel(model: string): CostModel {
    return this.admission.costModel(model);
  }

  /** The admission headroom now: SAFETY, raised while any build's recent passes overrun their estimates. */
  safety(): number {
    return this.admission.safety();
  }

  /** Estimated ms of passes, each by its build's cost model. */
  estimate(passes: readonly PlannedPass[]): number {
    return this.admission.estimate(passes);
  }

  /** Tokens and estimated ms admitted and not yet started, over all lanes (assay_inference_queue_tokens). */
  pending(): { tokens: number; ms: number } {
    return this.admission.pending();
  }

  /** Admission by estimated work (Admission.admit): the admitted work, or the 529 / 422 that says why not. */
  admit(passes: readonly PlannedPass[], req: WorkRequest): AdmittedWork {
    return this.admission.admit(passes, req);
  }

  /** A load's expected time: the last timed main-worker load, else the size prior. The lifecycle asks it too (ModelLoader). */
  estimateLoadMs(model: string): number {
    return this.admission.estimateLoadMs(model);
  }

  private dispatch(lane: Lane, waited = false): void {
    if (this.closed) return;
    if (!lane.running && !this.batching.waitForBatch(lane, waited)) {
      const job = this.queues.next(lane);
      if (job) {
        const run = this.batching.batchFrom(lane, job);
        lane.running = run;
        lane.runningSince = performance.now();
        this.workers.start(lane, run, null);
      }
    }
    this.express.dispatch(lane);
  }

  async infer(model: string, p: PackedTensors, signal?: AbortSignal, kv?: KvTask): Promise<InferOk> {
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
      ...(kv ? { kv } : {}),
    };
    this.hooks.armInfer(task);
    const shape = shapeOf(p, kv?.past?.tokens ?? 0);
    const cost = this.admission.costModel(model).estimate(shape);
    // A pass of an admitted request runs on its lane, in its organization's queue, out of its planned work.
    const work = this.admission.workOf(signal);
    if (work && !work.released) work.consume(cost, shape.tokens);
    const lane = work ? work.lane : this.admission.pick();
    // Copies are sent so the caller's PackedRequest stays readable.
    const r = await this.queues.enqueue(lane, task, { bounded: true, org: work?.org ?? "", cost, tokens: shape.tokens, shape, work }, signal);
    if (!r.ok) throw new AssayError(r.code, `the model failed: ${r.message}`);
    return r as InferOk;
  }

  /** Load (or unload) a model on every lane. Never refused for a full queue; runs once the inference tasks queued before it have started. */
  async setLoaded(model: string, loaded: boolean): Promise<LoadOk[]> {
    return this.workers.setLoaded(model, loaded, loaded ? this.hooks.armLoad() : null);
  }

  /** Loads a model already on the main workers into every express worker now, instead of on first need (Lanes.preloadExpress). */
  async preloadExpress(model: string): Promise<void> {
    await this.workers.preloadExpress(model);
  }

  /** Loads the batch graph of a model already loaded, on every lane's main worker, now (Lanes.preloadBatch). */
  async preloadBatch(model: string): Promise<void> {
    await this.workers.preloadBatch(model);
  }

  /** How long close() would now wait for what the workers hold: twice the longest running task's estimate left, TASK_DRAIN_MS at least. */
  closeWaitMs(): number {
    return this.workers.closeWaitMs();
  }

  async close(): Promise<void> {
    const wait = this.closeWaitMs();
    this.closed = true;
    metrics.queueSources.delete(this.queueSource);
    for (const l of this.lanes) {
      this.batching.cancel(l);
      this.queues.rejectWaiting(l);
      this.admission.releaseAll(l);
    }
    this.hooks.releaseStalls();
    await this.workers.drain(wait);
  }
}
