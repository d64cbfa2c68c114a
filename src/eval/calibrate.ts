/**
 * Fitting calibration maps from evaluated dev sets, and K-fold
 * cross-validated ECE before and after. Pure functions over readouts taken
 * with identity calibration (see `assay calibrate`).
 *
 * Keys follow `temperatureFor`: a map per `type:k` present in the data, and
 * a `type:*` fallback fitted on every item of that type, for option counts
 * the dev sets do not have. Choice has two readout regimes: up to
 * MANY_OPTIONS options a question is read in every order; above it, once and
 * then shortlisted. `choice:*` is fitted on the first regime only and
 * `choice:>N` on the second, since a map fitted on one regime's readings
 * does not hold on the other's (docs/experiments/answer-quality.md). noul gets
 * Platt scaling, choice and score a temperature and a top-label map
 * (src/probability/calibration.ts says why).
 */
import type { CalibrationMaps, Platt, QuestionReading } from "../probability/index.js";
import { calibrateNoul, labelProbabilities, questionKey, softmax, temperatureFor, topLabelFor } from "../probability/index.js";
import { balancedWeights, fitPlatt, fitTemperature, fitTopLabel } from "./fitting.js";
import { argmaxIndex, auroc, reliability, mean } from "./metrics.js";
import type { DatasetRun } from "./runner.js";
import { readDataset, type TaskType } from "./datasets.js";

/** One answered item as the fit sees it: label log-probabilities (identity calibration) and the gold label's index. */
export interface FitItem {
  dataset: string;
  type: TaskType;
  /** noul: [yes, no]; choice: options in dataset order; score: levels low → high. */
  lp: number[];
  gold: number;
  /** What the engine read (in the same option order), where the run recorded it: what the confidence maps fit on. */
  reading?: QuestionReading;
  /** `questionKey` of the question asked: what a map for single questions is filed under. */
  question?: string;
}

/** Label log-probabilities below this are floored (an underflowed probability reads as null). */
const FLOOR = -1000;

/** Items of evaluated runs (main pass, identity calibration) for fitting. */
export function fitItems(runs: readonly DatasetRun[]): FitItem[] {
  const out: FitItem[] = [];
  for (const run of runs) {
    const ds = run.dataset;
    run.dataset.items.forEach((it, i) => {
      const r = run.items[i]!;
      if (!r.main) return;
      const lp = r.main.labelLogprobs.map((x) => x ?? FLOOR);
      let gold: number;
      switch (it.type) {
        case "noul":
          gold = it.gold ? 0 : 1;
          break;
        case "choice":
          gold = it.options.indexOf(it.gold);
          break;
        case "score":
          gold = it.gold;
          break;
      }
      out.push({ dataset: ds.name, type: ds.task, lp, gold, question: questionKey(it.question), ...(r.main.reading ? { reading: r.main.reading } : {}) });
    });
  }
  return out;
}

/**
 * Fit items from an `assay eval` results.json taken with `--calibration none`
 * (its main-pass label log-probabilities are the model's own), so that a fit
 * can reuse an evaluation's pass instead of running the model again. The
 * dataset files are read again for the choice options.
 */
export function fitItemsFromResults(results: {
  calibration: string;
  datasets: { summary: { dataset: string; file: string; task: TaskType }; items: { id: string; gold: boolean | string | number; main: { labelLogprobs: (number | null)[] } | null }[] }[];
}): FitItem[] {
  if (!results.calibration.startsWith("none")) {
    throw new Error(`results were taken with calibration "${results.calibration}"; fit on a run with --calibration none`);
  }
  const out: FitItem[] = [];
  for (const d of results.datasets) {
    const byId = new Map(readDataset(d.summary.file).items.map((it) => [it.id, it]));
    for (const r of d.items) {
      if (!r.main) continue;
      const it = byId.get(r.id);
      if (!it) throw new Error(`${d.summary.file}: no item "${r.id}" (the results are from another version of the file)`);
      const lp = r.main.labelLogprobs.map((x) => x ?? FLOOR);
      const gold = it.type === "noul" ? (it.gold ? 0 : 1) : it.type === "choice" ? it.options.indexOf(it.gold) : it.gold;
      out.push({ dataset: d.summary.dataset, type: d.summary.task, lp, gold });
    }
  }
  return out;
}

const keyOf = (it: FitItem) => `${it.type}:${it.lp.length}`;

/**
 * Above this many options a choice question is read in one presentation (ASSAY_DEBIAS_MAX_SHIFTS,
 * default 8) and shortlisted: the second regime, keyed `choice:>8`.
 */
export const MANY_OPTIONS = 8;
export const MANY_KEY = `choice:>${MANY_OPTIONS}`;

/** The pooled key of a key's readout regime (`choice:77` → `choice:>8`, `choice:4` → `choice:*`, `noul:2` → `noul:*`). */
export function regimeOfKey(key: string): string {
  const [type, k] = key.split(":") as [string, string];
  return key === MANY_KEY || (type === "choice" && Number(k) > MANY_OPTIONS) ? MANY_KEY : `${type}:*`;
}

/** The pooled key of an item's readout regime. */
export const regimeKey = (it: FitItem): string => regimeOfKey(keyOf(it));

export interface FittedMaps {
  temperatures: Record<string, number>;
  platt: Record<string, Platt>;
  top_label: Record<string, Platt>;
}

/** The model's own probability of its predicted option, and whether that option is gold. */
function ownConfidence(it: FitItem): { confidence: number; correct: boolean } {
  const p = softmax(it.lp);
  const m = argmaxIndex(p);
  return { confidence: p[m]!, correct: m === it.gold };
}

/** Fits every map the items support: per `type:k`, plus `type:*` for choice and score. */
export function fitMaps(items: readonly FitItem[]): FittedMaps {
  const maps: FittedMaps = { temperatures: {}, platt: {}, top_label: {} };
  const fitGroup = (key: string, group: readonly FitItem[]) => {
    if (group[0]!.type === "noul") {
      // Each set's two classes weigh the same: the intercept must carry the
      // model's lean, not the label mix of the dev sets pooled (WiCE is two
      // thirds "no"; a user's questions have no such base rate).
      const w = balancedWeights(group.map((it) => ({ set: it.dataset, y: it.gold === 0 })));
      maps.platt[key] = fitPlatt(group.map((it, i) => ({ z: it.lp[0]! - it.lp[1]!, y: it.gold === 0, w: w[i]! })));
      return;
    }
    maps.temperatures[key] = fitTemperature(group);
    maps.top_label[key] = fitTopLabel(group.map(ownConfidence));
  };
  const byKey = new Map<string, FitItem[]>();
  for (const it of items) byKey.set(keyOf(it), [...(byKey.get(keyOf(it)) ?? []), it]);
  for (const [key, group] of [...byKey].sort(([a], [b]) => (a < b ? -1 : 1))) fitGroup(key, group);
  for (const key of ["choice:*", MANY_KEY, "score:*"]) {
    const all = items.filter((it) => it.type !== "noul" && regimeKey(it) === key);
    if (all.length > 0) fitGroup(key, all);
  }
  return maps;
}

/**
 * The maps `assay calibrate` ships: one per type, fitted on every set of the
 * type pooled. A key fitted on one set alone (`choice:4` from AG News) is
 * that set's k-fold figure again, which did not hold on unseen rows; keys
 * whose data spans several sets (`score:5`, `noul:2`) stay, and
 * leave-one-dataset-out tests them. Cross-validation fits with this too, so
 * its figures are those of what ships.
 */
export function fitShippedMaps(items: readonly FitItem[]): FittedMaps {
  const maps = fitMaps(items);
  const setsOf = (key: string) => new Set(items.filter((it) => keyOf(it) === key).map((it) => it.dataset));
  for (const section of [maps.temperatures, maps.platt, maps.top_label] as Record<string, unknown>[]) {
    for (const key of Object.keys(section)) if (!key.endsWith(":*") && key !== MANY_KEY && setsOf(key).size < 2) delete section[key];
  }
  return maps;
}

/** Probabilities of an item's labels under the maps (identity when `maps` is null). */
export function applyMaps(it: FitItem, maps: CalibrationMaps | null): number[] {
  if (it.type === "noul") {
    const p = calibrateNoul(it.lp[0]! - it.lp[1]!, maps, keyOf(it));
    return [p, 1 - p];
  }
  const k = it.lp.length;
  return labelProbabilities(it.lp, temperatureFor(maps, it.type, k), topLabelFor(maps, it.type, k));
}

export interface CalibrationScore {
  n: number;
  accuracy: number | null;
  /** 15 equal-width bins over the predicted class's probability. */
  ece: number | null;
  /** Mean negative log-likelihood of the gold label. */
  nll: number | null;
  /** noul only: the mean of the two classes' recall at 0.5 (the sets' label mixes differ), and AUROC of p(yes). */
  balancedAccuracy?: number | null;
  auroc?: number | null;
}

/** ECE, accuracy and NLL of probability vectors against gold indices (noul: class = p(yes) > 0.5, as in eval). */
export function scoreProbabilities(type: TaskType, probs: readonly number[][], gold: readonly number[], nBins = 15): CalibrationScore {
  const conf: number[] = [];
  const correct: boolean[] = [];
  const nll: number[] = [];
  probs.forEach((p, i) => {
    const pred = type === "noul" ? (p[0]! > 0.5 ? 0 : 1) : argmaxIndex(p);
    conf.push(p[pred]!);
    correct.push(pred === gold[i]);
    nll.push(-Math.log(Math.max(p[gold[i]!]!, 1e-300)));
  });
  const out: CalibrationScore = {
    n: probs.length,
    accuracy: mean(correct.map((c) => (c ? 1 : 0))),
    ece: reliability(conf, correct, nBins).ece,
    nll: mean(nll),
  };
  if (type !== "noul") return out;
  const recall = (cls: number) => mean(probs.flatMap((p, i) => (gold[i] === cls ? [(p[0]! > 0.5 ? 0 : 1) === cls ? 1 : 0] : [])));
  const r0 = recall(0);
  const r1 = recall(1);
  return {
    ...out,
    balancedAccuracy: r0 === null || r1 === null ? null : (r0 + r1) / 2,
    auroc: auroc(probs.map((p) => p[0]!), gold.map((g) => g === 0)),
  };
}

export interface CrossValidation {
  dataset: string;
  type: TaskType;
  key: string;
  before: CalibrationScore;
  /** Out-of-fold: each item scored by maps fitted on the other folds (temperature and top-label map; noul: Platt). */
  after: CalibrationScore;
  /** Out-of-fold with the temperature alone (noul: the same as `after`). */
  afterTemperature: CalibrationScore;
  /**
   * The ECE that a perfectly calibrated model with the same (out-of-fold)
   * confidences would show on this many items, from sampling alone: the
   * floor under which a measured ECE means nothing at this n. For `after`,
   * and for `afterTemperature`.
   */
  floor: number | null;
  floorTemperature: number | null;
}

/** A fixed-seed PRNG (mulberry32) in [0, 1): figures drawn with it are the same on every run. */
export function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** Mean ECE over `draws` outcome sets drawn as Bernoulli(confidence): what a calibrated model scores at this n. */
export function eceFloor(confidence: readonly number[], draws = 400, nBins = 15): number | null {
  if (confidence.length === 0) return null;
  const rand = mulberry32(0x9e3779b9);
  let sum = 0;
  for (let d = 0; d < draws; d++) sum += reliability(confidence, confidence.map((c) => rand() < c), nBins).ece ?? 0;
  return sum / draws;
}

/** The predicted class's probability, as ECE reads it. */
function predictedConfidence(type: TaskType, p: readonly number[]): number {
  return type === "noul" ? Math.max(p[0]!, 1 - p[0]!) : Math.max(...p);
}

/** One set's held-out figures: before (identity), after the maps, after the temperature alone, and their floors. */
function heldOutRow(dataset: string, mine: readonly FitItem[], after: number[][], afterTemperature: number[][]): CrossValidation {
  const type = mine[0]!.type;
  const gold = mine.map((it) => it.gold);
  return {
    dataset,
    type,
    key: keyOf(mine[0]!),
    before: scoreProbabilities(type, mine.map((it) => applyMaps(it, null)), gold),
    after: scoreProbabilities(type, after, gold),
    afterTemperature: scoreProbabilities(type, afterTemperature, gold),
    floor: eceFloor(after.map((p) => predictedConfidence(type, p))),
    floorTemperature: eceFloor(afterTemperature.map((p) => predictedConfidence(type, p))),
  };
}

/**
 * K-fold cross-validation: items are dealt to folds round-robin within each
 * dataset (the sets are sorted by label, so folds stay balanced); each fold
 * is scored with the maps that would ship (fitShippedMaps) fitted on all the
 * other folds of every dataset.
 */
export function crossValidate(items: readonly FitItem[], folds = 5): CrossValidation[] {
  const fold = new Map<FitItem, number>();
  const seen = new Map<string, number>();
  for (const it of items) {
    const n = seen.get(it.dataset) ?? 0;
    fold.set(it, n % folds);
    seen.set(it.dataset, n + 1);
  }
  const oof = new Map<FitItem, number[]>();
  const oofTemperature = new Map<FitItem, number[]>();
  for (let f = 0; f < folds; f++) {
    const train = items.filter((it) => fold.get(it) !== f);
    const test = items.filter((it) => fold.get(it) === f);
    if (test.length === 0) continue;
    const maps = fitShippedMaps(train);
    const temperatureOnly = { ...maps, top_label: {} };
    for (const it of test) {
      oof.set(it, applyMaps(it, maps));
      oofTemperature.set(it, applyMaps(it, temperatureOnly));
    }
  }
  const out: CrossValidation[] = [];
  for (const ds of seen.keys()) {
    const mine = items.filter((it) => it.dataset === ds);
    out.push(heldOutRow(ds, mine, mine.map((it) => oof.get(it)!), mine.map((it) => oofTemperature.get(it)!)));
  }
  return out;
}

/** The cross-validation table printed by `assay calibrate`. */
export function crossValidationTable(rows: readonly CrossValidation[], folds: number): string {
  const f = (x: number | null) => (x === null ? "–" : x.toFixed(3));
  const lines = [
    `| dataset | key | n | accuracy | ECE before | ECE after, temperature / Platt (${folds}-fold) | its floor | ECE after, + top-label map (${folds}-fold) | its floor | NLL before | NLL after, temperature | NLL after, + top-label | noul: bal. acc after | noul: AUROC |`,
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ...rows.map((r) => {
      const top = r.type === "noul";
      return (
        `| ${r.dataset} | ${r.key} | ${r.before.n} | ${f(r.before.accuracy)} | ${f(r.before.ece)} | ${f(r.afterTemperature.ece)} | ${f(r.floorTemperature)} | ` +
        `${top ? "–" : f(r.after.ece)} | ${top ? "–" : f(r.floor)} | ${f(r.before.nll)} | ${f(r.afterTemperature.nll)} | ${top ? "–" : f(r.after.nll)} | ` +
        `${top ? f(r.afterTemperature.balancedAccuracy ?? null) : "–"} | ${top ? f(r.afterTemperature.auroc ?? null) : "–"} |`
      );
    }),
  ];
  return lines.join("\n") + "\n";
}

/**
 * Leave-one-dataset-out: each dataset is scored with maps fitted on the
 * other datasets of its type only (pooled), the test that k-fold within one
 * set fails — its folds share the set's source, wording and label balance,
 * and unseen rows of a new source do not. Datasets alone in their type are
 * not scored.
 */
export function leaveOneDatasetOut(items: readonly FitItem[]): CrossValidation[] {
  const out: CrossValidation[] = [];
  const sets = [...new Set(items.map((it) => it.dataset))];
  for (const ds of sets) {
    const mine = items.filter((it) => it.dataset === ds);
    const type = mine[0]!.type;
    const train = items.filter((it) => it.dataset !== ds && it.type === type);
    if (train.length === 0) continue;
    // Keys by option count would fit the held set's own count only when another set shares it; the pooled map covers the rest.
    const maps = fitShippedMaps(train);
    const temperatureOnly = { ...maps, top_label: {} };
    out.push(heldOutRow(ds, mine, mine.map((it) => applyMaps(it, maps)), mine.map((it) => applyMaps(it, temperatureOnly))));
  }
  return out;
}
