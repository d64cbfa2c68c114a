/**
 * The code search score adjustment: `noul` is moved from the model's raw
 * probability so that keeping items with `noul > 0.5` keeps about the target
 * share (95%) of the items an agent needs. It is a shift in log-odds, so it is
 * monotone (raw order is kept) and maps the fitted threshold to exactly 0.5.
 */

import { logit, sigmoid } from "./calibration.js";

/** The smallest threshold a recall fit may place (the clip of `logit`). */
const EPS = 1e-6;

export interface RecallFit {
  /** Share of needed items to keep at noul > 0.5. */
  target: number;
  /** Raw probability that maps to 0.5. */
  threshold: number;
}

export function adjustForRecall(raw: number, fit: RecallFit | null | undefined): number {
  if (!fit) return raw;
  return sigmoid(logit(raw) - logit(fit.threshold));
}

/**
 * The largest threshold that keeps at least `target` of the needed items
 * (raw strictly above it): halfway in log-odds between the needed score that
 * must still be kept and the one below it that may go.
 */
export function fitRecallThreshold(neededRaw: readonly number[], target: number): number {
  const s = neededRaw.filter(Number.isFinite).sort((a, b) => a - b);
  if (s.length === 0) return 0.5;
  const drop = Math.floor((1 - target) * s.length + 1e-9);
  const keep = s[drop]!;
  const below = drop > 0 ? s[drop - 1]! : Math.max(EPS, keep / 2);
  return sigmoid((logit(keep) + logit(below)) / 2 - (keep === below ? 1e-3 : 0));
}

export interface RecallScore {
  recall: number;
  keptFraction: number;
  kept: number;
  needed: number;
  items: number;
}

/** Recall and kept share at noul > 0.5 after adjusting with `fit`. */
export function recallAt(items: readonly { raw: number; needed: boolean; overflow?: boolean }[], fit: RecallFit | null): RecallScore {
  let kept = 0;
  let needed = 0;
  let keptNeeded = 0;
  for (const it of items) {
    const noul = it.overflow ? 1 : adjustForRecall(it.raw, fit);
    const k = noul > 0.5;
    if (k) kept++;
    if (it.needed) {
      needed++;
      if (k) keptNeeded++;
    }
  }
  return {
    recall: needed ? keptNeeded / needed : 1,
    keptFraction: items.length ? kept / items.length : 0,
    kept,
    needed,
    items: items.length,
  };
}
