/**
 * Fitting and judging the confidence maps (src/probability/confidence.ts):
 * per question type, a logistic model over features of the readings, fitted
 * with every set weighing the same (a set of 300 rows must not outvote a new
 * kind of question of 100) and judged leave-one-dataset-out, the test of
 * whether it carries to a kind of question it never saw.
 */
import type { CalibrationMaps, ConfidenceMap, QuestionReading } from "../probability/index.js";
import { answer, applyConfidenceMap, featuresFor, nearChosen, withTop } from "../probability/index.js";
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
 * how many sets there are. The weights default to `setWeights`.
 */
export function fitConfidenceMap(items: readonly ConfidenceItem[], features: readonly string[], l2 = 1e-2, w: readonly number[] = setWeights(items)): ConfidenceMap {
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

/** score: one set's held-out figures under the map alone and with the spread (fitted on the other sets). */
export interface SpreadRow {
  dataset: string;
  /** The spread fitted on the other sets. */
  lambda: number;
  /** Mean −log p(gold level): the map alone, then with the spread. */
  logLoss: [number, number];
  /** Mean |expected level − gold level|: the map alone, then with the spread. */
  levelError: [number, number];
}

export interface SpreadFit {
  /** Fitted on every set; shipped when `ships`. */
  lambda: number;
  rows: SpreadRow[];
  ships: boolean;
}

export interface ConfidenceFit {
  /** The maps to ship, per type (a type whose map did not beat the shipped maps held out is absent). */
  maps: Partial<Record<MapType, ConfidenceMap>>;
  /** Per type, the feature set chosen and the pooled held-out ECE of each candidate and of the shipped maps. */
  choice: Partial<
    Record<MapType, { features: string[]; candidates: { features: string[]; ece: number; keepsAccuracy: boolean }[]; shipped: number; ships: boolean; spread?: SpreadFit }>
  >;
  rows: ConfidenceRow[];
}

/** The answer's probabilities over the options under `maps`, a map for its own question included (noul: [true, false]). */
export function shippedDistribution(it: FitItem, maps: Parameters<typeof answer>[2]): number[] {
  const reading = it.reading as QuestionReading;
  const keys = reading.lp.map((_, i) => String(i));
  const a = answer({ type: it.type, keys, key: it.question }, reading, maps);
  return a.type === "noul" ? [a.noul, 1 - a.noul] : keys.map((k) => a.probabilities[k]!);
}

/**
 * score: how far the expected level (the answer's `score`) falls from the gold
 * level when the chosen level's probability is `top` and the other levels share
 * the rest in their shipped proportions, leaning toward it by `spread`, as a
 * confidence map sets them (mappedProbabilities).
 */
export function expectedLevelError(dist: readonly number[], gold: number, top?: number, spread = 0): number {
  return Math.abs(scoreDistribution(dist, top, spread).reduce((s, x, i) => s + x * i, 0) - gold);
}

/** A score answer's levels as a map sets them (mappedProbabilities): the chosen level at `top`, the others leaning toward it by `spread`. */
function scoreDistribution(dist: readonly number[], top: number | undefined, spread: number): number[] {
  if (top === undefined) return [...dist];
  const m = argmaxIndex(dist);
  return withTop(nearChosen(dist, m, spread), m, top);
}

/** One score item as the spread's fit sees it: its shipped levels, its gold level, and the map's probability of its chosen level. */
export interface SpreadItem {
  dist: readonly number[];
  gold: number;
  top: number;
}

const SPREAD_GRID = Array.from({ length: 201 }, (_, i) => i * 0.02);

/**
 * The spread λ ∈ [0, 4] (a grid of 0.02) with the lowest mean log-loss of the
 * gold level, every set weighing the same. Log-loss, not the expected level's
 * error: it judges the whole distribution, and the level error follows (it is
 * reported and gated, not fitted).
 */
export function fitSpread(sets: readonly (readonly SpreadItem[])[]): number {
  const loss = (lambda: number) => mean(sets.map((set) => spreadLogLoss(set, lambda))) ?? 0;
  let best = 0;
  let bestLoss = loss(0);
  for (const lambda of SPREAD_GRID) {
    const l = loss(lambda);
    if (l < bestLoss - 1e-12) [best, bestLoss] = [lambda, l];
  }
  return best;
}

function spreadLogLoss(set: readonly SpreadItem[], lambda: number): number {
  return mean(set.map((it) => -Math.log(Math.max(1e-12, scoreDistribution(it.dist, it.top, lambda)[it.gold]!)))) ?? 0;
}

/**
 * The spread judged leave-one-dataset-out on top of a score map's features: for
 * each set (`byDataset`: its items' indices into `items`, `dists` and `golds`),
 * the map and the spread are fitted on the other sets, and the set's log-loss
 * and level error are compared with the map alone. It ships (fitted on every
 * set) where both means over the sets, each weighing the same, fall.
 */
function judgeSpread(
  byDataset: ReadonlyMap<string, readonly number[]>,
  items: readonly ConfidenceItem[],
  dists: readonly (readonly number[])[],
  golds: readonly number[],
  features: readonly string[],
  all: ConfidenceMap,
): SpreadFit {
  const spreadItems = (ii: readonly number[], map: ConfidenceMap) => ii.map((i) => ({ dist: dists[i]!, gold: golds[i]!, top: applyConfidenceMap(map, items[i]!.features) }));
  const rows: SpreadRow[] = [];
  for (const [ds, mine] of byDataset) {
    const others = [...byDataset].filter(([d]) => d !== ds).map(([, ii]) => ii);
    const map = fitConfidenceMap(others.flat().map((i) => items[i]!), features);
    const lambda = fitSpread(others.map((ii) => spreadItems(ii, map)));
    const held = spreadItems(mine, map);
    const err = (l: number) => mean(held.map((it) => expectedLevelError(it.dist, it.gold, it.top, l))) ?? 0;
    rows.push({ dataset: ds, lambda, logLoss: [spreadLogLoss(held, 0), spreadLogLoss(held, lambda)], levelError: [err(0), err(lambda)] });
  }
  const avg = (pick: (r: SpreadRow) => number) => mean(rows.map(pick)) ?? 0;
  const ships = rows.length > 1 && avg((r) => r.logLoss[1]) < avg((r) => r.logLoss[0]) && avg((r) => r.levelError[1]) <= avg((r) => r.levelError[0]);
  const lambda = fitSpread([...byDataset.values()].map((ii) => spreadItems(ii, all)));
  return { lambda, rows, ships: ships && lambda > 0 };
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
    if (ships) {
      const map = fitConfidenceMap(mine, best.features);
      fit.maps[type] = map;
      if (type === "score") {
        const spread = judgeSpread(idxOf, items, dists, withReading.map((it) => it.gold), best.features, map);
        fit.choice[type]!.spread = spread;
        if (spread.ships) map.spread = spread.lambda;
      }
    }
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
  const spread = fit.choice.score?.spread;
  const spreadLines = spread
    ? [
        "",
        `score spread (the other levels weighted by exp(−λ·distance from the chosen one)), leave-one-dataset-out against the map alone: λ = ${spread.lambda.toFixed(2)} on every set, ${spread.ships ? "shipped" : "not shipped (no lower log-loss, or a larger level error, over the sets)"}`,
        "| dataset | λ (other sets) | log-loss of the gold level, map → with spread | expected level's error, map → with spread |",
        "|---|---:|---:|---:|",
        ...spread.rows.map((r) => `| ${r.dataset} | ${r.lambda.toFixed(2)} | ${f(r.logLoss[0])} → ${f(r.logLoss[1])} | ${f(r.levelError[0])} → ${f(r.levelError[1])} |`),
      ]
    : [];
  return [...lines, "", ...notes, ...spreadLines].join("\n") + "\n";
}
