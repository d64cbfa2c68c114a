/**
 * Fitting the calibration maps (src/probability/calibration.ts) and the code
 * search recall adjustment (src/probability/recall.ts) on labelled dev data:
 * offline work for `assay calibrate`, never on the serving path.
 *
 * All maps are fitted by minimising the negative log-likelihood (convex in
 * 1/T and in (a, b)) with Newton steps; a small L2 pull towards the identity
 * keeps a fit on few rows from running off.
 */
import { adjustForRecall, type RecallFit } from "../probability/recall.js";
import { logit, logSumExp, sigmoid, type Platt } from "../probability/calibration.js";

/** log σ(x), stable for large |x|. */
const logSigmoid = (x: number): number => (x >= 0 ? -Math.log1p(Math.exp(-x)) : x - Math.log1p(Math.exp(x)));

/** The smallest threshold a recall fit may place (the clip of `logit`). */
const EPS = 1e-6;

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

/** One labelled item for a top-label fit: the model's own probability of its predicted option, and whether it was right. */
export interface LabelledConfidence {
  confidence: number;
  correct: boolean;
}

/** Platt scaling of the predicted option's probability against being right (`fitPlatt` on its log-odds). */
export function fitTopLabel(items: readonly LabelledConfidence[]): Platt {
  return fitPlatt(items.filter((it) => it.confidence > 0 && it.confidence < 1).map((it) => ({ z: logit(it.confidence), y: it.correct })));
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

/** Solves A x = b (small, symmetric positive definite) by Gaussian elimination with pivoting. */
export function solveLinear(a: number[][], b: number[]): number[] {
  const n = b.length;
  const m = a.map((row, i) => [...row, b[i]!]);
  for (let c = 0; c < n; c++) {
    let piv = c;
    for (let r = c + 1; r < n; r++) if (Math.abs(m[r]![c]!) > Math.abs(m[piv]![c]!)) piv = r;
    [m[c], m[piv]] = [m[piv]!, m[c]!];
    const d = m[c]![c]! || 1e-12;
    for (let r = 0; r < n; r++) {
      if (r === c) continue;
      const f = m[r]![c]! / d;
      for (let k = c; k <= n; k++) m[r]![k]! -= f * m[c]![k]!;
    }
  }
  return m.map((row, i) => row[n]! / (row[i]! || 1e-12));
}

/**
 * Weighted L2-penalised logistic regression by Newton steps. Each row starts
 * with its bias column (1), which is not penalised; `start` is the first
 * guess, `biasRidge` a tiny ridge on the bias (separable data). Returns the
 * coefficients, bias first.
 */
export function newtonLogistic(
  rows: readonly (readonly number[])[],
  y: readonly boolean[],
  weights: readonly number[],
  opts: { l2: number; start?: number[]; tol?: number; biasRidge?: number },
): number[] {
  const d = rows[0]?.length ?? 1;
  let w = opts.start ? [...opts.start] : new Array<number>(d).fill(0);
  for (let iter = 0; iter < 50; iter++) {
    const g = new Array<number>(d).fill(0);
    const h = Array.from({ length: d }, () => new Array<number>(d).fill(0));
    rows.forEach((r, i) => {
      let s = 0;
      for (let k = 0; k < d; k++) s += w[k]! * r[k]!;
      const p = 1 / (1 + Math.exp(-s));
      const wi = weights[i]!;
      const e = wi * (p - (y[i] ? 1 : 0));
      const v = wi * Math.max(p * (1 - p), 1e-9);
      for (let a = 0; a < d; a++) {
        g[a]! += e * r[a]!;
        for (let b = 0; b < d; b++) h[a]![b]! += v * r[a]! * r[b]!;
      }
    });
    for (let a = 1; a < d; a++) {
      g[a]! += opts.l2 * w[a]!;
      h[a]![a]! += opts.l2;
    }
    h[0]![0]! += opts.biasRidge ?? 0;
    const step = solveLinear(h, g);
    w = w.map((v, k) => v - step[k]!);
    if (Math.max(...step.map(Math.abs)) < (opts.tol ?? 1e-9)) break;
  }
  return w;
}
