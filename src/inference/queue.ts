import { AssayError } from "../errors/catalogue.js";
import { metrics } from "../observability/metrics.js";
import { abortError, closedError, type EnqueueOptions, type Job, type Lane } from "./jobs.js";
import type { Task, TaskResult } from "./protocol.js";

/**
 * Each lane's waiting tasks and what runs next: inference passes in the
 * lane's fair queue (per organization, fair-queue.ts), loads and unloads in
 * its system list, which run once the passes queued before them have
 * started (a reload after a crash: first). The queue bound for work not
 * admitted as a request (ASSAY_QUEUE_MAX per lane) is held here; a cancelled
 * pass still queued is dropped here.
 */

const BUSY_DETAIL = "the model is busy: the inference queue is full; retry after about one second";

/** What the queue asks of the pool that composes it. */
export interface QueueHost {
  closed(): boolean;
  /** A task was queued on `lane`: start what can start. */
  dispatch(lane: Lane): void;
  /** A task was queued (after dispatch). */
  queued(): void;
}

export class Queues {
  private seq = 0;

  constructor(
    private readonly lanes: readonly Lane[],
    /** ASSAY_QUEUE_MAX over the lanes. */
    private readonly perLaneQueue: number,
    private readonly host: QueueHost,
  ) {}

  /** Inference tasks waiting for a worker, over all lanes. */
  get queued(): number {
    return this.lanes.reduce((s, l) => s + l.queue.length, 0);
  }

  enqueue(lane: Lane, task: Task, opts: EnqueueOptions, signal?: AbortSignal): Promise<TaskResult> {
    if (this.host.closed()) return Promise.reject(closedError());
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
      this.host.dispatch(lane);
      this.host.queued();
    });
  }

  /** A load or unload once no inference task queued before it still waits; else the fair queue's next. */
  next(lane: Lane): Job | undefined {
    const sys = lane.system[0];
    if (sys && (sys.front || ![...lane.queue].some((j) => j.seq < sys.seq))) return lane.system.shift();
    const job = lane.queue.shift();
    if (job) metrics.queueDepth.dec();
    return job;
  }

  /** close(): every task still waiting on `lane` fails with 503. */
  rejectWaiting(lane: Lane): void {
    const waiting = [...lane.queue, ...lane.system.splice(0)];
    for (const j of waiting) {
      if (lane.queue.remove(j)) metrics.queueDepth.dec();
      j.reject(closedError());
    }
  }
}
