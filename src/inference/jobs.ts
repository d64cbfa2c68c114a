import type { Piscina } from "piscina";
import { AssayError } from "../errors/catalogue.js";
import type { PassShape } from "./cost.js";
import type { FairQueue } from "./fair-queue.js";
import type { LaneOptions, Task, TaskResult } from "./protocol.js";
import { judge, type PlannedPass, type RequestDeadline } from "./work.js";

/**
 * The records the pool's parts share (pool.ts composes them): a job (a task
 * queued or in a worker's hands), a lane and its express worker as the queue,
 * admission, batch forming and the lanes see them, and an admitted request's
 * work, with the little arithmetic on them that more than one part reads
 * (a running pass's rest, the requests a run serves).
 */

export interface Job {
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

/** What a task is queued with (Queues.enqueue): the job's fields that are not the task. */
export interface EnqueueOptions {
  bounded: boolean;
  org?: string;
  cost?: number;
  tokens?: number;
  shape?: PassShape | null;
  work?: Work | null;
  front?: boolean;
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
export interface Express {
  pool: Piscina;
  running: Job | null;
  runningSince: number;
  /** Models loaded in the express worker. */
  ready: Set<string>;
  /** The model being loaded into it, if any (one at a time). */
  loading: string | null;
}

export interface Lane {
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

/** What an admitted request asks of admission when it replans: the estimate of passes, and the headroom now. */
export interface Estimates {
  estimate(passes: readonly PlannedPass[]): number;
  safety(): number;
}

export class Work implements AdmittedWork {
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
    private readonly pool: Estimates,
    private readonly deadline: RequestDeadline | undefined,
    /** Admitted on the express worker's wait (Admission.besideWaitMs): its planned passes are short ones that go beside. */
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

/** An abort reason as the error the caller should get: ours when it is an AssayError, else 504. */
export function abortError(signal: AbortSignal): AssayError {
  const r: unknown = signal.reason;
  if (r instanceof AssayError) return r;
  return new AssayError("TIMEOUT", "the request was cancelled before inference finished");
}

/** What work refused or cut short by close() gets: 503. */
export function closedError(): AssayError {
  return new AssayError("UNAVAILABLE", "the inference pool is closed; the service is shutting down", 1);
}

/** Requests (admitted work) a running task serves: a batch's distinct ones. */
export function runningWorks(job: Job | null): number {
  if (!job) return 0;
  return new Set((job.members ?? [job]).flatMap((m) => (m.work ? [m.work] : []))).size;
}

/**
 * What a long pass on the main worker still has to run: its estimate less
 * the time it has run. A long pass that has overrun its estimate (slowed by
 * the express worker beside it, say) still has a way to go: its rest is
 * taken as at least a quarter of its estimate, not as nothing.
 */
export function runningRest(running: Job, since: number, now: number): number {
  return Math.max(running.cost - (now - since), 0.25 * running.cost);
}
