import { LRUCache } from "lru-cache";
import type { EncodedQuestion } from "../inference/pack.js";

/**
 * Content-free priors (contextual calibration, Zhao et al. 2021): the same
 * question read against a state that says nothing ("N/A") shows what the
 * model answers from the wording alone — a lean to "yes", to the level named
 * first, to a short key. Subtracting that reading (in normalised log space,
 * with a weight fitted per question type, `prior` in the build's calibration
 * file) leaves what the state itself moved. Measured in docs/experiments/readout-study.md
 * (issue 18, the readout study).
 *
 * A prior depends only on the question's branch (its suffix and labels), not
 * on the state, so it is cached per build: a caller who asks the same
 * question of many states (the usual classifier) pays for it once. The cache
 * is keyed by token ids, holds no state text, and is not charged for: like
 * the debias presentations, it is the engine's own reading.
 */
export const NEUTRAL_STATE = "N/A";

/**
 * Partitioned by organization unless configured as shared (the prefix cache's
 * scope, ASSAY_PREFIX_CACHE_SCOPE): a question whose prior is cached answers
 * a pass sooner (about 0.9 s of a 2.4 s request on the 1.5B build), so a
 * shared cache would let one organization time whether another asked a given
 * question or checked a given claim.
 */
export class PriorCache {
  private readonly lru: LRUCache<string, number[]>;

  constructor(
    readonly scope: "organization" | "shared",
    maxEntries = 50_000,
  ) {
    this.lru = new LRUCache<string, number[]>({ max: maxEntries });
  }

  private key(build: string, org: string | undefined, neutral: string, q: EncodedQuestion): string {
    const part = this.scope === "shared" ? "" : (org ?? "");
    return `${build}\u0000${part}\u0000${neutral.length}:${neutral}\u0000${q.suffix.join(",")}|${q.labels.map((l) => l.join(",")).join(";")}`;
  }

  /**
   * Each branch's cached reading against `neutral` in `org`'s partition, or
   * undefined. `touch`: a hit becomes the most recently used entry (a read);
   * admission's planning only looks, so a refused request keeps nothing warm.
   */
  lookup(build: string, org: string | undefined, neutral: string, branches: readonly EncodedQuestion[], touch = true): (number[] | undefined)[] {
    return branches.map((b) => {
      const k = this.key(build, org, neutral, b);
      return touch ? this.lru.get(k) : this.lru.peek(k);
    });
  }

  /** One key for a set of branches read together (a prior pass in flight: Engine.prior). */
  keyOf(build: string, org: string | undefined, neutral: string, branches: readonly EncodedQuestion[]): string {
    return branches.map((b) => this.key(build, org, neutral, b)).join("\u0001");
  }

  store(build: string, org: string | undefined, neutral: string, branch: EncodedQuestion, reading: number[]): void {
    this.lru.set(this.key(build, org, neutral, branch), reading);
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
