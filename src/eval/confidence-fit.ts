/**
 * Fitting and judging the confidence maps (src/probability/confidence.ts):
 * per question type, a logistic model over features of the readings, fitted
 * with every set weighing the same (a set of 300 rows must not outvote a new
 * kind of question of 100) and judged leave-one-dataset-out, the test of
 * whether it carries to a kind of question it never saw.
 */
import type { CalibrationMaps, ConfidenceMap, QuestionReading } from "../probability/index.js";
import { answer, applyConfidenceMap, featuresFor, withTop } from "../probability/index.js";
import type { FitItem } from "./calibrate.js";
import { eceFloor } from "./calibrate.js";
import { newtonLogistic } from "./fitting.js";
import { argmaxIndex, mean, reliability } from "./metrics.js";

export type MapType = "noul" | "choice" | "score";

/**
 * Candidate feature sets per type, from the one-feature map that a Platt or
 * top-label map amounts to, up to every feature. Which one ships is decided by
 * the pooled leave-one-dataset-out ECE.
 */
export const CANDIDATES: Record<MapType, string[][]> = {
  noul: [["z"], ["raw", "prior"], ["raw", "prior", "agree"], ["z", "raw", "agree"]],
  choice: [["top"], ["top", "agree"], ["top", "agree", "margin", "mean"], ["top", "agree", "mean", "raw", "pull"], ["top", "agree", "margin", "spread", "mean", "raw", "pull", "logk"]],
  // score also tries agreement alone: the chosen level's own log-odds sits on a scale of its readout
  // (named levels read by name and by position, described ones by number), which agreement does not.
  score: [["agree"], ["top"], ["top", "agree"], ["top", "agree", "margin", "mean"], ["top", "agree", "mean", "raw", "pull"], ["top", "agree", "margin", "spread", "mean", "raw", "pull", "logk"]],
};

/** One question as the confidence fit sees it. */
export interface ConfidenceItem {
  dataset: string;
  type: MapType;
  features: Record<string, number>;
  /** noul: the gold answer is "true"; choice/score: the chosen option is gold. */
  y: boolean;
  /** noul: the gold answer (for the accuracy of p > 0.5); choice/score: the same as y. */
  gold: boolean;
}

/** The items a confidence map can be fitted on: those with a reading, not shortlisted (that regime keeps its own maps). */
export function confidenceItems(items: readonly FitItem[]): ConfidenceItem[] {
  const out: ConfidenceItem[] = [];
  for (const it of items) {
    if (!it.reading || it.reading.shortlisted) continue;
    const features = featuresFor(it.type, it.reading);
    const y = it.type === "noul" ? it.gold === 0 : argmaxIndex(it.reading.lp) === it.gold;
    out.push({ dataset: it.dataset, type: it.type, features, y, gold: it.type === "noul" ? it.gold === 0 : y });
  }
  return out;
}

/**
 * Weights that make every set count the same in total and, for noul, its two
 * classes the same within it (the sets' label mixes are the sets', not the
 * callers'; balancedWeights in fitting.ts argues the same for the Platt map).
 */
export function setWeights(items: readonly ConfidenceItem[]): number[] {
  const count = new Map<string, number>();
  const key = (it: ConfidenceItem) => (it.type === "noul" ? `${it.dataset}\u0000${it.y}` : it.dataset);
  for (const it of items) count.set(key(it), (count.get(key(it)) ?? 0) + 1);
  return items.map((it) => 1 / count.get(key(it))!);
}

/**
 * Weighted L2-penalised logistic regression by Newton's method: the bias is
 * not penalised; `l2` is per unit of total weight, so it does not depend on
 * how many sets there are.
 */
export function fitConfidenceMap(items: readonly ConfidenceItem[], features: readonly string[], l2 = 1e-2): ConfidenceMap {
  const w = setWeights(items);
  const total = w.reduce((s, x) => s + x, 0);
  const rows = items.map((it) => [1, ...features.map((f) => it.features[f] ?? 0)]);
  const beta = newtonLogistic(
    rows,
    items.map((it) => it.y),
    w.map((x) => x / total),
    { l2 },
  );
  return { bias: beta[0]!, weights: Object.fromEntries(features.map((f, j) => [f, beta[j + 1]!])) };
}

export interface ConfidenceScore {
  n: number;
  /** noul: of p > 0.5 against the gold answer; choice/score: of the chosen option (a map never changes it). */
  accuracy: number | null;
  /** The mean probability of the answer given (noul: max(p, 1 − p)). */
  meanConfidence: number | null;
  ece: number | null;
  /** What a calibrated model with these confidences would show at this n (eceFloor). */
  floor: number | null;
}

/** Probability of the predicted class and whether it is right, for a type: noul reads p as P(true). */
function predicted(it: ConfidenceItem, p: number): { confidence: number; correct: boolean } {
  if (it.type !== "noul") return { confidence: p, correct: it.y };
  return { confidence: Math.max(p, 1 - p), correct: p > 0.5 === it.gold };
}

export function scoreConfidence(items: readonly ConfidenceItem[], p: readonly number[]): ConfidenceScore {
  const pred = items.map((it, i) => predicted(it, p[i]!));
  const conf = pred.map((x) => x.confidence);
  return {
    n: items.length,
    accuracy: mean(pred.map((x) => (x.correct ? 1 : 0))),
    meanConfidence: mean(conf),
    ece: reliability(conf, pred.map((x) => x.correct)).ece,
    floor: eceFloor(conf),
  };
}

export interface ConfidenceRow {
  dataset: string;
  type: MapType;
  /** The maps shipped before (the file's temperature, top-label and Platt maps) on the same readings. */
  shipped: ConfidenceScore;
  /** The confidence map fitted on the other sets of the type. */
  heldOut: ConfidenceScore;
}

/** Each set scored by the map fitted on the other sets of its type with `features`. */
export function leaveOneDatasetOutConfidence(items: readonly ConfidenceItem[], features: readonly string[]): Map<string, number[]> {
  const out = new Map<string, number[]>();
  for (const ds of new Set(items.map((it) => it.dataset))) {
    const mine = items.filter((it) => it.dataset === ds);
    const train = items.filter((it) => it.dataset !== ds && it.type === mine[0]!.type);
    if (train.length === 0) continue;
    const map = fitConfidenceMap(train, features);
    out.set(ds, mine.map((it) => applyConfidenceMap(map, it.features)));
  }
  return out;
}

/**
 * Whether probabilities `after` answer a set worse than `before` beyond
 * chance: of the items whose answer changed, the one-sided McNemar test at
 * 95% (b − c > 1.645·√(b + c), b the items it turns wrong, c those it turns
 * right). At 100–150 rows a set, one or two items either way is noise, and a
 * strict "never one item fewer" would refuse any map that moves the 0.5 line.
 */
export function answersWorse(items: readonly ConfidenceItem[], before: readonly number[], after: readonly number[]): boolean {
  let b = 0;
  let c = 0;
  items.forEach((it, i) => {
    const was = predicted(it, before[i]!).correct;
    const now = predicted(it, after[i]!).correct;
    if (was && !now) b++;
    if (!was && now) c++;
  });
  return b - c > 1.645 * Math.sqrt(b + c);
}

/** The pooled (n-weighted) leave-one-dataset-out ECE of a feature set, over the sets of a type. */
function pooledEce(items: readonly ConfidenceItem[], held: Map<string, number[]>): number {
  let sum = 0;
  let n = 0;
  for (const [ds, p] of held) {
    const mine = items.filter((it) => it.dataset === ds);
    sum += (scoreConfidence(mine, p).ece ?? 0) * mine.length;
    n += mine.length;
  }
  return n > 0 ? sum / n : Infinity;
}

export interface ConfidenceFit {
  /** The maps to ship, per type (a type whose map did not beat the shipped maps held out is absent). */
  maps: Partial<Record<MapType, ConfidenceMap>>;
  /** Per type, the feature set chosen and the pooled held-out ECE of each candidate and of the shipped maps. */
  choice: Partial<Record<MapType, { features: string[]; candidates: { features: string[]; ece: number; keepsAccuracy: boolean }[]; shipped: number; ships: boolean }>>;
  rows: ConfidenceRow[];
}

/** The answer's probabilities over the options under the shipped maps (noul: [true, false]). */
function shippedDistribution(it: FitItem, maps: CalibrationMaps | null): number[] {
  const reading = it.reading as QuestionReading;
  const keys = reading.lp.map((_, i) => String(i));
  const a = answer({ type: it.type, keys }, reading, maps);
  return a.type === "noul" ? [a.noul, 1 - a.noul] : keys.map((k) => a.probabilities[k]!);
}

/**
 * score: how far the expected level (the answer's `score`) falls from the gold
 * level when the chosen level's probability is `top` and the other levels keep
 * their shipped proportions, as a confidence map sets them (withTop).
 */
export function expectedLevelError(dist: readonly number[], gold: number, top?: number): number {
  const p = top === undefined ? dist : withTop(dist, argmaxIndex(dist), top);
  return Math.abs(p.reduce((s, x, i) => s + x * i, 0) - gold);
}

/**
 * Fits every type's map: per type, each candidate feature set is judged by its
 * pooled leave-one-dataset-out ECE; of those that, held out, answer as many
 * right over the sets as the maps shipped before and no set worse beyond
 * chance (answersWorse), the lowest is fitted on every set and ships where it
 * beats the shipped maps' ECE on the same readings. A type with fewer than
 * two sets is not fitted (nothing to hold out).
 */
export function fitConfidence(fitItems: readonly FitItem[], shipped: CalibrationMaps | null): ConfidenceFit {
  const withReading = fitItems.filter((it) => it.reading && !it.reading.shortlisted);
  const items = confidenceItems(withReading);
  const dists = withReading.map((it) => shippedDistribution(it, shipped));
  // The probability a confidence map gives: of "true" for noul, of the chosen option otherwise.
  const before = dists.map((d, i) => (withReading[i]!.type === "noul" ? d[0]! : Math.max(...d)));
  const fit: ConfidenceFit = { maps: {}, choice: {}, rows: [] };
  for (const type of ["noul", "choice", "score"] as const) {
    const idx = items.flatMap((it, i) => (it.type === type ? [i] : []));
    const mine = idx.map((i) => items[i]!);
    if (new Set(mine.map((it) => it.dataset)).size < 2) continue;
    const idxOf = new Map<string, number[]>();
    for (const i of idx) idxOf.set(items[i]!.dataset, [...(idxOf.get(items[i]!.dataset) ?? []), i]);
    const shippedHeld = new Map([...idxOf].map(([ds, ii]) => [ds, ii.map((i) => before[i]!)]));
    const shippedEce = pooledEce(mine, shippedHeld);
    const setOf = (ds: string) => mine.filter((it) => it.dataset === ds);
    const rowsOf = (held: Map<string, number[]>): ConfidenceRow[] =>
      [...held].map(([ds, p]) => ({ dataset: ds, type, shipped: scoreConfidence(setOf(ds), shippedHeld.get(ds)!), heldOut: scoreConfidence(setOf(ds), p) }));
    // A noul map moves the 0.5 line: held out, it must answer as many right over the sets (each
    // weighing the same) and no set worse by more than chance explains (answersWorse).
    const meanAccuracy = (rows: readonly ConfidenceRow[], pick: (r: ConfidenceRow) => ConfidenceScore) => rows.reduce((s, r) => s + (pick(r).accuracy ?? 0), 0) / rows.length;
    // A score map also moves the expected level (the answer's `score`): held out, its mean error over
    // the sets (each weighing the same) must not grow.
    const levelError = (held: Map<string, number[]> | null) =>
      mean(
        [...idxOf].map(([ds, ii]) =>
          mean(ii.map((i, j) => expectedLevelError(dists[i]!, withReading[i]!.gold, held ? held.get(ds)![j]! : undefined))) ?? 0,
        ),
      ) ?? 0;
    const shippedLevelError = type === "score" ? levelError(null) : 0;
    const scored = CANDIDATES[type].map((features) => {
      const held = leaveOneDatasetOutConfidence(mine, features);
      const rows = rowsOf(held);
      const keeps =
        meanAccuracy(rows, (r) => r.heldOut) >= meanAccuracy(rows, (r) => r.shipped) &&
        [...held].every(([ds, p]) => !answersWorse(setOf(ds), shippedHeld.get(ds)!, p)) &&
        (type !== "score" || levelError(held) <= shippedLevelError);
      return { features, ece: pooledEce(mine, held), keeps, rows };
    });
    // The lowest pooled ECE among the candidates that keep accuracy; else the lowest (reported, not shipped).
    const keeping = scored.filter((c) => c.keeps);
    const best = (keeping.length > 0 ? keeping : scored).reduce((a, b) => (b.ece < a.ece ? b : a));
    const ships = best.keeps && best.ece < shippedEce;
    fit.choice[type] = { features: best.features, candidates: scored.map((c) => ({ features: c.features, ece: c.ece, keepsAccuracy: c.keeps })), shipped: shippedEce, ships };
    if (ships) fit.maps[type] = fitConfidenceMap(mine, best.features);
    fit.rows.push(...best.rows);
  }
  return fit;
}

/** The table `assay calibrate` prints for the confidence maps. */
export function confidenceTable(fit: ConfidenceFit): string {
  const f = (x: number | null) => (x === null ? "–" : x.toFixed(3));
  const lines = [
    "| dataset | type | n | accuracy, shipped maps | mean p, shipped | ECE, shipped | accuracy, confidence map (LODO) | mean p (LODO) | ECE (LODO) | its floor |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ...fit.rows.map(
      (r) =>
        `| ${r.dataset} | ${r.type} | ${r.heldOut.n} | ${f(r.shipped.accuracy)} | ${f(r.shipped.meanConfidence)} | ${f(r.shipped.ece)} | ` +
        `${f(r.heldOut.accuracy)} | ${f(r.heldOut.meanConfidence)} | ${f(r.heldOut.ece)} | ${f(r.heldOut.floor)} |`,
    ),
  ];
  const notes = Object.entries(fit.choice).map(
    ([type, c]) =>
      `${type}: features ${c!.features.join(", ")} (pooled LODO ECE ${c!.candidates.map((x) => `[${x.features.join(",")}] ${x.ece.toFixed(3)}${x.keepsAccuracy ? "" : " (answers worse)"}`).join("; ")}; shipped maps ${c!.shipped.toFixed(3)})` +
      (c!.ships ? "" : ": not shipped (no lower ECE than the shipped maps, fewer answered right over the sets, or a set answered worse beyond chance)"),
  );
  return [...lines, "", ...notes].join("\n") + "\n";
}
