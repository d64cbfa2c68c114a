/**
 * One timings object per request. Stages are measured in milliseconds and
 * feed the response headers (`x-<stage>-time`, `server-timing`), the
 * Prometheus stage histograms and the benchmark alike.
 */
export type Stage =
  | "validate"
  | "auth"
  | "admission"
  | "prompt"
  | "tokenize"
  | "queue"
  | "inference"
  | "probability"
  | "total";

export class Timings {
  readonly start = performance.now();
  readonly ms: Partial<Record<Stage, number>> = {};
  /**
   * Figures that are not stages, in milliseconds: `deadline` (what the
   * request was given, from arrival) and `estimated` (its estimated wait plus
   * its own work, at admission). Sent as `x-<name>-time`, never histogrammed.
   */
  readonly notes: Record<string, number> = {};

  /** Prefix tokens whose keys and values came from the prefix cache, over all of the request's passes. */
  cachedPrefixTokens = 0;

  cached(tokens: number): void {
    this.cachedPrefixTokens += tokens;
  }

  note(name: "deadline" | "estimated", ms: number): void {
    this.notes[name] = ms;
  }

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

  /** Sets `total` once; later calls keep the first end (a response is timed when it is decided). */
  finish(): void {
    this.ms.total ??= performance.now() - this.start;
  }

  /** Measured stages in a fixed order. */
  entries(): [Stage, number][] {
    return Object.entries(this.ms) as [Stage, number][];
  }

  /** `x-<stage>-time` headers, milliseconds with one decimal, plus the standard `server-timing`. */
  headers(): Record<string, string> {
    const h: Record<string, string> = {};
    const st: string[] = [];
    for (const [k, v] of this.entries()) {
      h[`x-${k}-time`] = v.toFixed(1);
      st.push(`${k};dur=${v.toFixed(1)}`);
    }
    if (st.length > 0) h["server-timing"] = st.join(", ");
    for (const [k, v] of Object.entries(this.notes)) h[`x-${k}-time`] = v.toFixed(1);
    h["x-prefix-cache-tokens"] = String(this.cachedPrefixTokens);
    return h;
  }
}
