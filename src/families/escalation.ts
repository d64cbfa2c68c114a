/**
 * Escalation, shared by code search and fact check: the small model scores
 * everything; what it is unsure about — a score inside the band fitted on dev
 * data (see `assay calibrate`) — is scored again by the large model, whose
 * answer replaces the small one's.
 */
export interface Band {
  lo: number;
  hi: number;
}

/** With no fitted band, "unsure" means the middle of the probability scale. */
export const DEFAULT_BAND: Band = { lo: 0.2, hi: 0.8 };

export function unsureIndices(p: readonly number[], band: Band): number[] {
  const out: number[] = [];
  p.forEach((x, i) => {
    if (Number.isFinite(x) && x >= band.lo && x <= band.hi) out.push(i);
  });
  return out;
}

export interface Escalated {
  /** Final score per index: the large model's where it rescored, else the small one's. */
  final: number[];
  large: number[];
  escalated: boolean[];
}

/**
 * `acquireLarge` runs only when something is unsure (it may throw 503 while
 * the large model starts); `rescore` returns one score per index it is given.
 */
export async function escalate(
  small: readonly number[],
  band: Band,
  acquireLarge: () => () => void,
  rescore: (indices: number[]) => Promise<number[]>,
): Promise<Escalated> {
  const idx = unsureIndices(small, band);
  const final = [...small];
  const large = small.map(() => Number.NaN);
  const escalated = small.map(() => false);
  if (idx.length === 0) return { final, large, escalated };
  const release = acquireLarge();
  try {
    const scores = await rescore(idx);
    idx.forEach((i, k) => {
      final[i] = scores[k]!;
      large[i] = scores[k]!;
      escalated[i] = true;
    });
  } finally {
    release();
  }
  return { final, large, escalated };
}

/**
 * A band from dev data: the `fraction` of items whose small-model scores lie
 * nearest (by rank) to `center`, the score where the decision flips.
 */
export function fitBand(scores: readonly number[], center: number, fraction: number): Band {
  const s = scores.filter(Number.isFinite).sort((a, b) => a - b);
  if (s.length === 0) return DEFAULT_BAND;
  let pos = s.findIndex((x) => x >= center);
  if (pos < 0) pos = s.length;
  const half = Math.floor((s.length * fraction) / 2);
  const lo = s[Math.max(0, pos - half)]!;
  const hi = s[Math.min(s.length - 1, pos + half)]!;
  return { lo, hi };
}
