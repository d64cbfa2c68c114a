import type { Answer, ChoiceAnswer, NoulAnswer, ScoreAnswer } from "../validate/schema.js";
import type { CalibrationFit } from "../models/manifest.js";
import { calibrateNoul, logit, sigmoid, type CalibrationMaps, type Platt } from "./calibration.js";
import { applyConfidenceMap, featuresFor, singleReading, type ConfidenceMap, type ConfidenceMaps, type QuestionReading } from "./confidence.js";
import type { QuestionMap } from "./question-maps.js";

export * from "./calibration.js";
export * from "./confidence.js";
export * from "./question-maps.js";

/**
 * Log-probabilities of each question's labels → the spec's answers.
 * Plain loops over small arrays: this runs once per question.
 */

/** Softmax over label log-probabilities, divided by a temperature. Subtracts the true max. */
export function softmax(logits: readonly number[], temperature = 1): number[] {
  let max = -Infinity;
  for (const l of logits) if (l > max) max = l;
  if (!Number.isFinite(max)) return logits.map(() => 1 / logits.length);
  const out = new Array<number>(logits.length);
  let sum = 0;
  for (let i = 0; i < logits.length; i++) {
    const e = Math.exp((logits[i]! - max) / temperature);
    out[i] = e;
    sum += e;
  }
  for (let i = 0; i < out.length; i++) out[i]! /= sum;
  return out;
}

export function argmax(xs: readonly number[]): number {
  let best = 0;
  for (let i = 1; i < xs.length; i++) if (xs[i]! > xs[best]!) best = i;
  return best;
}

/** 1 when one option holds all the mass, 0 when uniform: (p_max − 1/k) / (1 − 1/k), clipped. */
export function choiceConfidence(p: readonly number[]): number {
  const k = p.length;
  const c = (p[argmax(p)]! - 1 / k) / (1 - 1 / k);
  return Math.min(1, Math.max(0, c));
}

/**
 * Ordinal confidence, the reference formula of the hosted API (and jevcompat's
 * `confidence.formula`): 1 − (expected distance from the mode) / (the expected
 * distance of a uniform distribution from the scale's centre), floored at 0.
 * The denominator depends on the scale alone, so two answers on one scale are
 * compared on one yardstick whichever level they favour; measuring the uniform
 * spread from the mode instead (an earlier definition) rated an answer peaked
 * at an end of the scale higher than the same shape in its middle.
 */
export function scoreConfidence(p: readonly number[]): number {
  const k = p.length;
  if (k <= 1) return 1;
  const m = argmax(p);
  let spread = 0;
  let uniform = 0;
  for (let i = 0; i < k; i++) {
    spread += p[i]! * Math.abs(i - m);
    uniform += Math.abs(i - (k - 1) / 2) / k;
  }
  return Math.min(1, Math.max(0, 1 - spread / uniform));
}

/**
 * The key of a section that applies to a `type` question of `k` options: `type:k` where the section has
 * it; else the regime key `type:>N` with the largest N below k (a question with more options than the
 * debiasing shows in every order is read another way: once, then shortlisted), with its value even
 * where it says identity, so that a many-option question never takes the few-option regime's map;
 * else `type:*`.
 */
function keyFor(section: Record<string, unknown> | undefined, type: string, k: number): string | undefined {
  if (!section) return undefined;
  const exact = `${type}:${k}`;
  if (exact in section) return exact;
  let best: string | undefined;
  let bestN = -1;
  for (const key of Object.keys(section)) {
    const m = /^([a-z]+):>(\d+)$/.exec(key);
    if (!m || m[1] !== type) continue;
    const n = Number(m[2]);
    if (k > n && n > bestN) {
      best = key;
      bestN = n;
    }
  }
  if (best) return best;
  return `${type}:*` in section ? `${type}:*` : undefined;
}

export function temperatureFor(fit: CalibrationMaps | null | undefined, type: string, k: number): number {
  const key = keyFor(fit?.temperatures, type, k);
  return key ? fit!.temperatures![key]! : 1;
}

/** The top-label map for a choice/score question, keyed as the temperature (`keyFor`); a regime's key without one means none. */
export function topLabelFor(fit: CalibrationMaps | null | undefined, type: string, k: number): Platt | undefined {
  const regime = keyFor(fit?.temperatures, type, k);
  const key = keyFor(fit?.top_label, type, k);
  // A regime whose temperature is listed but whose top-label map is not takes none (not the other regime's).
  if (regime && regime.includes(">") && key !== regime) return undefined;
  return key ? fit!.top_label![key] : undefined;
}

/**
 * Probabilities of a choice/score question's labels: softmax(lp / T), then,
 * given a top-label map, the predicted option's probability set from the
 * model's own confidence c = softmax(lp)[m] as σ(a·logit(c) + b). The other
 * options keep their tempered proportions. The new value is floored just
 * above where the runner-up would catch up (p_m > q₂·(1 − p_m)/(1 − q_m)):
 * an exact tie would hand the answer to whichever option is listed first, and
 * the map must change how sure the answer is, never the answer.
 */
export function labelProbabilities(lp: readonly number[], t: number, map: Platt | undefined): number[] {
  const q = softmax(lp, t);
  if (!map || q.length < 2) return q;
  const m = argmax(lp);
  // softmax(lp)[m] without a second vector: 1 / Σ exp(lp_i − lp_m).
  let z = 0;
  for (const x of lp) z += Math.exp(x - lp[m]!);
  const c = 1 / z;
  const rest = 1 - q[m]!;
  if (!(c > 0 && c < 1) || !(rest > 0)) return q;
  return withTop(q, m, sigmoid(map.a * logit(c) + map.b));
}

/**
 * `q` (a distribution) with its option m set to `top` and the others sharing
 * the rest in their proportions. `top` is floored just above where the
 * runner-up would catch up (p_m > q₂·(1 − p_m)/(1 − q_m)): an exact tie would
 * hand the answer to whichever option is listed first, and a map must change
 * how sure the answer is, never the answer.
 */
export function withTop(q: readonly number[], m: number, top: number): number[] {
  const rest = 1 - q[m]!;
  if (!(rest > 0) || !Number.isFinite(top)) return [...q];
  let second = 0;
  for (let i = 0; i < q.length; i++) if (i !== m && q[i]! > second) second = q[i]!;
  const floor = (second / (rest + second)) * (1 + 1e-9);
  const p = Math.max(top, floor);
  return q.map((x, i) => (i === m ? p : (x * (1 - p)) / rest));
}

/**
 * `q` with every option other than m weighted by exp(−λ·|i − m|) and the whole
 * renormalised: on an ordered scale, the levels near the chosen one keep more
 * of the rest. m stays the argmax (no weight exceeds its own, 1).
 */
export function nearChosen(q: readonly number[], m: number, lambda: number): number[] {
  if (!(lambda > 0)) return [...q];
  const w = q.map((x, i) => x * Math.exp(-lambda * Math.abs(i - m)));
  const z = w.reduce((s, x) => s + x, 0);
  return z > 0 ? w.map((x) => x / z) : [...q];
}

/**
 * A choice/score question's probabilities under a confidence map: softmax(lp / T),
 * its argmax's probability set by the map; for score, the other levels lean
 * toward it by the map's spread.
 */
export function mappedProbabilities(lp: readonly number[], t: number, map: ConfidenceMap, reading: QuestionReading, type: "choice" | "score" = "choice"): number[] {
  const q = softmax(lp, t);
  if (q.length < 2) return q;
  const m = argmax(lp);
  const base = type === "score" && map.spread ? nearChosen(q, m, map.spread) : q;
  return withTop(base, m, applyConfidenceMap(map, featuresFor(type, reading)));
}

/**
 * The maps that apply when answers are read under `debias`: a fit records
 * the debias mode its choice/score temperatures were fitted under, and
 * averaged readings are flatter than single ones, so those temperatures,
 * top-label and confidence maps are dropped (identity) under another mode.
 * noul maps do not depend on it.
 */
export function calibrationForMode(fit: CalibrationFit | null | undefined, debias: string): CalibrationFit | null {
  if (!fit) return null;
  if (fit.debias === undefined || fit.debias === debias) return fit;
  const temperatures: Record<string, number> = {};
  for (const [k, t] of Object.entries(fit.temperatures)) if (k.startsWith("noul:")) temperatures[k] = t;
  // A confidence map reads the presentations' agreement: a choice or score map fitted on every order does not apply to one.
  const confidence = fit.confidence?.noul ? { noul: fit.confidence.noul } : undefined;
  const questions = Object.fromEntries(Object.entries(fit.questions ?? {}).filter(([, q]) => q.type === "noul"));
  const { confidence: _dropped, questions: _alsoDropped, ...rest } = fit;
  return { ...rest, temperatures, top_label: {}, ...(confidence ? { confidence } : {}), ...(Object.keys(questions).length > 0 ? { questions } : {}) };
}

/** labels are [yes, no]; without a fit (or with a temperature only) this is softmax(lp / T)[yes]. */
export function noulAnswer(lp: readonly number[], fit?: CalibrationMaps | null, key = "noul:2"): NoulAnswer {
  const z = lp[0]! - lp[1]!;
  if (Number.isNaN(z)) return { type: "noul", noul: softmax(lp)[0]! };
  return { type: "noul", noul: calibrateNoul(z, fit, key) };
}

export function choiceAnswer(keys: readonly string[], lp: readonly number[], t = 1, top?: Platt): ChoiceAnswer {
  return choiceFrom(keys, labelProbabilities(lp, t, top));
}

function choiceFrom(keys: readonly string[], p: readonly number[]): ChoiceAnswer {
  const probabilities: Record<string, number> = {};
  keys.forEach((k, i) => (probabilities[k] = p[i]!));
  return { type: "choice", choice: keys[argmax(p)]!, probabilities, confidence: choiceConfidence(p) };
}

export function scoreAnswer(levels: readonly string[], lp: readonly number[], t = 1, top?: Platt): ScoreAnswer {
  return scoreFrom(levels, labelProbabilities(lp, t, top));
}

function scoreFrom(levels: readonly string[], p: readonly number[]): ScoreAnswer {
  const probabilities: Record<string, number> = {};
  const legend: Record<string, string> = {};
  let score = 0;
  p.forEach((pi, i) => {
    probabilities[String(i)] = pi;
    legend[String(i)] = levels[i]!;
    score += i * pi;
  });
  return { type: "score", score, legend, probabilities, confidence: scoreConfidence(p) };
}

export interface QuestionReadout {
  type: "noul" | "choice" | "score";
  keys: readonly string[];
  /** Level texts for score questions. */
  levels?: readonly string[];
  /** `questionKey` of the question, where the fit has maps for single questions. */
  key?: string | undefined;
}

/**
 * The answer to a question from what the engine read for it. A question with
 * a map of its own (question-maps.ts) is answered through that; a type with a
 * confidence map (confidence.ts) through it; otherwise through
 * its temperature, top-label and Platt maps. A question with more options
 * than the debiasing shows in every order (read once, then shortlisted) keeps
 * its own regime's maps: no confidence map was fitted on that readout.
 */
export function answer(
  q: QuestionReadout,
  read: QuestionReading | readonly number[],
  fit: (CalibrationMaps & { confidence?: ConfidenceMaps | undefined; questions?: Record<string, QuestionMap> | undefined }) | null | undefined,
): Answer {
  const reading = "lp" in read ? read : singleReading(read);
  const lp = reading.lp;
  const t = temperatureFor(fit, q.type, lp.length);
  const own = q.key === undefined ? undefined : fit?.questions?.[q.key];
  const map = reading.shortlisted ? undefined : own?.type === q.type ? own.map : fit?.confidence?.[q.type];
  switch (q.type) {
    case "noul":
      if (map) return { type: "noul", noul: applyConfidenceMap(map, featuresFor("noul", reading)) };
      return noulAnswer(lp, fit);
    case "choice":
      if (map) return choiceFrom(q.keys, mappedProbabilities(lp, t, map, reading));
      return choiceAnswer(q.keys, lp, t, topLabelFor(fit, q.type, lp.length));
    case "score":
      if (map) return scoreFrom(q.levels ?? q.keys, mappedProbabilities(lp, t, map, reading, "score"));
      return scoreAnswer(q.levels ?? q.keys, lp, t, topLabelFor(fit, q.type, lp.length));
  }
}
