/**
 * The readout study's analysis: cached reads (study.ts) → per-variant option
 * scores → accuracy, macro-F1, AUROC, MAE, ECE raw, k-fold and
 * leave-one-dataset-out. Pure functions, no model.
 */
import { accuracy, argmaxIndex, auroc, macroF1, mean, meanAbsoluteError, reliability } from "./metrics.js";
import { sigmoid, type Platt } from "../probability/calibration.js";
import { fitPlatt, fitTemperature, fitTopLabel } from "./fitting.js";
import { labelProbabilities, softmax } from "../probability/index.js";

const logNormalise = (xs: readonly number[]) => {
  const m = Math.max(...xs);
  const z = m + Math.log(xs.reduce((a, x) => a + Math.exp(x - m), 0));
  return xs.map((x) => x - z);
};
import type { Branch, StudyRow } from "./study.js";

/** How a multi-token label's log-probability is formed from its tokens. */
export type LabelMode = "sum" | "mean" | "first";

export interface Readout {
  /** Variant name (a branch `v`). */
  v: string;
  mode: LabelMode;
  /** Weight of the content-free prior subtracted (0 = none). */
  cf: number;
  /** Which neutral state's reads make the prior. */
  neutral: string;
  /** noul: the prior's weight for a question written as a question (`cf` then weighs statements only). */
  cfQuestion?: number;
}

const lse = (xs: readonly number[]) => {
  const m = Math.max(...xs);
  return m === -Infinity ? -Infinity : m + Math.log(xs.reduce((s, x) => s + Math.exp(x - m), 0));
};

function labelLp(lps: readonly number[], mode: LabelMode): number {
  if (mode === "first") return lps[0]!;
  const s = lps.reduce((a, b) => a + b, 0);
  return mode === "mean" ? s / lps.length : s;
}

/** Normalised option log-probabilities of one label-reading branch. */
function branchOptionLp(b: Branch, k: number, mode: LabelMode): number[] {
  const per: number[][] = Array.from({ length: k }, () => []);
  b.lps.forEach((l, i) => per[b.option[i]!]!.push(labelLp(l, mode)));
  const raw = per.map((xs) => (xs.length ? lse(xs) : -Infinity));
  const z = lse(raw);
  return raw.map((x) => x - z);
}

/** Yes-vs-no log-odds of a yes/no branch (labels: yes, Yes, no, No). */
function logOdds(b: Branch): number {
  const yes = lse(b.lps.filter((_, i) => b.option[i] === 0).map((l) => labelLp(l, "sum")));
  const no = lse(b.lps.filter((_, i) => b.option[i] === 1).map((l) => labelLp(l, "sum")));
  return yes - no;
}

/**
 * Option scores (log-space, comparable within the item) of one variant:
 * - label-reading variants: the geometric mean over presentations of the normalised reads;
 * - per-option yes/no variants (`t` set): each option's yes-vs-no log-odds;
 * - `upper`/`atleast` (score): a distribution over levels built from the yes/no reads;
 * - a noul yes/no read: [log-odds, 0] so that softmax gives (p, 1 − p).
 */
export function optionScores(branches: readonly Branch[], v: string, k: number, mode: LabelMode): number[] | null {
  if (v.includes("+")) {
    // An ensemble: the mean of its parts' normalised scores (a product of experts).
    const parts = v.split("+").map((p) => optionScores(branches, p, k, mode));
    if (parts.some((p) => p === null)) return null;
    const norm = parts.map((p) => logNormalise(p!.length === 2 && k === 2 ? [p![0]!, p![1]!] : p!));
    return Array.from({ length: k }, (_, i) => mean(norm.map((p) => p[i]!))!);
  }
  const mine = branches.filter((b) => b.v === v);
  if (mine.length === 0) return null;
  if (v === "upper") {
    const z = logOdds(mine[0]!);
    // Levels weighted towards the upper or the lower end, linearly: a polarity read on its own.
    const p = sigmoid(z);
    return Array.from({ length: k }, (_, i) => Math.log(Math.max(1e-9, (i / (k - 1)) * p + (1 - i / (k - 1)) * (1 - p))));
  }
  if (v === "atleast") {
    // P(level ≥ i) for i = 1..k-1, made monotone, differenced into level probabilities.
    const ge = [1, ...Array.from({ length: k - 1 }, (_, j) => sigmoid(logOdds(mine.find((b) => b.t === j + 1)!)))];
    for (let i = 1; i < k; i++) ge[i] = Math.min(ge[i]!, ge[i - 1]!);
    return ge.map((g, i) => Math.log(Math.max(1e-9, g - (ge[i + 1] ?? 0))));
  }
  if (mine[0]!.t !== undefined) {
    const out = new Array<number>(k).fill(-Infinity);
    for (const b of mine) out[b.t!] = logOdds(b);
    return out;
  }
  if (k === 2 && mine[0]!.option.length === 4) return [logOdds(mine[0]!), 0];
  const reads = mine.map((b) => branchOptionLp(b, k, mode));
  return Array.from({ length: k }, (_, o) => mean(reads.map((r) => r[o]!))!);
}

/** Scores of one row under a readout, with the content-free prior subtracted when asked. */
export function rowScores(row: StudyRow, r: Readout): number[] | null {
  const s = optionScores(row.branches, r.v, row.k, r.mode);
  const w = r.cfQuestion !== undefined && row.statement === false ? r.cfQuestion : r.cf;
  if (!s || w === 0) return s;
  const c = optionScores(row.cf[r.neutral] ?? [], r.v, row.k, r.mode);
  if (!c) return null;
  return s.map((x, i) => x - w * c[i]!);
}

export interface Scored {
  /** Per row: option scores (log-space). */
  scores: number[][];
  gold: number[];
}

export function score(rows: readonly StudyRow[], r: Readout): Scored | null {
  const scores: number[][] = [];
  const gold: number[] = [];
  for (const row of rows) {
    const s = rowScores(row, r);
    if (!s) return null;
    scores.push(s);
    gold.push(row.gold);
  }
  return { scores, gold };
}

/** A calibration map fitted on some rows and applied to others: temperature (choice/score) or Platt (noul). */
export interface Map1 {
  kind: "temperature" | "platt";
  t?: number;
  /** Top-label map on the predicted option's own probability (choice/score), after the temperature. */
  top?: Platt;
  a?: number;
  b?: number;
}

const isBinary = (s: Scored) => s.scores[0]!.length === 2;

export function fitMap(s: Scored): Map1 {
  if (isBinary(s)) {
    const p = fitPlatt(s.scores.map((x, i) => ({ z: x[0]! - x[1]!, y: s.gold[i] === 0 })));
    return { kind: "platt", a: p.a, b: p.b };
  }
  const lps = s.scores.map((x) => logNormalise(x));
  const t = fitTemperature(lps.map((lp, i) => ({ lp, gold: s.gold[i]! })));
  const top = fitTopLabel(lps.map((lp, i) => {
    const m = argmaxIndex(lp);
    return { confidence: Math.exp(lp[m]!), correct: m === s.gold[i] };
  }));
  return { kind: "temperature", t, top };
}

export function probs(s: Scored, m: Map1 | null): number[][] {
  return s.scores.map((x) => {
    if (x.length === 2) {
      const z = x[0]! - x[1]!;
      const p = m?.kind === "platt" ? sigmoid(m.a! * z + m.b!) : sigmoid(z);
      return [p, 1 - p];
    }
    return m?.kind === "temperature" ? labelProbabilities(logNormalise(x), m.t!, m.top) : softmax(x, 1);
  });
}

export interface Metrics {
  n: number;
  accuracy: number;
  /** Mean recall per gold class (= accuracy on a balanced set; the fact check figure). */
  bacc: number;
  macroF1: number;
  /** noul: AUROC of p(true); others null. */
  auroc: number | null;
  /** score: MAE of the expected level. */
  mae: number | null;
  ece: number;
}

export function metrics(p: readonly number[][], gold: readonly number[], ordinal = false): Metrics {
  const pred = p.map((x) => argmaxIndex(x));
  const conf = p.map((x, i) => x[pred[i]!]!);
  const correct = pred.map((x, i) => x === gold[i]);
  const k = p[0]!.length;
  const classes = [...new Set(gold)];
  const bacc = mean(classes.map((c) => accuracy(correct.filter((_, i) => gold[i] === c))!))!;
  return {
    n: p.length,
    accuracy: accuracy(correct)!,
    bacc,
    macroF1: macroF1(gold.map(String), pred.map(String))!,
    auroc: k === 2 ? auroc(p.map((x) => x[0]!), gold.map((g) => g === 0)) : null,
    mae: ordinal ? meanAbsoluteError(gold, p.map((x) => x.reduce((s, pi, i) => s + i * pi, 0))) : null,
    ece: reliability(conf, correct).ece!,
  };
}

/** Out-of-fold probabilities: the map fitted on the other folds (rows i mod folds). */
export function kfold(s: Scored, folds = 5): number[][] {
  const out: number[][] = new Array(s.scores.length);
  for (let f = 0; f < folds; f++) {
    const trainIdx = s.scores.map((_, i) => i).filter((i) => i % folds !== f);
    const testIdx = s.scores.map((_, i) => i).filter((i) => i % folds === f);
    const m = fitMap({ scores: trainIdx.map((i) => s.scores[i]!), gold: trainIdx.map((i) => s.gold[i]!) });
    const p = probs({ scores: testIdx.map((i) => s.scores[i]!), gold: testIdx.map((i) => s.gold[i]!) }, m);
    testIdx.forEach((i, j) => (out[i] = p[j]!));
  }
  return out;
}

/** Every readout worth reporting for a row set: each variant × label mode × prior weight. */
export function readouts(rows: readonly StudyRow[]): Readout[] {
  const have = new Set(rows[0]?.branches.map((b) => b.v) ?? []);
  const combos = ["question+question_ctx", "question+true_false", "question_ctx+auto", "names+upper", "names_cased+upper", "names+numbers", "names_cased+numbers", "numbers+yesno", "keys+numbers", "fc+fc_q", "numbers+readable", "question_ctx+yn_num", "question_ctx+auto_num", "auto+auto_num", "question_ctx+auto+auto_num", "question_ctx+auto_flip", "question_ctx+ctx_flip", "auto+auto_flip", "question_ctx+auto+auto_flip", "auto_sup+auto", "auto_says+auto", "auto_agree+auto", "question_ctx+auto+auto_sup", "question_ctx+auto+auto_says", "question_ctx+auto+auto_agree", "auto_sup+auto_says+auto_agree", "auto_sup+auto_says+auto_agree+auto"];
  const vs = [...have, ...combos.filter((c) => c.split("+").every((p) => have.has(p)))];
  const out: Readout[] = [];
  for (const v of vs) {
    const multi = rows[0]!.k > 2 && !["upper", "atleast", "yesno", "yesno_list", "numbers"].includes(v);
    const modes: LabelMode[] = multi ? ["sum", "mean", "first"] : ["sum"];
    const hasCf = v.split("+").every((p) => rows[0]!.cf["N/A"]?.some((b) => b.v === p) ?? false);
    for (const mode of modes) {
      out.push({ v, mode, cf: 0, neutral: "N/A" });
      if (hasCf) {
        for (const neutral of ["N/A", ""]) {
          out.push({ v, mode, cf: 1, neutral });
          out.push({ v, mode, cf: 0.5, neutral });
        }
        // The served noul readout with the prior weighed apart for questions (statements keep weight 1).
        if (v === "question_ctx+auto" && rows.every((row) => row.statement !== undefined)) {
          for (const q of [0, 0.25, 0.5]) out.push({ v, mode, cf: 1, neutral: "", cfQuestion: q });
        }
      }
    }
  }
  return out;
}

export const readoutName = (r: Readout) =>
  `${r.v}${r.mode === "sum" ? "" : `/${r.mode}`}${r.cf === 0 ? "" : ` −${r.cf}·cf(${r.neutral === "" ? "empty" : r.neutral})`}${r.cfQuestion === undefined ? "" : `, questions −${r.cfQuestion}`}`;
