/**
 * One timings object per request. Stages are measured in milliseconds and
 * feed the response headers, metrics and the benchmark alike.
 */
export type Stage = "validate" | "auth" | "prompt" | "tokenize" | "queue" | "inference" | "probability" | "total";

export class Timings {
  readonly start = performance.now();
  readonly ms: Partial<Record<Stage, number>> = {};

  add(stage: Stage, ms: number): void {
    this.ms[stage] = (this.ms[stage] ?? 0) + ms;
  }

  /** Time `fn` into `stage`. */
  async time<T>(stage: Stage, fn: () => Promise<T> | T): Promise<T> {
    const t = performance.now();
    try {
      return await fn();
    } finally {
      this.add(stage, performance.now() - t);
    }
  }

  finish(): void {
    this.ms.total = performance.now() - this.start;
  }

  /** `x-<stage>-time` headers, milliseconds with one decimal. */
  headers(): Record<string, string> {
    const h: Record<string, string> = {};
    for (const [k, v] of Object.entries(this.ms)) h[`x-${k}-time`] = v.toFixed(1);
    return h;
  }
}
