/**
 * Per-organization concurrency: how many requests an organization has in
 * flight. A slot is taken before any model work and given back in `finally`.
 * Two implementations: in-process (one server, the default) and Redis
 * (replicas; see redis-limiter.ts), chosen by ASSAY_REDIS_URL.
 */

export interface Slot {
  readonly id: string;
  /** Give the slot back. Idempotent; never throws. */
  release(): Promise<void>;
}

export interface ConcurrencyLimiter {
  /** A slot, or null when the organization already has `limit` requests in flight. Throws when the limiter is unreachable. */
  acquire(orgId: string, limit: number): Promise<Slot | null>;
  /** Requests the organization has in flight now. */
  inFlight(orgId: string): Promise<number>;
  close(): Promise<void>;
}

/** Counts in this process's memory: a process that dies takes its counts with it. */
export class InProcessLimiter implements ConcurrencyLimiter {
  private readonly counts = new Map<string, number>();
  private next = 0;

  async acquire(orgId: string, limit: number): Promise<Slot | null> {
    const n = this.counts.get(orgId) ?? 0;
    if (n >= limit) return null;
    this.counts.set(orgId, n + 1);
    let released = false;
    return {
      id: `slot_${++this.next}`,
      release: async () => {
        if (released) return;
        released = true;
        const left = (this.counts.get(orgId) ?? 1) - 1;
        if (left <= 0) this.counts.delete(orgId);
        else this.counts.set(orgId, left);
      },
    };
  }

  async inFlight(orgId: string): Promise<number> {
    return this.counts.get(orgId) ?? 0;
  }

  async close(): Promise<void> {}
}
