import path from "node:path";
import fs from "node:fs";
import { Piscina } from "piscina";
// Keeps onnxruntime's native binding loaded in the main thread for the life
// of the process. Without it, when a worker thread dies the library is
// unloaded with it, and the replacement thread's load fails with "Module did
// not self-register" (static initialisers do not run twice in one process).
import "onnxruntime-node";
import { ROOT, type Config, type ExecutionProvider } from "../config/index.js";
import { AssayError } from "../errors/catalogue.js";
import { metrics } from "../observability/metrics.js";
import { batchScores, batchShape, CostModel, GPU_SPEED_PRIOR_MS, priorCoefficients, shapeOf, type BuildFacts, type PassShape } from "./cost.js";
import { batchGraphOf } from "./batch.js";
import { FairQueue } from "./fair-queue.js";
import type { PackedTensors } from "./pack.js";
import type { BatchOk, InferOk, InferTask, KvTask, LaneOptions, LoadOk, Task, TaskResult, TestFault } from "./protocol.js";
import { admissionSafety, fairFinishMs, judge, refusal, type Judgement, type PlannedPass, type RequestDeadline, type WorkRequest } from "./work.js";

/** Compiled worker: piscina loads JavaScript, so the build must exist. */
export const WORKER_FILE = path.join(ROOT, "dist", "src", "inference", "worker.js");

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
 */
interface Job {
  task: Task;
  /** An inference task (queued fairly, counted in the queue depth) or a load/unload (never refused). */
  bounded: boolean;
  org: string;
  /** Estimated ms. */
  cost: number;
  tokens: number;
  shape: PassShape | null;
  /** Arrival order, so that a load runs after the inference queued before it. */
  seq: number;
  /** Order within its organization's queue: its request's admission order. */
  rank: number;
  /** A reload after a crash: runs before anything else. */
  front: boolean;
  work: Work | null;
  /** A batched run (batchFrom): the passes it holds, each settled with its own part of the result. */
  members: Job[] | null;
  resolve(r: TaskResult): void;
  reject(e: unknown): void;
  enqueuedAt: number;
  settled: boolean;
  cleanup(): void;
}

/**
 * A lane's second worker (CPU, ASSAY_EXPRESS_MAX_MS > 0): it takes a short
 * waiting pass while the main worker is busy with a long one, so a small
 * request does not wait out a large request's pass. The two share the cores:
 * measured here (2 cores, 2 threads each, 0.5B), a 189-token pass took 0.41 s
 * alone and about 0.8 s beside a 4,759-token one, and the pair did the same
 * total work per second as one worker (docs/experiments/admission-and-fairness.md).
 * The default build loads into it at boot (preloadExpress), other builds on
 * first need (no memory spent until passes contend); a pass whose model is
 * still loading waits for the main worker.
 */
interface Express {
  pool: Piscina;
  running: Job | null;
  runningSince: number;
  /** Models loaded in the express worker. */
  ready: Set<string>;
  /** The model being loaded into it, if any (one at a time). */
  loading: string | null;
}

interface Lane {
  index: number;
  pool: Piscina;
  opts: LaneOptions;
  express: Express | null;
  queue: FairQueue<Job>;
  system: Job[];
  running: Job | null;
  runningSince: number;
  /** Admitted requests pinned to this lane and not yet finished. */
  works: Set<Work>;
  /** ASSAY_BATCH_WAIT_MS: the idle lane waits for more passes to batch with the one queued. */
  batchWait: NodeJS.Timeout | null;
  /** Per organization: the lane's busy ms it used, decayed with USAGE_TAU_MS (its recent share of the lane). */
  usage: Map<string, { ms: number; at: number }>;
}

/** A pass on the express worker beside a long one takes up to this many times its estimate (0.41 s alone, about 0.8 s beside: the Express note). */
const BESIDE_SLOWDOWN = 2;

/** Time constant of an organization's recent share of a lane. */
const USAGE_TAU_MS = 30_000;

/** An admitted request: its planned work, until it ends. Release it in `finally` (an abort releases it too). */
export interface AdmittedWork {
  /** Estimated ms of the request's own passes. */
  readonly estimateMs: number;
  /** Estimated ms of other work that runs before it finishes. */
  readonly waitMs: number;
  /** The deadline it was admitted under, ms from arrival; null without one (CLI, batch). */
  readonly deadlineMs: number | null;
  /**
   * The passes still to run are now known to be `passes` (an escalation's
   * actual items): they replace the rest of the plan, and the deadline is
   * raised if the request's own work now needs more (up to the cap).
   */
  replan(passes: readonly PlannedPass[]): void;
  release(): void;
}

class Work implements AdmittedWork {
  remainingMs: number;
  remainingTokens: number;
  released = false;
  private static nextSeq = 0;
  /** Admission order (its passes' rank in the organization's queue). */
  readonly seq = Work.nextSeq++;
  private readonly onRelease: Array<() => void> = [];

  /** Estimated ms of the passes it has queued so far. */
  private consumedMs = 0;

  constructor(
    readonly org: string,
    readonly lane: Lane,
    public estimateMs: number,
    tokens: number,
    readonly waitMs: number,
    public deadlineMs: number | null,
    private readonly pool: Pick<InferencePool, "estimate" | "safety">,
    private readonly deadline: RequestDeadline | undefined,
    /** Admitted on the express worker's wait (InferencePool.besideWaitMs): its planned passes are short ones that go beside. */
    readonly beside = false,
  ) {
    this.remainingMs = estimateMs;
    this.remainingTokens = tokens;
  }

  /** A planned pass was queued: its estimate moves from the plan to the queue. */
  consume(ms: number, tokens: number): void {
    this.consumedMs += ms;
    this.remainingMs = Math.max(0, this.remainingMs - ms);
    this.remainingTokens = Math.max(0, this.remainingTokens - tokens);
  }

  replan(passes: readonly PlannedPass[]): void {
    if (this.released) return;
    this.remainingMs = this.pool.estimate(passes);
    this.remainingTokens = passes.reduce((s, p) => s + p.shape.tokens, 0);
    this.estimateMs = this.consumedMs + this.remainingMs;
    const d = this.deadline;
    if (!d || this.deadlineMs === null) return;
    const j = judge({ ownMs: this.estimateMs, waitMs: 0, elapsedMs: 0, defaultMs: d.defaultMs, maxMs: d.maxMs }, this.pool.safety());
    if (j.deadlineMs > this.deadlineMs) {
      this.deadlineMs = j.deadlineMs;
      d.admitted({ deadlineMs: j.deadlineMs, ownMs: this.estimateMs, waitMs: this.waitMs });
    }
  }

  whenReleased(fn: () => void): void {
    this.onRelease.push(fn);
  }

  release(): void {
    if (this.released) return;
    this.released = true;
    // Passes planned and never run (a cache hit, a cancelled request) are no longer work ahead of anyone.
    this.remainingMs = 0;
    this.remainingTokens = 0;
    this.lane.works.delete(this);
    for (const fn of this.onRelease.splice(0)) fn();
  }
}

const BUSY_DETAIL = "the model is busy: the inference queue is full; retry after about one second";

/**
 * Bytes per ms a session load reads at, plus set-up: the prior before a model's load was timed, for
 * admission here and for the model lifecycle's 503 Retry-After (estimateLoadMs). Once timed, its last
 * main-worker load is the estimate: the prior is 3–5× too long on a warm page cache (a reload of both
 * builds after a crash estimated at 22.6 s ran in about 5 s), enough, with other organizations' recent
 * work, to refuse the first request after a crash.
 */
const LOAD_BYTES_PER_MS = 150_000;
const LOAD_SETUP_MS = 2_000;
/** A model file's metric label: its build folder. */
const buildLabel = (model: string) => path.basename(path.dirname(model));

/**
 * The least close() waits for the tasks in the workers' hands (a model load, a pass, cancelled or not)
 * before it terminates the workers; a running pass estimated longer gets twice its estimate left
 * (closeWaitMs). Passes are bounded by ASSAY_MAX_PACKED_TOKENS, but not in time: a 3,700-token pass
 * of the 1.5B build took 67 s on a 2-core machine without AVX-512.
 */
const TASK_DRAIN_MS = 60_000;

/** Resolves once `counter[0]` reaches `n`; Atomics.waitAsync leaves the main thread's event loop free meanwhile. */
async function untilCount(counter: Int32Array, n: number): Promise<void> {
  // (every supported Node has it; TypeScript types it from lib es2024 only.)
  const waitAsync = (Atomics as unknown as { waitAsync(a: Int32Array, i: number, v: number): { value: Promise<string> | string } }).waitAsync;
  for (let v = Atomics.load(counter, 0); v < n; v = Atomics.load(counter, 0)) await waitAsync(counter, 0, v).value;
}

/** An abort reason as the error the caller should get: ours when it is an AssayError, else 504. */
function abortError(signal: AbortSignal): AssayError {
  const r: unknown = signal.reason;
  if (r instanceof AssayError) return r;
  return new AssayError("TIMEOUT", "the request was cancelled before inference finished");
}

function fileSize(file: string): number {
  let size = 0;
  for (const f of [file, `${file}.data`]) {
    try {
      size += fs.statSync(f).size;
    } catch {
      // absent: the load reports it
    }
  }
  return size;
}

/** Parameters and shape from the build's manifest.json next to its model file; null when unreadable. */
function buildFacts(model: string): BuildFacts | null {
  try {
    const m = JSON.parse(fs.readFileSync(path.join(path.dirname(model), "manifest.json"), "utf8")) as Record<string, unknown>;
    const parameters = Number(m.parameters);
    const hiddenSize = Number(m.hidden_size);
    const layers = Number(m.num_layers);
    if ([parameters, hiddenSize, layers].every((x) => Number.isFinite(x) && x > 0)) return { parameters, hiddenSize, layers };
  } catch {
    // no manifest: the reference build's figures
  }
  return null;
}

/** Attention heads of a build (hidden size / head size, from its manifest.json); 1 when unreadable, which only loosens the attention bound of a batch. */
function attentionHeads(model: string): number {
  try {
    const m = JSON.parse(fs.readFileSync(path.join(path.dirname(model), "manifest.json"), "utf8")) as { hidden_size?: number; kv?: { head_dim?: number } };
    const h = Number(m.hidden_size) / Number(m.kv?.head_dim);
    return Number.isFinite(h) && h >= 1 ? h : 1;
  } catch {
    return 1;
  }
}

/** Requests (admitted work) a running task serves: a batch's distinct ones. */
function runningWorks(job: Job | null): number {
  if (!job) return 0;
  return new Set((job.members ?? [job]).flatMap((m) => (m.work ? [m.work] : []))).size;
}

export class InferencePool {
  private readonly lanes: Lane[];
  private readonly perLaneQueue: number;
  /** Models loaded on every lane (onnx paths), reloaded into a replacement worker. */
  private readonly loaded = new Set<string>();
  private readonly testFaults: boolean;
  private nextFault: TestFault | null = null;
  /** untilWorkerEntersForTest: the counter the next task of each kind carries (TestEntered). */
  private readonly nextEntered: { load: Int32Array | null; infer: Int32Array | null } = { load: null, infer: null };
  /** untilQueuedForTest's callers, each waiting for `n` queued tasks. */
  private queuedWaiters: { n: number; resolve: () => void }[] = [];
  /** Releases of the stall faults not yet let go: close() lets them go, so it does not wait out its bound on a test's stall. */
  private readonly stalls = new Set<() => void>();
  private closed = false;
  private seq = 0;
  /** Per model file: the live cost estimate of its passes (shared by the lanes, which run the same provider). */
  private readonly costs = new Map<string, CostModel>();
  /** Every task a worker holds (loads, unloads, passes): close() lets them finish before it terminates the threads. */
  private readonly inWorkers = new Set<Promise<void>>();
  /** Per model file: ms its last load on a main worker took (the estimate of its reload). */
  private readonly loadMs = new Map<string, number>();
  /** The admitted request each request signal belongs to: every pass run with that signal is its work. */
  private readonly bySignal = new WeakMap<AbortSignal, Work>();
  private readonly provider: ExecutionProvider;
  private readonly threads: number;
  private readonly queueSource = () => this.pending();
  private readonly expressMaxMs: number;
  private readonly expressMaxTokens: number;
  private readonly batch: Config["batch"];
  private readonly maxPackedTokens: number;
  private readonly passAttentionBytes: number;
  /** Model files whose graph runs several requests' passes as one (LoadOk.batches on every lane). */
  private readonly batchable = new Set<string>();
  /** Per model file: attention heads (hidden size / head size, from its manifest), for the attention bound of a batch. */
  private readonly heads = new Map<string, number>();
  /** Workers that died and were replaced since start. */
  restarts = 0;
  /**
   * Called with every pass that teaches a cost model (one that ran alone on
   * its cores): its shape and its run time. For benches and tracing: the
   * `cost` bench replays these passes through cost models of its own.
   */
  onPassTimed: ((model: string, shape: PassShape, runMs: number) => void) | null = null;

  constructor(config: Config, fallback: Pick<LaneOptions, "cpuGraph"> = {}) {
    if (!fs.existsSync(WORKER_FILE)) {
      throw new Error(`worker ${WORKER_FILE} is not built; run npm run build (npm start/test do it for you)`);
    }
    this.testFaults = config.testFaults === true;
    this.provider = config.provider;
    this.threads = config.intraOpThreads;
    const testFaults = this.testFaults;
    const lane = { intraOpThreads: config.intraOpThreads, spinning: config.intraOpSpinning, gpuFallbackCpu: config.gpuFallbackCpu, testFaults };
    // A GPU lane runs its passes alone: the batch graph is the W8A8 build's, for the CPU (LoadOk.batches).
    const opts: LaneOptions[] =
      config.provider === "cpu"
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
    this.perLaneQueue = Math.max(0, Math.ceil(config.queueMax / opts.length));
    this.expressMaxMs = config.provider === "cpu" ? config.expressMaxMs : 0;
    this.expressMaxTokens = config.expressMaxTokens;
    this.batch = config.batch;
    this.maxPackedTokens = config.maxPackedTokens;
    this.passAttentionBytes = config.passAttentionBytes;
    const worker = (o: LaneOptions, name: string) => {
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
    };
    this.lanes = opts.map((o, index) => {
      const express: Express | null =
        this.expressMaxMs > 0 ? { pool: worker({ ...o, batching: false }, `lane ${index} (express)`), running: null, runningSince: 0, ready: new Set(), loading: null } : null;
      // Beside an express worker the main one runs at a higher nice value: a short pass gets most of the cores while both run.
      const pool = worker(express && config.mainWorkerNice > 0 ? { ...o, nice: config.mainWorkerNice } : o, `lane ${index}`);
      return { index, pool, opts: o, express, queue: new FairQueue<Job>(), system: [], running: null, runningSince: 0, works: new Set<Work>(), batchWait: null, usage: new Map() };
    });
    metrics.queueSources.add(this.queueSource);
  }

  get laneCount(): number {
    return this.lanes.length;
  }

  /** Inference tasks waiting for a worker, over all lanes. */
  get queued(): number {
    return this.lanes.reduce((s, l) => s + l.queue.length, 0);
  }

  /** Tasks running in a worker now, over all lanes. */
  get running(): number {
    return this.lanes.reduce((s, l) => s + (l.running ? 1 : 0) + (l.express?.running ? 1 : 0), 0);
  }

  /**
   * Each organization's recent share of a lane's time (0–1, its busiest lane),
   * as admission weighs the work other organizations will keep sending
   * (fairFinishMs): what a 529 for an idle queue was judged on.
   */
  recentShares(): Map<string, number> {
    const now = performance.now();
    const out = new Map<string, number>();
    for (const lane of this.lanes) for (const [org, share] of this.rates(lane, now)) out.set(org, Math.max(share, out.get(org) ?? 0));
    return out;
  }

  /** Requests admitted and not yet finished, over all lanes. */
  get admitted(): number {
    return this.lanes.reduce((s, l) => s + l.works.size, 0);
  }

  /** The cost model of a model file (created from its manifest's size on first use). */
  costModel(model: string): CostModel {
    let c = this.costs.get(model);
    if (!c) {
      c = new CostModel(priorCoefficients(buildFacts(model), this.provider, this.threads), this.provider === "cpu" ? undefined : GPU_SPEED_PRIOR_MS);
      this.costs.set(model, c);
      this.publish(model, c);
    }
    return c;
  }

  private publish(model: string, c: CostModel): void {
    metrics.admissionSafety.set(this.safety());
    // The per-build gauges are model.onnx's passes; the batch graph's own estimate stays internal.
    if (model.endsWith(".batch.onnx")) return;
    const build = buildLabel(model);
    metrics.buildMsPerToken.set({ build }, c.coefficients.perToken);
    metrics.buildMsPerPair.set({ build }, c.coefficients.perPair);
  }

  /** The admission headroom now: SAFETY, raised while any build's recent passes overrun their estimates. */
  safety(): number {
    let overrun = 1;
    for (const c of this.costs.values()) overrun = Math.max(overrun, c.overrun());
    return admissionSafety(overrun);
  }

  /**
   * The longest estimate that counts as a short pass of `model`: the
   * configured ms, or the build's own estimate for a pass of
   * `expressMaxTokens` fresh tokens where that is longer. A fixed bound in ms
   * fitted the 0.5B; on the 1.5B (the default build) a one-question request
   * on a 500-token state is estimated at about 2 s, so it waited behind a
   * flood's pass of a minute (docs/experiments/admission-and-fairness.md). Taken from the
   * live cost model, the bound follows the machine's pace as well.
   */
  private expressLimit(model: string): number {
    if (this.expressMaxMs === 0) return 0;
    const n = this.expressMaxTokens;
    return n > 0 ? Math.max(this.expressMaxMs, this.costModel(model).estimate({ tokens: n, prefix: n, branches: 0, width: 0 })) : this.expressMaxMs;
  }

  /** Estimated ms of passes, each by its build's cost model. */
  estimate(passes: readonly PlannedPass[]): number {
    return passes.reduce((s, p) => s + this.costModel(p.model).estimate(p.shape), 0);
  }

  /** Work on a lane: the running task's rest and queued loads (`aheadMs`), and per organization its queued and planned work. */
  private backlog(lane: Lane, now = performance.now()): { aheadMs: number; byOrg: Map<string, number>; totalMs: number } {
    let aheadMs = lane.running ? Math.max(0, lane.running.cost - (now - lane.runningSince)) : 0;
    for (const j of lane.system) aheadMs += j.cost;
    const byOrg = new Map<string, number>();
    const add = (org: string, ms: number) => byOrg.set(org, (byOrg.get(org) ?? 0) + ms);
    for (const j of lane.queue) add(j.org, j.cost);
    for (const w of lane.works) if (w.remainingMs > 0) add(w.org, w.remainingMs);
    let totalMs = aheadMs;
    for (const ms of byOrg.values()) totalMs += ms;
    return { aheadMs, byOrg, totalMs };
  }

  /** Each organization's recent share of the lane's time (0–1). */
  private rates(lane: Lane, now: number): Map<string, number> {
    const out = new Map<string, number>();
    for (const [org, u] of lane.usage) {
      const ms = u.ms * Math.exp(-(now - u.at) / USAGE_TAU_MS);
      if (ms < 1) lane.usage.delete(org);
      else out.set(org, ms / USAGE_TAU_MS);
    }
    return out;
  }

  private recordUsage(lane: Lane, org: string, ms: number, now: number): void {
    const u = lane.usage.get(org);
    const prev = u ? u.ms * Math.exp(-(now - u.at) / USAGE_TAU_MS) : 0;
    lane.usage.set(org, { ms: prev + ms, at: now });
  }

  /** Tokens and estimated ms admitted and not yet started, over all lanes (assay_inference_queue_tokens). */
  pending(): { tokens: number; ms: number } {
    let tokens = 0;
    let ms = 0;
    for (const l of this.lanes) {
      for (const j of l.queue) {
        tokens += j.tokens;
        ms += j.cost;
      }
      for (const w of l.works) {
        tokens += w.remainingTokens;
        ms += w.remainingMs;
      }
    }
    return { tokens, ms };
  }

  /** The lane with the least estimated work. */
  private pick(): Lane {
    let best = this.lanes[0]!;
    let load = Infinity;
    const now = performance.now();
    for (const l of this.lanes) {
      const ms = this.backlog(l, now).totalMs + (l.running ? 1e-3 : 0);
      if (ms < load) {
        best = l;
        load = ms;
      }
    }
    return best;
  }

  /**
   * Admission by estimated work, before any model work and before the
   * credit hold (so a refusal holds and charges nothing). `passes` are the
   * request's planned passes, worst case (every item escalated, every prior
   * uncached). Throws 529 (would not finish by its deadline, or the queue is
   * full) or 422 (needs more than the longest deadline even alone); raises
   * the caller's deadline when the request's own work needs longer than the
   * default. The returned work must be released when the request ends; the
   * passes the request runs with `req.signal` count against it meanwhile.
   */
  admit(passes: readonly PlannedPass[], req: WorkRequest): AdmittedWork {
    if (this.closed) throw new AssayError("UNAVAILABLE", "the inference pool is closed; the service is shutting down", 1);
    if (req.signal?.aborted) throw abortError(req.signal);
    const ownMs = this.estimate(passes);
    const tokens = passes.reduce((s, p) => s + p.shape.tokens, 0);
    const lane = this.pick();
    const now = performance.now();
    const b = this.backlog(lane, now);
    const fairWaitMs = fairFinishMs(req.org, ownMs, b.aheadMs, b.byOrg, this.rates(lane, now)) - ownMs;
    const besideMs = this.besideWaitMs(lane, passes, req.org, ownMs, now);
    const waitMs = besideMs === null ? fairWaitMs : Math.min(fairWaitMs, besideMs);
    const d = req.deadline;
    const elapsedMs = d ? now - d.arrivedAt : 0;
    const numbers = { ownMs, waitMs, elapsedMs, defaultMs: d?.defaultMs ?? 0, maxMs: d?.maxMs ?? 0 };
    let j: Judgement | null = d ? judge(numbers, this.safety()) : null;
    // The request-count bound (ASSAY_QUEUE_MAX) still holds: requests admitted on the lane and not running now.
    const busy = lane.running !== null || lane.queue.length > 0;
    const waiting = lane.works.size - runningWorks(lane.running) - runningWorks(lane.express?.running ?? null) + [...lane.queue].filter((x) => !x.work).length;
    if (busy && waiting >= this.perLaneQueue) {
      j = { deadlineMs: j?.deadlineMs ?? 0, refused: "queue_full", retryAfterS: Math.max(1, Math.ceil(b.aheadMs / 1000)) };
    }
    if (j?.refused) {
      metrics.admissionRefused.inc({ reason: j.refused });
      throw refusal(j.refused, j, { ...numbers, waiting });
    }
    if (d && j) d.admitted({ deadlineMs: j.deadlineMs, ownMs, waitMs });
    const work = new Work(req.org, lane, ownMs, tokens, waitMs, j?.deadlineMs ?? null, this, d, besideMs !== null && besideMs <= fairWaitMs);
    lane.works.add(work);
    const signal = req.signal;
    if (signal) {
      this.bySignal.set(signal, work);
      const onAbort = () => work.release();
      signal.addEventListener("abort", onAbort, { once: true });
      work.whenReleased(() => signal.removeEventListener("abort", onAbort));
    }
    return work;
  }

  /**
   * What a request waits on the lane's express worker, when every pass it
   * plans would go there (dispatchExpress: short, its model ready there, and
   * the main worker held by another organization's pass at least twice as
   * long); null when the request would wait for the main worker. The wait is
   * the express worker's running pass and the short passes that would go
   * beside before this request's: queued, and planned by requests admitted
   * to run beside. Without it a short request arriving behind a long pass was
   * judged on that pass's rest, and refused 529 on the default build (a 1.5B
   * pass of a large request runs longer than the default deadline allows with
   * the headroom) although the express worker would have answered it in a
   * second. A pass beside another takes up to twice its estimate (the two
   * share the cores): the extra counts as waiting.
   */
  private besideWaitMs(lane: Lane, passes: readonly PlannedPass[], org: string, ownMs: number, now: number): number | null {
    const x = lane.express;
    if (!x || !lane.running || lane.running.org === org || passes.length === 0) return null;
    const rest = Math.max(lane.running.cost - (now - lane.runningSince), 0.25 * lane.running.cost);
    for (const p of passes) {
      const ms = this.costModel(p.model).estimate(p.shape);
      if (!x.ready.has(p.model) || ms > this.expressLimit(p.model) || 2 * ms > rest) return null;
    }
    const busyOrg = lane.running.org;
    let ahead = x.running ? Math.max(0, x.running.cost - (now - x.runningSince)) : 0;
    for (const j of lane.queue) if (j.task.kind === "infer" && j.org !== busyOrg && j.cost <= this.expressLimit(j.task.model)) ahead += j.cost;
    for (const w of lane.works) if (w.beside && w.org !== busyOrg) ahead += w.remainingMs;
    return ahead + (BESIDE_SLOWDOWN - 1) * ownMs;
  }

  private enqueue(
    lane: Lane,
    task: Task,
    opts: { bounded: boolean; org?: string; cost?: number; tokens?: number; shape?: PassShape | null; work?: Work | null; front?: boolean },
    signal?: AbortSignal,
  ): Promise<TaskResult> {
    if (this.closed) return Promise.reject(new AssayError("UNAVAILABLE", "the inference pool is closed; the service is shutting down", 1));
    if (signal?.aborted) return Promise.reject(abortError(signal));
    const bounded = opts.bounded;
    // Work not admitted as a request (the CLI, eval, bench) keeps the plain queue bound.
    if (bounded && !opts.work && (lane.running || lane.queue.length > 0) && lane.queue.length >= this.perLaneQueue) {
      return Promise.reject(new AssayError("MODEL_BUSY", BUSY_DETAIL, 1));
    }
    this.seq++;
    return new Promise<TaskResult>((resolve, reject) => {
      const job: Job = {
        task,
        bounded,
        org: opts.org ?? "",
        cost: opts.cost ?? 0,
        tokens: opts.tokens ?? 0,
        shape: opts.shape ?? null,
        seq: this.seq,
        rank: opts.work ? opts.work.seq : this.seq + 1e12,
        front: opts.front === true,
        work: opts.work ?? null,
        members: null,
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
          // Still queued: dropped, never reaches the worker.
          if (lane.queue.remove(job)) metrics.queueDepth.dec();
          job.reject(abortError(signal));
        };
        signal.addEventListener("abort", onAbort, { once: true });
        job.cleanup = () => signal.removeEventListener("abort", onAbort);
      }
      if (!bounded) {
        if (job.front) lane.system.unshift(job);
        else lane.system.push(job);
      } else {
        lane.queue.push(job);
        metrics.queueDepth.inc();
      }
      this.dispatch(lane);
      if (this.queuedWaiters.length > 0) this.queueGrew();
    });
  }

  /** A load or unload once no inference task queued before it still waits; else the fair queue's next. */
  private next(lane: Lane): Job | undefined {
    const sys = lane.system[0];
    if (sys && (sys.front || ![...lane.queue].some((j) => j.seq < sys.seq))) return lane.system.shift();
    const job = lane.queue.shift();
    if (job) metrics.queueDepth.dec();
    return job;
  }

  private dispatch(lane: Lane, waited = false): void {
    if (this.closed) return;
    if (!lane.running && !this.waitForBatch(lane, waited)) {
      const job = this.next(lane);
      if (job) {
        const run = this.batchFrom(lane, job);
        lane.running = run;
        lane.runningSince = performance.now();
        this.start(lane, run, null);
      }
    }
    this.dispatchExpress(lane);
  }

  /**
   * ASSAY_BATCH_WAIT_MS > 0: an idle lane with one short pass waiting holds it
   * that long for others to join (throughput over latency). Off by default: a
   * lone pass starts at once, and batches form from what waits while the lane
   * runs.
   */
  private waitForBatch(lane: Lane, waited: boolean): boolean {
    if (lane.batchWait) return true;
    if (waited || this.batch.waitMs <= 0 || lane.system.length > 0 || lane.queue.length !== 1) return false;
    const only = [...lane.queue][0]!;
    if (!this.joins(only)) return false;
    lane.batchWait = setTimeout(() => {
      lane.batchWait = null;
      this.dispatch(lane, true);
    }, this.batch.waitMs);
    return true;
  }

  /** A pass that may run in a batch: an inference pass of a batching build, short enough (a quarter of the batch budget), without a test fault. */
  private joins(j: Job): boolean {
    return (
      j.task.kind === "infer" &&
      j.shape !== null &&
      j.task.testFault === undefined &&
      this.batch.maxPasses > 1 &&
      this.batchable.has(j.task.model) &&
      4 * j.tokens <= this.batch.maxTokens
    );
  }

  /** A batched run's score tensors within ASSAY_PASS_ATTENTION_MB per layer. */
  private fitsAttention(model: string, parts: readonly PassShape[]): boolean {
    return this.passAttentionBytes <= 0 || 4 * this.headsOf(model) * batchScores(parts) <= this.passAttentionBytes;
  }

  private headsOf(model: string): number {
    let h = this.heads.get(model);
    if (h === undefined) {
      h = attentionHeads(model);
      this.heads.set(model, h);
    }
    return h;
  }

  /**
   * The run the lane takes next: `head` alone, or `head` with the waiting
   * passes of other requests on the same build that fit beside it (the fair
   * queue's order decides which: shiftFirst takes the organizations in order
   * of virtual time and charges each its pass), within ASSAY_BATCH_MAX_TOKENS,
   * the pass limit and the attention bound. A pass of a long request runs
   * alone, as before.
   */
  private batchFrom(lane: Lane, head: Job): Job {
    if (!this.joins(head) || head.task.kind !== "infer") return head;
    const model = head.task.model;
    const budget = Math.min(this.batch.maxTokens, this.maxPackedTokens);
    const members = [head];
    const shapes = [head.shape!];
    let tokens = head.tokens;
    while (members.length < this.batch.maxPasses) {
      const fits = (j: Job) =>
        j.task.kind === "infer" && j.task.model === model && this.joins(j) && tokens + j.tokens <= budget && this.fitsAttention(model, [...shapes, j.shape!]);
      const next = lane.queue.shiftFirst(fits);
      if (!next) break;
      metrics.queueDepth.dec();
      members.push(next);
      shapes.push(next.shape!);
      tokens += next.tokens;
    }
    if (members.length === 1) return head;
    const parts = members.map((m) => m.task as InferTask);
    const shape = batchShape(shapes);
    const batch: Job = {
      task: { kind: "batch", model, parts },
      bounded: true,
      org: head.org,
      // The batch graph has a cost model of its own: its layout is not model.onnx's.
      cost: this.costModel(batchGraphOf(model)).estimate(shape),
      tokens: shape.tokens,
      shape,
      seq: head.seq,
      rank: head.rank,
      front: false,
      work: head.work,
      members,
      enqueuedAt: Math.min(...members.map((m) => m.enqueuedAt)),
      settled: false,
      // Each pass gets its own part; a failure is every pass's. A pass whose request hung up was settled already.
      resolve: (r) => {
        if (batch.settled) return;
        batch.settled = true;
        if (r.ok && "parts" in r) members.forEach((m, i) => m.resolve((r as BatchOk).parts[i]!));
        else for (const m of members) m.resolve(r);
      },
      reject: (e) => {
        if (batch.settled) return;
        batch.settled = true;
        for (const m of members) m.reject(e);
      },
      cleanup: () => {},
    };
    return batch;
  }

  /**
   * A short pass to the express worker, while the main worker still has a
   * long one to go (at least twice the short pass's estimate: otherwise
   * waiting for it costs the short pass about as much as sharing the cores),
   * and only another organization's: the one whose pass holds the main
   * worker does not get the cores twice over.
   */
  private dispatchExpress(lane: Lane): void {
    const x = lane.express;
    if (!x || x.running || !lane.running || this.closed) return;
    const now = performance.now();
    // A long pass that has overrun its estimate (slowed by the express worker beside it, say) still has
    // a way to go: its rest is taken as at least a quarter of its estimate, not as nothing.
    const rest = Math.max(lane.running.cost - (now - lane.runningSince), 0.25 * lane.running.cost);
    // Every organization with a pass in the running one holds the main worker: a batch holds several.
    const busy = new Set((lane.running.members ?? [lane.running]).map((m) => m.org));
    const fits = (j: Job) => j.task.kind === "infer" && !busy.has(j.org) && j.cost <= this.expressLimit(j.task.model) && 2 * j.cost <= rest;
    const job = lane.queue.shiftFirst((j) => fits(j) && x.ready.has(j.task.model));
    if (job) {
      metrics.queueDepth.dec();
      metrics.expressPasses.inc();
      x.running = job;
      x.runningSince = now;
      this.start(lane, job, x);
      return;
    }
    // A short pass would go beside, but its model is not in the express worker yet: load it for next time.
    const want = [...lane.queue].find((j) => fits(j) && this.loaded.has(j.task.model));
    if (want) void this.loadExpress(lane, want.task.model);
  }

  /** Loads `model` into the lane's express worker (one load at a time); resolves when it is ready there, or not. */
  private loadExpress(lane: Lane, model: string): Promise<void> {
    const x = lane.express;
    if (!x || x.loading !== null || x.ready.has(model) || !this.loaded.has(model) || this.closed) return Promise.resolve();
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
        this.dispatch(lane);
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
    await Promise.all(this.lanes.map((l) => this.loadExpress(l, model)));
  }

  /**
   * Loads the batch graph of a model already loaded, on every lane's main worker, now instead of on the
   * first batch. The server does it for the default build before it reports ready: loaded on the first
   * batch, the first burst after readiness waited for it (eight small requests sent at once: 20 s each on
   * the 1.5B, against 0.25 s for one alone). Nothing where the lanes do not batch (a GPU, batching off).
   */
  async preloadBatch(model: string): Promise<void> {
    if (!this.batchable.has(model) || this.batch.maxTokens <= 0 || this.batch.maxPasses <= 1) return;
    const out = await Promise.all(this.lanes.map((l) => this.enqueue(l, { kind: "load", model, batch: true }, { bounded: false, cost: this.estimateLoadMs(model) })));
    for (const r of out) if (!r.ok) throw new AssayError(r.code, r.message);
  }

  /** Runs a job on the lane's main worker (`x` null) or its express worker. */
  private start(lane: Lane, job: Job, x: Express | null): void {
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
            const c = this.costModel(file);
            c.observe(job.shape, res.runMs);
            this.publish(file, c);
            this.onPassTimed?.(file, job.shape, res.runMs);
          }
          if (!x && res.ok && job.task.kind === "load" && !job.task.batch && "loaded" in res && res.loaded) {
            this.loadMs.set(job.task.model, res.loadMs);
            metrics.buildLoadSeconds.set({ build: buildLabel(job.task.model) }, res.loadMs / 1000);
          }
          job.resolve(res);
        },
        (e: unknown) => {
          if (this.closed) {
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
            this.enqueue(lane, { kind: "load", model }, { bounded: false, front: true, cost: this.estimateLoadMs(model) }).then(
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
          for (const m of members) this.recordUsage(lane, m.org, ((now - since) * Math.max(m.cost, 1e-6)) / total, now);
        }
        if (x) x.running = null;
        else lane.running = null;
        this.dispatch(lane);
      });
  }

  /** A load's expected time: the last timed main-worker load, else the size prior. The lifecycle asks it too (ModelLoader). */
  estimateLoadMs(model: string): number {
    const timed = this.loadMs.get(model);
    if (timed !== undefined) return timed;
    return LOAD_SETUP_MS + fileSize(model) / LOAD_BYTES_PER_MS;
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
    if (this.nextFault) {
      task.testFault = this.nextFault;
      this.nextFault = null;
    }
    if (this.nextEntered.infer) {
      task.testEntered = this.nextEntered.infer;
      this.nextEntered.infer = null;
    }
    const shape = shapeOf(p, kv?.past?.tokens ?? 0);
    const cost = this.costModel(model).estimate(shape);
    // A pass of an admitted request runs on its lane, in its organization's queue, out of its planned work.
    const work = signal ? (this.bySignal.get(signal) ?? null) : null;
    if (work && !work.released) work.consume(cost, shape.tokens);
    const lane = work ? work.lane : this.pick();
    // Copies are sent so the caller's PackedRequest stays readable.
    const r = await this.enqueue(lane, task, { bounded: true, org: work?.org ?? "", cost, tokens: shape.tokens, shape, work }, signal);
    if (!r.ok) throw new AssayError(r.code, `the model failed: ${r.message}`);
    return r as InferOk;
  }

  /** Load (or unload) a model on every lane. Never refused for a full queue; runs once the inference tasks queued before it have started. */
  async setLoaded(model: string, loaded: boolean): Promise<LoadOk[]> {
    const cost = loaded ? this.estimateLoadMs(model) : 0;
    const entered = loaded ? this.nextEntered.load : null;
    if (entered) this.nextEntered.load = null;
    const task: Task = { kind: loaded ? "load" : "unload", model, ...(entered ? { testEntered: entered } : {}) };
    const out = await Promise.all(this.lanes.map((l) => this.enqueue(l, task, { bounded: false, cost })));
    for (const r of out) if (!r.ok) throw new AssayError(r.code, r.message);
    if (loaded) {
      this.loaded.add(model);
      if (out.every((r) => r.ok && "batches" in r && r.batches)) this.batchable.add(model);
    } else {
      this.loaded.delete(model);
      this.batchable.delete(model);
      for (const x of this.lanes.map((l) => l.express)) {
        if (!x?.ready.delete(model)) continue;
        this.held(x.pool.run({ kind: "unload", model } satisfies Task)).catch((e: unknown) => console.error(`[assay] express unload of ${model} failed: ${String(e)}`));
      }
    }
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
    const release = () => {
      Atomics.store(flag, 0, 1);
      Atomics.notify(flag, 0);
      this.stalls.delete(release);
    };
    this.stalls.add(release);
    return release;
  }

  /**
   * TEST ONLY (ASSAY_TEST_FAULTS=1, refused otherwise): resolves once the worker has reached
   * onnxruntime's native call in the next task of `kind` (a load on every lane: InferenceSession.create;
   * a pass: its run), so that a test can act while native code holds the worker thread.
   */
  untilWorkerEntersForTest(kind: "load" | "infer"): Promise<void> {
    if (!this.testFaults) throw new Error("fault injection is off: start with ASSAY_TEST_FAULTS=1 (tests only)");
    const counter = new Int32Array(new SharedArrayBuffer(4));
    this.nextEntered[kind] = counter;
    return untilCount(counter, kind === "load" ? this.lanes.length : 1);
  }

  /**
   * TEST ONLY: resolves once `n` inference tasks wait in the lanes' queues at the same time, so that a
   * test holding a lane with a stalled pass knows the passes it sent have queued behind it.
   */
  untilQueuedForTest(n: number): Promise<void> {
    if (this.queued >= n) return Promise.resolve();
    return new Promise((resolve) => this.queuedWaiters.push({ n, resolve }));
  }

  private queueGrew(): void {
    const queued = this.queued;
    const ready = this.queuedWaiters.filter((w) => queued >= w.n);
    this.queuedWaiters = this.queuedWaiters.filter((w) => queued < w.n);
    for (const w of ready) w.resolve();
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
    for (const l of this.lanes) {
      if (l.running) rest = Math.max(rest, l.running.cost - (now - l.runningSince));
      if (l.express?.running) rest = Math.max(rest, l.express.running.cost - (now - l.express.runningSince));
    }
    return Math.max(TASK_DRAIN_MS, 2 * rest);
  }

  async close(): Promise<void> {
    const wait = this.closeWaitMs();
    this.closed = true;
    metrics.queueSources.delete(this.queueSource);
    for (const l of this.lanes) {
      if (l.batchWait) clearTimeout(l.batchWait);
      l.batchWait = null;
      const waiting = [...l.queue, ...l.system.splice(0)];
      for (const j of waiting) {
        if (l.queue.remove(j)) metrics.queueDepth.dec();
        j.reject(new AssayError("UNAVAILABLE", "the inference pool is closed; the service is shutting down", 1));
      }
      for (const w of [...l.works]) w.release();
    }
    for (const release of [...this.stalls]) release();
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
    await Promise.all(this.lanes.flatMap((l) => [l.pool.destroy(), ...(l.express ? [l.express.pool.destroy()] : [])]));
  }
}
