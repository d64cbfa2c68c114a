import { AssayError } from "../errors/catalogue.js";
import type { PassShape } from "./cost.js";

/**
 * Admission by estimated work: the policy, kept pure so that it can be tested
 * without a model. The pool (src/inference/pool.ts) supplies the numbers.
 *
 * A request arrives with its passes planned (packed shapes, per build). The
 * pool estimates its own work (`ownMs`, from each build's cost model) and the
 * work that will run before it finishes (`waitMs`: the running pass's rest,
 * queued loads, and under fair queueing its own organization's backlog plus
 * each other organization's work, queued and still to come at its recent
 * rate, up to as much again). Then:
 *
 *   deadline = min(cap, max(default, ownMs × DEADLINE_MARGIN))
 *   ownMs × SAFETY                             > deadline  → 422 (too large for this server: only possible
 *                                                          at the cap, and no wait makes it fit)
 *   elapsed + (waitMs + ownMs) × SAFETY        > deadline  → 529, Retry-After = seconds until it would fit
 *   otherwise admitted: the caller's deadline is raised to
 *     min(cap, max(deadline, elapsed + (waitMs + ownMs) × FINISH_GRACE))
 *
 * `SAFETY` keeps the queue short of the deadline by a quarter: a queue longer
 * than what keeps the lane busy adds no throughput, only risk (a mis-estimate
 * becomes a 504 after the machine spent the time). The pool raises it, up to
 * SAFETY_MAX, while recent passes overrun their estimates by more than the
 * quarter covers (`admissionSafety`).
 */

/**
 * A request whose own work needs longer than the default deadline gets its
 * estimate times this: room to wait behind 2.2 times its own work and still
 * finish with the SAFETY headroom, so two large code search requests of one
 * caller, sent together, are both answered though they differ in size. Three
 * (room for as much work as its own) refused one pair in eight on the dev
 * data: a 64 s request behind a 92 s one (docs/experiments/code-search-history.md).
 */
export const DEADLINE_MARGIN = 4;
/** The admission check's headroom on the estimated finish. */
export const SAFETY = 1.25;
/**
 * An admitted request runs until the later of its deadline and this multiple
 * of its estimated finish. Admission plans every request to finish within
 * its deadline with the SAFETY headroom; one that then runs long is a
 * mis-estimate (passes slowed by the express worker beside them, a noisy
 * neighbour), and cutting it at the deadline throws away the work it already
 * cost, after the machine spent it. The grace exceeds SAFETY_MAX, so the
 * headroom, not the grace, decides what is admitted.
 */
export const FINISH_GRACE = 2;
/** The most the headroom is raised to on a machine whose passes overrun their estimates. */
export const SAFETY_MAX = 1.75;
/** Margin over the recent overrun: the headroom covers the overrun and a tenth more. */
const OVERRUN_MARGIN = 1.1;

/**
 * The headroom to admit with, given how far recent passes overran their
 * estimates (CostModel.overrun, the worst build's): SAFETY on a machine whose
 * estimates hold, more where they do not (a 504 after the work ran wastes
 * the machine; a 529 at arrival wastes nothing), never past SAFETY_MAX.
 */
export function admissionSafety(overrun: number): number {
  if (!Number.isFinite(overrun)) return SAFETY;
  return Math.min(SAFETY_MAX, Math.max(SAFETY, overrun * OVERRUN_MARGIN));
}

/** The caller's deadline, as the HTTP route tracks it. Absent (CLI, batch): nothing is refused for time. */
export interface RequestDeadline {
  /** `performance.now()` at arrival: the deadline counts from there. */
  arrivedAt: number;
  /** ASSAY_REQUEST_TIMEOUT_MS. */
  defaultMs: number;
  /** ASSAY_REQUEST_TIMEOUT_MAX_MS: no deadline is raised past it. */
  maxMs: number;
  /**
   * Called when the request is admitted, before any model work: the deadline
   * it was given (ms from arrival: the default, or more for a request whose
   * own work needs it) and the estimates it was admitted on; and again, with
   * a later deadline, if its planned work grows while it runs (more items to
   * escalate than planned). Never with an earlier one.
   */
  admitted(a: { deadlineMs: number; ownMs: number; waitMs: number }): void;
}

/** What the pool needs to know of the request it admits. */
export interface WorkRequest {
  /** The organization it is charged to (fair queueing); "" for none. */
  org: string;
  /** The request's signal: the passes it runs with it are this work's (see InferencePool.admit). */
  signal?: AbortSignal | undefined;
  deadline?: RequestDeadline | undefined;
}

/** One pass a request will run, planned before it is admitted. */
export interface PlannedPass {
  /** The build's model file (the pool's key for its cost model). */
  model: string;
  shape: PassShape;
  /** A chunk of a long state's keys and values: not run when the prefix cache holds the state for the organization. */
  prefill?: true;
}

/**
 * Escalating families (code search and fact check base names) plan the large
 * build's passes for this share of the items, the longest ones, when they are
 * admitted: on the dev data 20–31% of items are unsure (docs/experiments/code-search-history.md).
 * The credit hold still covers every item. When the small build has scored
 * and the unsure items are known, the request replans with exactly those
 * (`AdmittedWork.replan`), which raises its deadline if it needs more, up to
 * the cap; it is never refused after it ran.
 */
export const ESCALATION_PLAN_SHARE = 0.5;

/** The items planned for escalation at admission: the ESCALATION_PLAN_SHARE longest of `which`. */
export function likelyEscalated(which: readonly number[], cost: (i: number) => number, share = ESCALATION_PLAN_SHARE): number[] {
  const n = Math.ceil(which.length * share);
  return [...which].sort((a, b) => cost(b) - cost(a)).slice(0, n);
}

export type RefusalReason = "deadline" | "too_large" | "queue_full";

export interface Judgement {
  /** The request's deadline, ms from arrival. */
  deadlineMs: number;
  refused: RefusalReason | null;
  /** For a 529: seconds until it would fit (at least 1). */
  retryAfterS: number;
}

export function judge(i: { ownMs: number; waitMs: number; elapsedMs: number; defaultMs: number; maxMs: number }, safety = SAFETY): Judgement {
  const cap = Math.max(i.defaultMs, i.maxMs);
  const deadlineMs = Math.min(cap, Math.max(i.defaultMs, i.ownMs * DEADLINE_MARGIN));
  // Not even an idle machine would finish it in time: waiting cannot help. Judged at the base headroom: a
  // slow spell makes a request wait (529), not "too large" for this server.
  if (i.ownMs * SAFETY > deadlineMs) return { deadlineMs, refused: "too_large", retryAfterS: 0 };
  if (i.elapsedMs + (i.waitMs + i.ownMs) * safety <= deadlineMs) {
    return { deadlineMs: Math.min(cap, Math.max(deadlineMs, i.elapsedMs + (i.waitMs + i.ownMs) * FINISH_GRACE)), refused: null, retryAfterS: 0 };
  }
  // A retry arrives fresh (elapsed ≈ 0): it fits once the work ahead is down to deadline / safety − own.
  const excessMs = i.waitMs - Math.max(0, deadlineMs / safety - i.ownMs);
  return { deadlineMs, refused: "deadline", retryAfterS: Math.max(1, Math.ceil(excessMs / 1000)) };
}

/**
 * Estimated ms from now until a request of `ownMs` from `org` finishes, when
 * every organization's backlog (`backlogs`, ms) is served fairly by work and
 * `aheadMs` (the running pass, queued loads) runs first: its organization's
 * backlog and its own work, and as much of each other organization's work as
 * that, at most all of it. Another organization's work is its backlog plus
 * what it keeps sending meanwhile: `rates` is the share of the lane each
 * organization used lately (0–1), so a flood's requests are not admitted as
 * if a steady trickle of small ones from elsewhere would not cut in ahead of
 * them (fair queueing lets it); the trickle's own requests, in turn, never
 * wait for more of the flood than their own work.
 */
export function fairFinishMs(
  org: string,
  ownMs: number,
  aheadMs: number,
  backlogs: ReadonlyMap<string, number>,
  rates: ReadonlyMap<string, number> = new Map(),
): number {
  const mine = (backlogs.get(org) ?? 0) + ownMs;
  const others = new Set([...backlogs.keys(), ...rates.keys()]);
  others.delete(org);
  // T = ahead + mine + Σ min(backlog + rate · T, mine): a fixed point, reached from below in a few steps.
  let t = aheadMs + mine;
  for (let k = 0; k < 20; k++) {
    let next = aheadMs + mine;
    for (const o of others) next += Math.min((backlogs.get(o) ?? 0) + Math.min(0.95, rates.get(o) ?? 0) * t, mine);
    if (Math.abs(next - t) < 1) return next;
    t = next;
  }
  return t;
}

const seconds = (ms: number) => (ms >= 10_000 ? `${Math.round(ms / 1000)} s` : `${(ms / 1000).toFixed(1)} s`);

/** The 422 or 529 a refused request gets; its detail names the estimated work, the wait and the deadline. */
export function refusal(reason: RefusalReason, j: Judgement, n: { ownMs: number; waitMs: number; elapsedMs: number; defaultMs: number; maxMs: number; waiting?: number }): AssayError {
  if (reason === "too_large") {
    return new AssayError(
      "INVALID_REQUEST",
      `request too large for this server: its model work is estimated at ${seconds(n.ownMs)} on an idle machine, ` +
        `above the longest deadline of ${seconds(Math.max(n.defaultMs, n.maxMs))} (ASSAY_REQUEST_TIMEOUT_MAX_MS); ` +
        `send a shorter state or fewer questions (or items), or split the request`,
    );
  }
  if (reason === "queue_full") {
    return new AssayError(
      "MODEL_BUSY",
      `the model is busy: the inference queue is full (${n.waiting ?? 0} request${n.waiting === 1 ? "" : "s"} waiting, ASSAY_QUEUE_MAX); ` +
        `retry after about ${j.retryAfterS} second${j.retryAfterS === 1 ? "" : "s"}`,
      j.retryAfterS,
    );
  }
  const raised = j.deadlineMs > n.defaultMs ? `, raised for its size from ${seconds(n.defaultMs)}` : "";
  return new AssayError(
    "MODEL_BUSY",
    `the model is busy: about ${seconds(n.waitMs)} of queued work would run before this request finished, and the ` +
      `request itself needs about ${seconds(n.ownMs)}; it would not finish within its deadline of ${seconds(j.deadlineMs)}` +
      `${raised} (ASSAY_REQUEST_TIMEOUT_MS), so it was refused before any work and nothing was charged; ` +
      `retry after about ${j.retryAfterS} second${j.retryAfterS === 1 ? "" : "s"}`,
    j.retryAfterS,
  );
}

/** The fields of a pipeline context that admission reads. */
export function workRequest(ctx: { orgId: string; signal?: AbortSignal | undefined; deadline?: RequestDeadline | undefined }): WorkRequest {
  return { org: ctx.orgId, signal: ctx.signal, deadline: ctx.deadline };
}
