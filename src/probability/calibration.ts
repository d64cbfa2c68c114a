/**
 * Calibration maps and their fitting. Pure functions over plain arrays.
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
 *
 * All are fitted by minimising the negative log-likelihood (convex in 1/T
 * and in (a, b)) with Newton steps; a small L2 pull towards the identity
 * keeps a fit on few rows from running off.
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

/** log σ(x), stable for large |x|. */
const logSigmoid = (x: number): number => (x >= 0 ? -Math.log1p(Math.exp(-x)) : x - Math.log1p(Math.exp(x)));

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

/** One labelled item for a temperature fit: label log-probabilities and the gold label's index. */
export interface LabelledLogprobs {
  lp: readonly number[];
  gold: number;
}

/** Mean negative log-likelihood of the gold labels under softmax(lp / T). */
export function temperatureNll(items: readonly LabelledLogprobs[], t: number): number {
  if (items.length === 0) return 0;
  let s = 0;
  for (const it of items) s += logSumExp(it.lp, 1 / t) - it.lp[it.gold]! / t;
  return s / items.length;
}

/**
 * Temperature minimising the mean NLL (plus `l2`·(log T)² towards T = 1).
 * Newton steps on β = 1/T, where the NLL is convex: gradient
 * Σ(E_p[lp] − lp_gold), curvature Σ Var_p[lp]. β is kept in [0.01, 100].
 */
export function fitTemperature(items: readonly LabelledLogprobs[], opts: { l2?: number } = {}): number {
  const usable = items.filter((it) => it.lp.every(Number.isFinite) && it.lp.length > 1);
  if (usable.length === 0) return 1;
  const l2 = opts.l2 ?? 1e-3;
  const n = usable.length;
  // Objective in β: mean NLL + l2·(log β)² (log T = −log β).
  const objective = (beta: number) => temperatureNll(usable, 1 / beta) + l2 * Math.log(beta) ** 2;
  let beta = 1;
  for (let iter = 0; iter < 100; iter++) {
    let g = 0;
    let h = 0;
    for (const it of usable) {
      const lse = logSumExp(it.lp, beta);
      let m1 = 0;
      let m2 = 0;
      for (const x of it.lp) {
        const p = Math.exp(beta * x - lse);
        m1 += p * x;
        m2 += p * x * x;
      }
      g += m1 - it.lp[it.gold]!;
      h += m2 - m1 * m1;
    }
    g = g / n + (2 * l2 * Math.log(beta)) / beta;
    h = h / n + (2 * l2 * (1 - Math.log(beta))) / (beta * beta);
    let step = h > 1e-12 ? g / h : Math.sign(g) * 0.5 * beta;
    // Backtrack so that every step lowers the objective and β stays in range.
    const f0 = objective(beta);
    let next = Math.min(100, Math.max(0.01, beta - step));
    for (let k = 0; k < 30 && objective(next) > f0; k++) {
      step /= 2;
      next = Math.min(100, Math.max(0.01, beta - step));
    }
    if (Math.abs(next - beta) < 1e-10 * Math.max(1, beta)) {
      beta = next;
      break;
    }
    beta = next;
  }
  return 1 / beta;
}

/** One labelled item for a Platt fit: the yes/no log-odds and whether the statement is true. */
export interface LabelledLogOdds {
  z: number;
  y: boolean;
  /** Weight of the item in the fit (default 1). */
  w?: number;
}

/**
 * Item weights under which each set's two classes weigh the same (n_set / (2 · n_set,class)):
 * a fit's intercept then carries the model's lean, not the label mix of the sets pooled.
 */
export function balancedWeights(items: readonly { set: string; y: boolean }[]): number[] {
  const count = new Map<string, number>();
  const size = new Map<string, number>();
  for (const it of items) {
    count.set(`${it.set}|${it.y}`, (count.get(`${it.set}|${it.y}`) ?? 0) + 1);
    size.set(it.set, (size.get(it.set) ?? 0) + 1);
  }
  return items.map((it) => size.get(it.set)! / (2 * count.get(`${it.set}|${it.y}`)!));
}

/** Mean negative log-likelihood of σ(a·z + b). */
export function plattNll(items: readonly LabelledLogOdds[], p: Platt): number {
  if (items.length === 0) return 0;
  let s = 0;
  for (const it of items) {
    const u = p.a * it.z + p.b;
    s -= it.y ? logSigmoid(u) : logSigmoid(-u);
  }
  return s / items.length;
}

/**
 * Platt scaling by Newton's method on the mean NLL plus `l2`·((a − 1)² + b²)
 * (a pull towards identity), with `a` kept ≥ `minA` > 0 so the map stays
 * monotone increasing. Uses Platt's smoothed targets (n₊+1)/(n₊+2) and
 * 1/(n₋+2), which keep a separable sample from driving a to infinity.
 */
export function fitPlatt(items: readonly LabelledLogOdds[], opts: { l2?: number; minA?: number } = {}): Platt {
  const usable = items.filter((it) => Number.isFinite(it.z));
  if (usable.length === 0) return { a: 1, b: 0 };
  const l2 = opts.l2 ?? 1e-3;
  const minA = opts.minA ?? 1e-3;
  const weight = (it: LabelledLogOdds) => it.w ?? 1;
  const nPos = usable.filter((it) => it.y).reduce((s, it) => s + weight(it), 0);
  const n = usable.reduce((s, it) => s + weight(it), 0);
  const nNeg = n - nPos;
  const tPos = (nPos + 1) / (nPos + 2);
  const tNeg = 1 / (nNeg + 2);
  const objective = (a: number, b: number) => {
    let s = 0;
    for (const it of usable) {
      const u = a * it.z + b;
      const t = it.y ? tPos : tNeg;
      s -= weight(it) * (t * logSigmoid(u) + (1 - t) * logSigmoid(-u));
    }
    return s / n + l2 * ((a - 1) ** 2 + b * b);
  };
  let a = 1;
  let b = 0;
  for (let iter = 0; iter < 100; iter++) {
    let ga = 0;
    let gb = 0;
    let haa = 0;
    let hab = 0;
    let hbb = 0;
    for (const it of usable) {
      const p = sigmoid(a * it.z + b);
      const t = it.y ? tPos : tNeg;
      const c = weight(it);
      const d = c * (p - t);
      const w = c * p * (1 - p);
      ga += d * it.z;
      gb += d;
      haa += w * it.z * it.z;
      hab += w * it.z;
      hbb += w;
    }
    ga = ga / n + 2 * l2 * (a - 1);
    gb = gb / n + 2 * l2 * b;
    haa = haa / n + 2 * l2;
    hab = hab / n;
    hbb = hbb / n + 2 * l2;
    const det = haa * hbb - hab * hab;
    if (!(det > 0)) break;
    let da = (hbb * ga - hab * gb) / det;
    let db = (haa * gb - hab * ga) / det;
    const f0 = objective(a, b);
    let na = Math.max(minA, a - da);
    let nb = b - db;
    for (let k = 0; k < 30 && objective(na, nb) > f0; k++) {
      da /= 2;
      db /= 2;
      na = Math.max(minA, a - da);
      nb = b - db;
    }
    const moved = Math.abs(na - a) + Math.abs(nb - b);
    a = na;
    b = nb;
    if (moved < 1e-10) break;
  }
  return { a, b };
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

/** One labelled item for a top-label fit: the model's own probability of its predicted option, and whether it was right. */
export interface LabelledConfidence {
  confidence: number;
  correct: boolean;
}

/** Platt scaling of the predicted option's probability against being right (`fitPlatt` on its log-odds). */
export function fitTopLabel(items: readonly LabelledConfidence[]): Platt {
  return fitPlatt(items.filter((it) => it.confidence > 0 && it.confidence < 1).map((it) => ({ z: logit(it.confidence), y: it.correct })));
}
