/**
 * The process's serving state and its scoring requests in flight.
 *
 *   starting ──(pipeline ready)──► serving ──(SIGTERM / app.close)──► draining
 *
 * Each scoring request gets one AbortController here (`track`). It is aborted,
 * with the AssayError the caller should see, by the first of: the request's
 * deadline (504), the client hanging up (504), or the drain deadline (503).
 * A request counts as in flight until its credit hold and slot are released,
 * which may be after its response was sent: `drain` waits for exactly that,
 * so stores are never closed under a hold that is still being released.
 */
import { AssayError } from "../errors/catalogue.js";
import { metrics } from "../observability/metrics.js";

export interface TrackedRequest {
  readonly signal: AbortSignal;
  abort(reason: AssayError): void;
  /**
   * Move the deadline to `deadlineMs` from now (`nominalMs` from arrival, as
   * the 504 names it): a request whose own work needs longer than the default
   * deadline gets a later one at admission, before any model work.
   */
  extend(deadlineMs: number, nominalMs: number): void;
  /** The request's hold and slot are released: it no longer counts as in flight. */
  done(): void;
}

export class Lifecycle {
  private draining_ = false;
  private readonly inFlight = new Set<AbortController>();
  private idleWaiters: (() => void)[] = [];

  get draining(): boolean {
    return this.draining_;
  }

  get inFlightCount(): number {
    return this.inFlight.size;
  }

  /** New scoring requests get 503 from now on, and /readyz says not ready. */
  startDraining(): void {
    this.draining_ = true;
  }

  /** Register a request; its deadline (`nominalMs` from arrival, `deadlineMs` from now) aborts it with 504. */
  track(deadlineMs: number, nominalMs = deadlineMs): TrackedRequest {
    const ctl = new AbortController();
    this.inFlight.add(ctl);
    metrics.inFlight.inc();
    const arm = (ms: number, nominal: number, raised: boolean) => {
      const t = setTimeout(() => {
        ctl.abort(
          new AssayError(
            "TIMEOUT",
            `the request exceeded its deadline of ${formatMs(nominal)} (ASSAY_REQUEST_TIMEOUT_MS${raised ? ", raised for its estimated work" : ""}); ` +
              `its queued work was cancelled and nothing was charged`,
          ),
        );
      }, Math.max(0, ms));
      t.unref();
      return t;
    };
    let timer = arm(deadlineMs, nominalMs, false);
    let finished = false;
    return {
      signal: ctl.signal,
      abort: (reason) => {
        if (!ctl.signal.aborted) ctl.abort(reason);
      },
      extend: (ms, nominal) => {
        if (finished || ctl.signal.aborted) return;
        clearTimeout(timer);
        timer = arm(ms, nominal, true);
      },
      done: () => {
        if (finished) return;
        finished = true;
        clearTimeout(timer);
        this.inFlight.delete(ctl);
        metrics.inFlight.dec();
        if (this.inFlight.size === 0) {
          const w = this.idleWaiters;
          this.idleWaiters = [];
          for (const r of w) r();
        }
      },
    };
  }

  private idle(ms: number): Promise<boolean> {
    if (this.inFlight.size === 0) return Promise.resolve(true);
    return new Promise((resolve) => {
      const t = setTimeout(() => {
        this.idleWaiters = this.idleWaiters.filter((w) => w !== done);
        resolve(false);
      }, ms);
      const done = () => {
        clearTimeout(t);
        resolve(true);
      };
      this.idleWaiters.push(done);
    });
  }

  /**
   * Let in-flight requests finish for up to `deadlineMs`; then cancel the rest
   * (503, hold released, no charge) and wait up to `graceMs` for their
   * releases. Returns how many finished on their own and how many were cancelled.
   */
  async drain(deadlineMs: number, graceMs = 5_000): Promise<{ cancelled: number; stuck: number }> {
    this.startDraining();
    if (await this.idle(deadlineMs)) return { cancelled: 0, stuck: 0 };
    const cancelled = this.inFlight.size;
    const reason = new AssayError(
      "UNAVAILABLE",
      "the server shut down before the request finished (drain deadline, ASSAY_DRAIN_SECONDS); nothing was charged; retry",
      1,
    );
    for (const c of this.inFlight) if (!c.signal.aborted) c.abort(reason);
    await this.idle(graceMs);
    return { cancelled, stuck: this.inFlight.size };
  }
}

function formatMs(ms: number): string {
  return ms % 1000 === 0 ? `${ms / 1000} s` : `${ms} ms`;
}
