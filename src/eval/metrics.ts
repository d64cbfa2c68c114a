/**
 * Evaluation metrics: pure functions over plain arrays, no I/O.
 *
 * Conventions: empty inputs give `null` where a metric is undefined (no items,
 * AUROC with a single class), never NaN, so that results serialise to JSON.
 */

export function mean(xs: readonly number[]): number | null {
  if (xs.length === 0) return null;
  let s = 0;
  for (const x of xs) s += x;
  return s / xs.length;
}

/** Fraction of true entries. */
export function accuracy(correct: readonly boolean[]): number | null {
  return mean(correct.map((c) => (c ? 1 : 0)));
}

/** Index of the largest value (the first on ties). */
export function argmaxIndex(xs: readonly number[]): number {
  let best = 0;
  for (let i = 1; i < xs.length; i++) if (xs[i]! > xs[best]!) best = i;
  return best;
}

/**
 * Macro-averaged F1 over the classes that occur in the gold labels or the
 * predictions (as scikit-learn does by default). A class with no true
 * positives has F1 0.
 */
export function macroF1(gold: readonly string[], pred: readonly string[]): number | null {
  if (gold.length !== pred.length) throw new Error("macroF1: gold and pred differ in length");
  if (gold.length === 0) return null;
  const classes = new Set<string>([...gold, ...pred]);
  let sum = 0;
  for (const c of classes) {
    let tp = 0;
    let fp = 0;
    let fn = 0;
    for (let i = 0; i < gold.length; i++) {
      const g = gold[i] === c;
      const p = pred[i] === c;
      if (g && p) tp++;
      else if (p) fp++;
      else if (g) fn++;
    }
    sum += tp === 0 ? 0 : (2 * tp) / (2 * tp + fp + fn);
  }
  return sum / classes.size;
}

/** Mean absolute error. */
export function meanAbsoluteError(gold: readonly number[], pred: readonly number[]): number | null {
  if (gold.length !== pred.length) throw new Error("meanAbsoluteError: gold and pred differ in length");
  return mean(gold.map((g, i) => Math.abs(pred[i]! - g)));
}

/** Fraction of predictions within one level of the gold level. */
export function offByOneAccuracy(gold: readonly number[], pred: readonly number[]): number | null {
  if (gold.length !== pred.length) throw new Error("offByOneAccuracy: gold and pred differ in length");
  return accuracy(gold.map((g, i) => Math.abs(pred[i]! - g) <= 1));
}

/**
 * Area under the ROC curve: the probability that a random positive scores
 * above a random negative, ties counting one half (Mann–Whitney U).
 * Null when either class is missing.
 */
export function auroc(scores: readonly number[], labels: readonly boolean[]): number | null {
  if (scores.length !== labels.length) throw new Error("auroc: scores and labels differ in length");
  const idx = scores.map((_, i) => i).sort((a, b) => scores[a]! - scores[b]!);
  // Average ranks (1-based) over tied groups.
  const rank = new Array<number>(scores.length);
  for (let i = 0; i < idx.length; ) {
    let j = i;
    while (j + 1 < idx.length && scores[idx[j + 1]!] === scores[idx[i]!]) j++;
    const r = (i + j) / 2 + 1;
    for (let k = i; k <= j; k++) rank[idx[k]!] = r;
    i = j + 1;
  }
  let nPos = 0;
  let rankSum = 0;
  labels.forEach((l, i) => {
    if (l) {
      nPos++;
      rankSum += rank[i]!;
    }
  });
  const nNeg = labels.length - nPos;
  if (nPos === 0 || nNeg === 0) return null;
  return (rankSum - (nPos * (nPos + 1)) / 2) / (nPos * nNeg);
}

/** Brier score of a binary forecast: mean of (p − y)². */
export function brier(p: readonly number[], labels: readonly boolean[]): number | null {
  if (p.length !== labels.length) throw new Error("brier: p and labels differ in length");
  return mean(p.map((pi, i) => (pi - (labels[i] ? 1 : 0)) ** 2));
}

/** Predicted class and its confidence for a binary probability: class = p > 0.5, confidence = max(p, 1 − p). */
export function binaryPrediction(p: number): { pred: boolean; confidence: number } {
  return { pred: p > 0.5, confidence: Math.max(p, 1 - p) };
}

export interface ReliabilityBin {
  /** Bin interval [lo, hi) (the last bin includes 1). */
  lo: number;
  hi: number;
  count: number;
  /** Mean confidence of the items in the bin; null when empty. */
  confidence: number | null;
  /** Fraction correct in the bin; null when empty. */
  accuracy: number | null;
}

export interface Reliability {
  bins: ReliabilityBin[];
  /** Expected calibration error: Σ (n_b / n) · |accuracy_b − confidence_b|. Null with no items. */
  ece: number | null;
}

/**
 * Reliability table and ECE over `nBins` equal-width confidence bins on [0, 1].
 * An item with confidence c goes to bin min(⌊c · nBins⌋, nBins − 1).
 */
export function reliability(confidence: readonly number[], correct: readonly boolean[], nBins = 15): Reliability {
  if (confidence.length !== correct.length) throw new Error("reliability: confidence and correct differ in length");
  const count = new Array<number>(nBins).fill(0);
  const confSum = new Array<number>(nBins).fill(0);
  const hits = new Array<number>(nBins).fill(0);
  confidence.forEach((c, i) => {
    const b = Math.min(nBins - 1, Math.max(0, Math.floor(c * nBins)));
    count[b]!++;
    confSum[b]! += c;
    if (correct[i]) hits[b]!++;
  });
  const n = confidence.length;
  let ece = 0;
  const bins: ReliabilityBin[] = count.map((k, b) => {
    const conf = k > 0 ? confSum[b]! / k : null;
    const acc = k > 0 ? hits[b]! / k : null;
    if (conf !== null && acc !== null) ece += (k / n) * Math.abs(acc - conf);
    return { lo: b / nBins, hi: (b + 1) / nBins, count: k, confidence: conf, accuracy: acc };
  });
  return { bins, ece: n > 0 ? ece : null };
}

/** Fraction of items whose answer changed between two orderings (pairs with a missing side are ignored). */
export function flipRate<T>(original: readonly (T | null)[], reordered: readonly (T | null)[]): number | null {
  if (original.length !== reordered.length) throw new Error("flipRate: inputs differ in length");
  const flips: boolean[] = [];
  original.forEach((a, i) => {
    const b = reordered[i];
    if (a !== null && b !== null && b !== undefined) flips.push(a !== b);
  });
  return accuracy(flips);
}

/** Map a level index read from the reversed (high → low) presentation back to the low → high scale. */
export function unreverseLevel(index: number, k: number): number {
  return k - 1 - index;
}

/** Log-softmax: log-probabilities normalised over the given entries. */
export function logSoftmax(xs: readonly number[]): number[] {
  let max = -Infinity;
  for (const x of xs) if (x > max) max = x;
  if (!Number.isFinite(max)) return xs.map(() => -Math.log(xs.length));
  let s = 0;
  for (const x of xs) s += Math.exp(x - max);
  const lse = max + Math.log(s);
  return xs.map((x) => x - lse);
}
