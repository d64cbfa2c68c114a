import type { EncodedQuestion } from "../inference/pack.js";

/**
 * Content-free priors (contextual calibration, Zhao et al. 2021): the same
 * question read against a state that says nothing ("N/A") shows what the
 * model answers from the wording alone — a lean to "yes", to the level named
 * first, to a short key. Subtracting that reading (in normalised log space,
 * with a weight fitted per question type, `prior` in the build's calibration
 * file) leaves what the state itself moved. Measured in bench/RESULTS.md
 * (issue 18, the readout study).
 *
 * A prior depends only on the question's branch (its suffix and labels), not
 * on the state, so it is cached per build: a caller who asks the same
 * question of many states (the usual classifier) pays for it once. The cache
 * is keyed by token ids, holds no state text, and is not charged for: like
 * the debias presentations, it is the engine's own reading.
 */
export const NEUTRAL_STATE = "N/A";

export class PriorCache {
  private readonly entries = new Map<string, number[]>();

  constructor(private readonly maxEntries = 50_000) {}

  private key(build: string, neutral: string, q: EncodedQuestion): string {
    return `${build}|${neutral.length}:${neutral}|${q.suffix.join(",")}|${q.labels.map((l) => l.join(",")).join(";")}`;
  }

  /** Each branch's cached reading against `neutral`, or undefined. A hit becomes the most recently used entry. */
  lookup(build: string, neutral: string, branches: readonly EncodedQuestion[]): (number[] | undefined)[] {
    const out = branches.map((b) => {
      const k = this.key(build, neutral, b);
      const hit = this.entries.get(k);
      if (hit) {
        // Refresh: Map order is the LRU order.
        this.entries.delete(k);
        this.entries.set(k, hit);
      }
      return hit;
    });
    return out;
  }

  store(build: string, neutral: string, branch: EncodedQuestion, reading: number[]): void {
    this.entries.set(this.key(build, neutral, branch), reading);
    while (this.entries.size > this.maxEntries) this.entries.delete(this.entries.keys().next().value!);
  }
}

/** `reading − w · prior`, both normalised over the options first. */
export function subtractPrior(reading: readonly number[], prior: readonly number[], w: number): number[] {
  const norm = (xs: readonly number[]) => {
    const m = Math.max(...xs);
    const z = m + Math.log(xs.reduce((s, x) => s + Math.exp(x - m), 0));
    return xs.map((x) => x - z);
  };
  const r = norm(reading);
  const p = norm(prior);
  return r.map((x, i) => x - w * p[i]!);
}
