/**
 * Fitting a confidence map for single questions (src/probability/question-maps.ts):
 * for every question asked of enough labelled states, a map fitted on that
 * question alone, judged by k-fold cross-validation on its own items against
 * what the build serves for it now, and kept only where it states the answers
 * closer to how often they are right without answering more of them wrongly.
 */
import type { CalibrationFit } from "../models/manifest.js";
import type { ConfidenceMap, QuestionMap } from "../probability/index.js";
import { applyConfidenceMap, softmax, temperatureFor } from "../probability/index.js";
import type { FitItem } from "./calibrate.js";
import type { ConfidenceItem, ConfidenceScore, MapType } from "./confidence-fit.js";
import { answersWorse, confidenceItems, expectedLevelError, fitConfidenceMap, fitSpread, scoreConfidence, shippedDistribution } from "./confidence-fit.js";
import { mean } from "./metrics.js";

/** A question needs this many labelled states (with readings) before a map of its own is fitted. */
export const MIN_ITEMS = 40;

/**
 * Candidate features per type, few: a question's own items are tens to
 * hundreds, and cross-validation on them chooses between these alone.
 */
const CANDIDATES: Record<MapType, string[][]> = {
  noul: [["z"]],
  choice: [["top"], ["top", "agree"]],
  score: [["agree"], ["top", "agree"]],
};

export interface QuestionFitRow {
  key: string;
  type: MapType;
  /** The sets its items came from (a question is usually one set's). */
  datasets: string[];
  n: number;
  /** What the build serves for it now, and the question's own map out of fold. */
  before: ConfidenceScore;
  after: ConfidenceScore | null;
  features: string[] | null;
  /** score: mean |expected level − gold|, now and out of fold. */
  levelError?: [number, number] | undefined;
  ships: boolean;
  /** Why it was not fitted or does not ship. */
  note?: string | undefined;
}

export interface QuestionFit {
  maps: Record<string, QuestionMap>;
  rows: QuestionFitRow[];
}

/** Each item weighs the same: the question's own items are the mix its answers are judged on. */
const even = (xs: readonly unknown[]) => xs.map(() => 1);

interface Fold {
  map: ConfidenceMap;
  test: number[];
}

/** k folds by position (item i in fold i mod k), each with the map fitted on the other folds. */
function folds(items: readonly ConfidenceItem[], features: readonly string[], k: number, spreadOf?: (train: number[], map: ConfidenceMap) => number): Fold[] {
  const out: Fold[] = [];
  for (let f = 0; f < k; f++) {
    const train = items.flatMap((_, i) => (i % k !== f ? [i] : []));
    const test = items.flatMap((_, i) => (i % k === f ? [i] : []));
    if (test.length === 0) continue;
    const sub = train.map((i) => items[i]!);
    const map = fitConfidenceMap(sub, features, 1e-2, even(sub));
    if (spreadOf) map.spread = spreadOf(train, map);
    out.push({ map, test });
  }
  return out;
}

/**
 * Fits a map for every question (FitItem.question) asked of at least
 * MIN_ITEMS labelled states, with one type. Each candidate feature set is
 * judged by `k`-fold cross-validation on the question's items; the lowest
 * ECE among those that answer no more wrongly than `fit` does (noul: the 0.5
 * line moves; answersWorse) and, for score, keep the expected level as close
 * to the gold one, ships where it is below the ECE of what `fit` serves.
 */
export function fitQuestionMaps(fitItems: readonly FitItem[], fit: CalibrationFit | null, k = 5): QuestionFit {
  const out: QuestionFit = { maps: {}, rows: [] };
  const groups = new Map<string, FitItem[]>();
  for (const it of fitItems) {
    if (!it.question || !it.reading || it.reading.shortlisted) continue;
    groups.set(it.question, [...(groups.get(it.question) ?? []), it]);
  }
  for (const [key, group] of groups) {
    // The key hashes the type: one question is one type.
    const type = group[0]!.type;
    const datasets = [...new Set(group.map((it) => it.dataset))];
    const items = confidenceItems(group);
    // What `fit` serves now: the levels, and the probability a map sets (of "true" for noul, of the chosen option otherwise).
    const now = group.map((it) => shippedDistribution(it, fit));
    const before = now.map((d) => (type === "noul" ? d[0]! : Math.max(...d)));
    const row: QuestionFitRow = { key, type, datasets, n: items.length, before: scoreConfidence(items, before), after: null, features: null, ships: false };
    out.rows.push(row);
    const trues = items.filter((it) => it.y).length;
    if (items.length < MIN_ITEMS || (type === "noul" && Math.min(trues, items.length - trues) < 5)) {
      row.note = `fewer than ${MIN_ITEMS} labelled states${type === "noul" ? ", or fewer than 5 of either answer" : ""}`;
      continue;
    }
    // score: the levels a map starts from (softmax(lp / T)) and the gold level.
    const t = temperatureFor(fit, type, group[0]!.reading!.lp.length);
    const base = type === "score" ? group.map((it) => softmax(it.reading!.lp, t)) : [];
    const gold = group.map((it) => it.gold);
    const spreadOf =
      type === "score"
        ? (train: number[], map: ConfidenceMap) => fitSpread([train.map((i) => ({ dist: base[i]!, gold: gold[i]!, top: applyConfidenceMap(map, items[i]!.features) }))])
        : undefined;
    const levelError = (tops: readonly number[] | null, spreads: readonly number[] | null) =>
      mean(group.map((_, i) => (tops ? expectedLevelError(base[i]!, gold[i]!, tops[i]!, spreads![i]!) : expectedLevelError(now[i]!, gold[i]!)))) ?? 0;
    const levelNow = type === "score" ? levelError(null, null) : 0;
    const scored = CANDIDATES[type].map((features) => {
      const p = new Array<number>(items.length);
      const spreads = new Array<number>(items.length).fill(0);
      for (const fold of folds(items, features, k, spreadOf)) {
        for (const i of fold.test) {
          p[i] = applyConfidenceMap(fold.map, items[i]!.features);
          spreads[i] = fold.map.spread ?? 0;
        }
      }
      const level = type === "score" ? levelError(p, spreads) : 0;
      const keeps = !answersWorse(items, before, p) && (type !== "score" || level <= levelNow);
      return { features, score: scoreConfidence(items, p), keeps, level };
    });
    const keeping = scored.filter((c) => c.keeps);
    const best = (keeping.length > 0 ? keeping : scored).reduce((a, b) => ((b.score.ece ?? Infinity) < (a.score.ece ?? Infinity) ? b : a));
    row.after = best.score;
    row.features = best.features;
    if (type === "score") row.levelError = [levelNow, best.level];
    row.ships = best.keeps && (best.score.ece ?? Infinity) < (row.before.ece ?? Infinity);
    if (!row.ships) {
      row.note = best.keeps ? "no lower ECE than the build's maps" : type === "score" ? "answers worse, or moves the expected level away" : "answers worse beyond chance";
      continue;
    }
    const map = fitConfidenceMap(items, best.features, 1e-2, even(items));
    if (spreadOf) {
      const lambda = spreadOf(
        items.map((_, i) => i),
        map,
      );
      if (lambda > 0) map.spread = lambda;
    }
    out.maps[key] = { type, map };
  }
  return out;
}

/** The table `assay calibrate --per-question` prints. */
export function questionFitTable(fit: QuestionFit, k = 5): string {
  const f = (x: number | null | undefined) => (x === null || x === undefined ? "–" : x.toFixed(3));
  const lines = [
    `| question | type | sets | n | accuracy, now | mean p, now | ECE, now | accuracy, own map (${k}-fold) | mean p | ECE | score MAE, now → own | ships |`,
    "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ...fit.rows.map(
      (r) =>
        `| ${r.key} | ${r.type} | ${r.datasets.join(", ")} | ${r.n} | ${f(r.before.accuracy)} | ${f(r.before.meanConfidence)} | ${f(r.before.ece)} | ` +
        `${f(r.after?.accuracy)} | ${f(r.after?.meanConfidence)} | ${f(r.after?.ece)} | ${r.levelError ? `${f(r.levelError[0])} → ${f(r.levelError[1])}` : "–"} | ` +
        `${r.ships ? `yes (${r.features!.join(", ")})` : `no: ${r.note ?? ""}`} |`,
    ),
  ];
  return lines.join("\n") + "\n";
}

