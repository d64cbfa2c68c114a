/**
 * Calibration maps as the server applies them. Pure functions over plain
 * arrays. Fitting them is offline work: src/eval/fitting.ts.
 *
 * Which map for which question type, and why:
 *
 * - `choice` and `score`: one temperature T per (type, option count),
 *   p = softmax(lp / T). A single scalar is the only map that is both
 *   monotone and blind to which option sits where: a per-option or
 *   per-position bias (vector/matrix scaling, contextual calibration) would
 *   have to be keyed by option *position* — re-introducing the order
 *   dependence that the engine's cyclic-shift averaging removes — or by option
 *   *key*, which does not carry over from one question to another.
 * - `noul`: Platt scaling on the yes/no log-odds z = lp(yes) − lp(no),
 *   p = σ(a·z + b) with a > 0. Yes and no have fixed meanings in every noul
 *   question, so a bias term b is legitimate there (the model's prior lean to
 *   "yes" is the same lean whatever the statement), and a > 0 keeps the map
 *   monotone: it never reorders two answers, so AUROC is unchanged.
 *   Temperature scaling is the special case b = 0.
 *
 * - `choice` and `score`, on top of the temperature: a top-label map. The
 *   temperature is fitted on the log-likelihood of the gold label, which a
 *   few confident mistakes dominate: on AG News it flattens every answer and
 *   leaves the predicted option's probability 0.1–0.2 below how often it is
 *   right. Callers route on that number (and ECE reads it), so it gets a map
 *   of its own: with c the predicted option's probability in the model's own
 *   distribution (before the temperature), it becomes σ(a·logit(c) + b),
 *   a > 0, and the other options share the rest in their tempered
 *   proportions. Monotone in c and blind to option order and position, for
 *   the same reasons as the temperature; never moves the argmax.
 */

/** Platt parameters of p = σ(a·z + b) on the yes/no log-odds z. */
export interface Platt {
  a: number;
  b: number;
}

/** Anything that holds calibration maps (a CalibrationFit, or a section of one). */
export interface CalibrationMaps {
  temperatures?: Record<string, number> | undefined;
  platt?: Record<string, Platt> | undefined;
  /** Top-label maps for choice/score, keyed like temperatures (`choice:4`, `score:*`). */
  top_label?: Record<string, Platt> | undefined;
}

const LOGIT_EPS = 1e-6;

/** Log-odds, clipped so that 0 and 1 stay finite. */
export function logit(p: number): number {
  const q = Math.min(1 - LOGIT_EPS, Math.max(LOGIT_EPS, p));
  return Math.log(q / (1 - q));
}

export const sigmoid = (x: number): number => (x >= 0 ? 1 / (1 + Math.exp(-x)) : Math.exp(x) / (1 + Math.exp(x)));

export function logSumExp(xs: readonly number[], scale = 1): number {
  let max = -Infinity;
  for (const x of xs) if (x * scale > max) max = x * scale;
  if (!Number.isFinite(max)) return max;
  let s = 0;
  for (const x of xs) s += Math.exp(x * scale - max);
  return max + Math.log(s);
}

/**
 * Probability of "true" for a noul question from its yes/no log-odds,
 * through the map stored under `key` (e.g. "noul:2", "factcheck:noul"):
 * its Platt parameters if fitted, else a temperature under the same key,
 * else identity. Reusable by any family that reads a yes/no answer.
 */
/** The key of a yes/no noul question's map (a general question, or a claim read as one). */
export const NOUL_KEY = "noul:2";

export function calibrateNoul(logOdds: number, fit: CalibrationMaps | null | undefined, key = NOUL_KEY): number {
  return sigmoid(noulLogit(logOdds, fit, key));
}

/** The calibrated log-odds a·z + b (see `calibrateNoul`). */
export function noulLogit(logOdds: number, fit: CalibrationMaps | null | undefined, key = NOUL_KEY): number {
  const pl = fit?.platt?.[key];
  if (pl) return pl.a * logOdds + pl.b;
  const t = fit?.temperatures?.[key];
  return t ? logOdds / t : logOdds;
}

/** Inverse of `noulLogit`: the raw log-odds behind a calibrated one. */
export function uncalibrateNoulLogit(logit: number, fit: CalibrationMaps | null | undefined, key = NOUL_KEY): number {
  const pl = fit?.platt?.[key];
  if (pl) return (logit - pl.b) / pl.a;
  const t = fit?.temperatures?.[key];
  return t ? logit * t : logit;
}

/**
 * Average of several readings of one question's option log-probabilities
 * (one per presentation order of its options), in log space: each reading is
 * normalised over the options and the mean is taken per option. If the model
 * adds a bias to whichever option sits at position j, and every option visits
 * every position once (all k cyclic shifts), each option collects the same
 * total bias and the average is free of it. The result is itself normalised
 * (a log-softmax), so temperatures apply to it as to a single reading.
 */
export function averageReadings(readings: readonly (readonly number[])[]): number[] {
  if (readings.length === 0) throw new Error("averageReadings: no readings");
  const k = readings[0]!.length;
  const sum = new Array<number>(k).fill(0);
  for (const r of readings) {
    if (r.length !== k) throw new Error("averageReadings: readings differ in length");
    const lse = logSumExp(r);
    for (let i = 0; i < k; i++) sum[i]! += r[i]! - lse;
  }
  const mean = sum.map((s) => s / readings.length);
  const lse = logSumExp(mean);
  return mean.map((m) => m - lse);
}
