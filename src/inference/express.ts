import { metrics } from "../observability/metrics.js";
import { runningRest, type Express, type Job, type Lane } from "./jobs.js";

/**
 * The express path: which short waiting pass a lane's express worker takes
 * beside the main worker's long one (the Express note in jobs.ts), and when
 * a build is worth loading there. The worker itself, its runs and its loads
 * are the lanes' (lanes.ts), reached through ExpressHost.
 */

/** What the express path asks of the pool that composes it. */
export interface ExpressHost {
  closed(): boolean;
  /** The longest estimate that counts as a short pass of `model` (Admission.expressLimit). */
  expressLimit(model: string): number;
  /** Whether `model` is loaded on the main workers. */
  isLoaded(model: string): boolean;
  /** Runs `job` on the lane's express worker `x`. */
  start(lane: Lane, job: Job, x: Express): void;
  /** Loads `model` into the lane's express worker for next time. */
  loadExpress(lane: Lane, model: string): Promise<void>;
}

export class ExpressPath {
  constructor(private readonly host: ExpressHost) {}

  /**
   * A short pass to the express worker, while the main worker still has a
   * long one to go (at least twice the short pass's estimate: otherwise
   * waiting for it costs the short pass about as much as sharing the cores),
   * and only another organization's: the one whose pass holds the main
   * worker does not get the cores twice over.
   */
  dispatch(lane: Lane): void {
    const x = lane.express;
    if (!x || x.running || !lane.running || this.host.closed()) return;
    const now = performance.now();
    const rest = runningRest(lane.running, lane.runningSince, now);
    // Every organization with a pass in the running one holds the main worker: a batch holds several.
    const busy = new Set((lane.running.members ?? [lane.running]).map((m) => m.org));
    const fits = (j: Job) => j.task.kind === "infer" && !busy.has(j.org) && j.cost <= this.host.expressLimit(j.task.model) && 2 * j.cost <= rest;
    const job = lane.queue.shiftFirst((j) => fits(j) && x.ready.has(j.task.model));
    if (job) {
      metrics.queueDepth.dec();
      metrics.expressPasses.inc();
      x.running = job;
      x.runningSince = now;
      this.host.start(lane, job, x);
      return;
    }
    // A short pass would go beside, but its model is not in the express worker yet: load it for next time.
    const want = [...lane.queue].find((j) => fits(j) && this.host.isLoaded(j.task.model));
    if (want) void this.host.loadExpress(lane, want.task.model);
  }
}
