import { logit, logSumExp, sigmoid } from "./calibration.js";

/**
 * Confidence maps: how sure an answer is, read from more than its own
 * probabilities. A temperature per question type carries poorly to a new
 * kind of question: averaging the option orders (the cyclic shifts) and
 * dividing out the content-free prior both flatten an answer the model is
 * sure of, by an amount that depends on the question rather than on the
 * model's certainty. What does carry is how the readings behave: whether the
 * presentations agree on the answer, the margin over the runner-up, what the
 * answer looked like before the prior was taken off, how far the prior
 * pulled, and how many options there were. A confidence map is a logistic
 * model over those features (fitted offline, src/eval/confidence-fit.ts,
 * judged leave-one-dataset-out), applied here.
 *
 * choice / score: it sets the probability of the chosen option (the others
 * keep their proportions, as under a top-label map, or for score lean toward
 * the chosen level by its `spread`); it never changes which option is chosen.
 * noul: it is the probability of "true" itself, a logistic model on the
 * readings' log-odds with and without the prior, of which the Platt map is the
 * special case that weighs the prior fully.
 */

/** What the engine read for one question, before any map. */
export interface QuestionReading {
  /** The answer's option log-probabilities: every presentation, the prior taken off, averaged (normalised). */
  lp: number[];
  /** Each presentation's log-probabilities, normalised over the options, the prior taken off. */
  presentations: number[][];
  /** The presentations averaged without taking the prior off (normalised). */
  raw: number[];
  /** The content-free prior averaged over the presentations (normalised); null where none was read. */
  prior: number[] | null;
  /** Read once by key and then again over a shortlist (many options). */
  shortlisted: boolean;
}

/** A logistic model: σ(bias + Σ weights[f] · features[f]); a feature the map does not name weighs nothing. */
export interface ConfidenceMap {
  bias: number;
  weights: Record<string, number>;
  /**
   * score only: how the levels other than the chosen one m share the rest, each weighted by
   * exp(−spread · |i − m|) on its own probability. A level next to the answer is a nearer miss than
   * one at the far end of the scale; without it, the averaged readings (flat across the scale) pull
   * the expected level toward the scale's middle. Absent or 0: in their own proportions.
   */
  spread?: number | undefined;
}

/** The confidence maps of a build, by question type. */
export type ConfidenceMaps = { [type in "noul" | "choice" | "score"]?: ConfidenceMap | undefined };

/** A reading of one presentation with no prior: what a bare list of log-probabilities says. */
export function singleReading(lp: readonly number[]): QuestionReading {
  return { lp: [...lp], presentations: [[...lp]], raw: [...lp], prior: null, shortlisted: false };
}

function normalise(xs: readonly number[]): number[] {
  const z = logSumExp(xs);
  return xs.map((x) => x - z);
}

function argmaxOf(xs: readonly number[]): number {
  let best = 0;
  for (let i = 1; i < xs.length; i++) if (xs[i]! > xs[best]!) best = i;
  return best;
}

/** Log-odds of a probability given as a log-probability, clipped like `logit`. */
const logitOfLog = (lp: number) => logit(Math.exp(lp));

/**
 * Features of a choice or score reading, all about the chosen option m (the
 * argmax of `lp`), each zero where the reading carries no information of its
 * kind (one presentation, no prior):
 * - `top`: log-odds of m in the answer's own distribution;
 * - `margin`: log-probability of m over the runner-up's;
 * - `agree`: the share of presentations whose own argmax is m, centred on
 *   chance (1/k); `spread`: the presentations' disagreement on m's
 *   log-probability (standard deviation);
 * - `mean`: log-odds of m's probability averaged over the presentations in
 *   probability space (disagreement flattens it less than the log-space mean);
 * - `raw`: log-odds of m before the prior was taken off;
 * - `pull`: how much the prior favoured m, log(k · prior_m);
 * - `logk`: log of the number of options; `shortlisted`: 1 when read by key and shortlisted.
 */
export function optionFeatures(r: QuestionReading): Record<string, number> {
  const k = r.lp.length;
  const lp = normalise(r.lp);
  const m = argmaxOf(lp);
  let second = -Infinity;
  for (let i = 0; i < k; i++) if (i !== m && lp[i]! > second) second = lp[i]!;
  const pres = r.presentations.map(normalise);
  const n = pres.length;
  const agree = n > 1 ? pres.filter((p) => argmaxOf(p) === m).length / n - 1 / k : 0;
  const mine = pres.map((p) => p[m]!);
  const avg = mine.reduce((s, x) => s + x, 0) / Math.max(1, n);
  const spread = n > 1 ? Math.sqrt(mine.reduce((s, x) => s + (x - avg) ** 2, 0) / n) : 0;
  const meanP = n > 0 ? mine.reduce((s, x) => s + Math.exp(x), 0) / n : Math.exp(lp[m]!);
  const raw = normalise(r.raw);
  const prior = r.prior ? normalise(r.prior) : null;
  return {
    top: logitOfLog(lp[m]!),
    margin: Number.isFinite(second) ? Math.min(20, lp[m]! - second) : 20,
    agree,
    spread: Math.min(20, spread),
    mean: logit(meanP),
    raw: logitOfLog(raw[m]!),
    pull: prior ? Math.max(-20, Math.log(k) + prior[m]!) : 0,
    logk: Math.log(k),
    shortlisted: r.shortlisted ? 1 : 0,
  };
}

/**
 * Features of a noul reading (options [yes, no]), signed toward "true":
 * `z` the answer's log-odds (prior off), `raw` the log-odds before the prior
 * was taken off, `prior` the prior's own log-odds, and `agree` the readings'
 * agreement (+1 all say true, −1 all say false; a statement is read both as
 * yes/no and as true/false).
 */
export function noulFeatures(r: QuestionReading): Record<string, number> {
  const odds = (xs: readonly number[]) => xs[0]! - xs[1]!;
  const clip = (x: number) => Math.max(-30, Math.min(30, x));
  const n = r.presentations.length;
  const agree = n > 0 ? r.presentations.reduce((s, p) => s + Math.sign(odds(p)), 0) / n : 0;
  return {
    z: clip(odds(r.lp)),
    raw: clip(odds(r.raw)),
    prior: r.prior ? clip(odds(r.prior)) : 0,
    agree,
  };
}

export function featuresFor(type: "noul" | "choice" | "score", r: QuestionReading): Record<string, number> {
  return type === "noul" ? noulFeatures(r) : optionFeatures(r);
}

/** σ(bias + Σ w·f). */
export function applyConfidenceMap(map: ConfidenceMap, features: Record<string, number>): number {
  let s = map.bias;
  for (const [name, w] of Object.entries(map.weights)) s += w * (features[name] ?? 0);
  return sigmoid(s);
}
