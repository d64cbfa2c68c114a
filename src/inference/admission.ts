import path from "node:path";
import fs from "node:fs";
import type { Config, ExecutionProvider } from "../config/index.js";
import { metrics } from "../observability/metrics.js";
import { CostModel, GPU_SPEED_PRIOR_MS, priorCoefficients, type BuildFacts, type PassShape } from "./cost.js";
import { abortError, closedError, runningRest, runningWorks, Work, type AdmittedWork, type Lane } from "./jobs.js";
import { admissionSafety, fairFinishMs, judge, refusal, type Judgement, type PlannedPass, type WorkRequest } from "./work.js";

/**
 * Admission's numbers (the policy is work.ts): each build's live cost model
 * and the estimates read from it (a pass, a load, the express limit), each
 * lane's backlog and each organization's recent share of it, the safety
 * factor, and `admit` itself, which pins an admitted request to a lane.
 */

/** A pass on the express worker beside a long one takes up to this many times its estimate (0.41 s alone, about 0.8 s beside: the Express note). */
const BESIDE_SLOWDOWN = 2;

/** Time constant of an organization's recent share of a lane. */
const USAGE_TAU_MS = 30_000;

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

/** ASSAY_EXPRESS_MAX_MS where the lanes have express workers (CPU), else 0: none. */
export function expressMaxMs(config: Config): number {
  return config.provider === "cpu" ? config.expressMaxMs : 0;
}

export class Admission {
  /** Per model file: the live cost estimate of its passes (shared by the lanes, which run the same provider). */
  private readonly costs = new Map<string, CostModel>();
  /** Per model file: ms its last load on a main worker took (the estimate of its reload). */
  private readonly loadMs = new Map<string, number>();
  /** The admitted request each request signal belongs to: every pass run with that signal is its work. */
  private readonly bySignal = new WeakMap<AbortSignal, Work>();
  private readonly provider: ExecutionProvider;
  private readonly threads: number;
  private readonly expressMaxMs: number;
  private readonly expressMaxTokens: number;

  constructor(
    config: Config,
    private readonly lanes: readonly Lane[],
    /** ASSAY_QUEUE_MAX over the lanes. */
    private readonly perLaneQueue: number,
    private readonly closed: () => boolean,
  ) {
    this.provider = config.provider;
    this.threads = config.intraOpThreads;
    this.expressMaxMs = expressMaxMs(config);
    this.expressMaxTokens = config.expressMaxTokens;
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

  /** A pass of `file` that ran alone on its cores took `runMs`: its build's estimate learns from it. */
  passTimed(file: string, shape: PassShape, runMs: number): void {
    const c = this.costModel(file);
    c.observe(shape, runMs);
    this.publish(file, c);
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
  expressLimit(model: string): number {
    if (this.expressMaxMs === 0) return 0;
    const n = this.expressMaxTokens;
    return n > 0 ? Math.max(this.expressMaxMs, this.costModel(model).estimate({ tokens: n, prefix: n, branches: 0, width: 0 })) : this.expressMaxMs;
  }

  /** Estimated ms of passes, each by its build's cost model. */
  estimate(passes: readonly PlannedPass[]): number {
    return passes.reduce((s, p) => s + this.costModel(p.model).estimate(p.shape), 0);
  }

  /** A load's expected time: the last timed main-worker load, else the size prior. The lifecycle asks it too (ModelLoader). */
  estimateLoadMs(model: string): number {
    const timed = this.loadMs.get(model);
    if (timed !== undefined) return timed;
    return LOAD_SETUP_MS + fileSize(model) / LOAD_BYTES_PER_MS;
  }

  /** A load of `model` on a main worker took `ms`: the estimate of its next load. */
  loadTimed(model: string, ms: number): void {
    this.loadMs.set(model, ms);
    metrics.buildLoadSeconds.set({ build: buildLabel(model) }, ms / 1000);
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

  recordUsage(lane: Lane, org: string, ms: number, now: number): void {
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
  pick(): Lane {
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
    if (this.closed()) throw closedError();
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

  /** The admitted request a pass run with `signal` belongs to, if any. */
  workOf(signal: AbortSignal | undefined): Work | null {
    return signal ? (this.bySignal.get(signal) ?? null) : null;
  }

  /** close(): the requests admitted on `lane` are no longer work ahead of anyone. */
  releaseAll(lane: Lane): void {
    for (const w of [...lane.works]) w.release();
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
    const rest = runningRest(lane.running, lane.runningSince, now);
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
}
