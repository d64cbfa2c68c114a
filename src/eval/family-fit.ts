import fs from "node:fs";
import path from "node:path";
import { auroc, binaryPrediction, reliability } from "./metrics.js";
import { balancedWeights, fitPlatt, fitRecallThreshold, recallAt } from "./fitting.js";
import { logit } from "../probability/calibration.js";
import { adjustForRecall, type RecallFit } from "../probability/recall.js";
import type { Pipeline } from "../pipeline/types.js";
import { Timings } from "../pipeline/timings.js";
import { unsureIndices, type Band } from "../families/escalation.js";

/**
 * Fitting the code search and fact check maps on labelled dev data, with
 * cross-validation by query / document so no test fold shares a state with
 * its training folds. The model is run once per name through the served
 * pipeline and its raw scores cached (JSON Lines beside the report), so a
 * refit or a new band costs no model time.
 */

// ---- data -------------------------------------------------------------------

export interface CodeSearchRow {
  id: string;
  query: string;
  items: { id: string; path: string; kind: string; filePreview?: { text: string }; childPreview?: unknown }[];
  needed: string[];
}

export interface FactCheckRow {
  id: string;
  document: string;
  claim: string;
  supported: boolean;
}

function readJsonl<T>(file: string): T[] {
  return fs
    .readFileSync(file, "utf8")
    .split("\n")
    .filter((l) => l.trim())
    .map((l) => JSON.parse(l) as T);
}

/** Every `step`-th row so a limit still spans the file (its sources are in blocks). */
export function spreadRows<T>(rows: readonly T[], limit?: number): T[] {
  if (!limit || limit >= rows.length) return [...rows];
  const step = rows.length / limit;
  return Array.from({ length: limit }, (_, i) => rows[Math.floor(i * step)]!);
}

export const readCodeSearch = (file: string) => readJsonl<CodeSearchRow>(file);
export const readFactCheck = (file: string) => readJsonl<FactCheckRow>(file);

// ---- running ----------------------------------------------------------------

export interface ScoredItem {
  /** Query (code search) or document (fact check) the item belongs to: the CV group. */
  group: string;
  id: string;
  raw: number;
  label: boolean;
  overflow?: boolean;
  /** Fact check: the windows the claim's document was read in, when more than one. */
  windows?: number;
}

export interface RunRecord {
  model: string;
  group: string;
  ms: number;
  inputTokens: number;
  items: ScoredItem[];
}

interface Details {
  [id: string]: { raw: number; overflow?: boolean; chunks?: number };
}

/** Runs rows through the pipeline under `model`, resuming from `cacheFile`. */
export async function runScored(
  pipeline: Pipeline,
  model: string,
  requests: { group: string; state: unknown; questions: Record<string, unknown>; labels: Record<string, boolean> }[],
  cacheFile: string,
  progress: (done: number, total: number) => void = () => {},
): Promise<RunRecord[]> {
  const done = new Map<string, RunRecord>();
  if (fs.existsSync(cacheFile)) {
    for (const r of readJsonl<RunRecord>(cacheFile)) if (r.model === model) done.set(r.group, r);
  }
  fs.mkdirSync(path.dirname(cacheFile), { recursive: true });
  const out: RunRecord[] = [];
  for (const [i, req] of requests.entries()) {
    let rec = done.get(req.group);
    if (!rec) {
      const t0 = performance.now();
      const res = await pipeline.run(
        { model, state: req.state as string, questions: req.questions },
        { requestId: `fit-${i}`, orgId: "fit", timings: new Timings() },
      );
      const details = res.details as Details;
      rec = {
        model,
        group: req.group,
        ms: performance.now() - t0,
        inputTokens: res.usage.input_tokens,
        items: Object.keys(req.questions).map((qid) => ({
          group: req.group,
          id: qid,
          raw: details[qid]!.raw,
          label: req.labels[qid]!,
          ...(details[qid]!.overflow ? { overflow: true } : {}),
          ...((details[qid]!.chunks ?? 1) > 1 ? { windows: details[qid]!.chunks } : {}),
        })),
      };
      fs.appendFileSync(cacheFile, JSON.stringify(rec) + "\n");
    }
    out.push(rec);
    progress(i + 1, requests.length);
  }
  return out;
}

export function codeSearchRequests(rows: readonly CodeSearchRow[]) {
  return rows.map((r) => {
    const needed = new Set(r.needed);
    const questions: Record<string, unknown> = {};
    const labels: Record<string, boolean> = {};
    for (const it of r.items) {
      const q = `q${it.id.slice(1)}`;
      questions[q] = { type: "noul" };
      labels[q] = needed.has(it.id);
    }
    return { group: r.id, state: { query: r.query, items: r.items }, questions, labels };
  });
}

/** Claims of one document share one request (up to 64), as a client would send them. */
export function factCheckRequests(rows: readonly FactCheckRow[]) {
  const byDoc = new Map<string, FactCheckRow[]>();
  for (const r of rows) {
    const list = byDoc.get(r.document) ?? [];
    list.push(r);
    byDoc.set(r.document, list);
  }
  const out: { group: string; state: string; questions: Record<string, unknown>; labels: Record<string, boolean> }[] = [];
  for (const list of byDoc.values()) {
    for (let s = 0; s < list.length; s += 64) {
      const part = list.slice(s, s + 64);
      const questions: Record<string, unknown> = {};
      const labels: Record<string, boolean> = {};
      for (const r of part) {
        questions[r.id] = { type: "noul", instructions: r.claim };
        labels[r.id] = r.supported;
      }
      out.push({ group: part[0]!.id, state: part[0]!.document, questions, labels });
    }
  }
  return out;
}

// ---- folds ------------------------------------------------------------------

/** K folds over groups, assigned in a fixed interleaved order. */
export function foldsByGroup<T extends { group: string }>(items: readonly T[], k: number): T[][] {
  const groups = [...new Set(items.map((i) => i.group))];
  const folds: T[][] = Array.from({ length: Math.min(k, groups.length) }, () => []);
  const foldOf = new Map(groups.map((g, i) => [g, i % folds.length]));
  for (const it of items) folds[foldOf.get(it.group)!]!.push(it);
  return folds;
}

// ---- code search: recall --------------------------------------------------------

export function fitRecall(items: readonly ScoredItem[], target: number): RecallFit {
  return { target, threshold: fitRecallThreshold(items.filter((i) => i.label && !i.overflow).map((i) => i.raw), target) };
}

export interface RecallCv {
  folds: number;
  uncorrected: { recall: number; keptFraction: number };
  adjusted: { recall: number; keptFraction: number };
}

/** Pools held-out predictions over the folds: recall and kept share at noul > 0.5. */
export function crossValidateRecall(items: readonly ScoredItem[], target: number, k = 5): RecallCv {
  const folds = foldsByGroup(items, k);
  const held: { raw: number; needed: boolean; overflow?: boolean }[] = [];
  const adjusted: { raw: number; needed: boolean; overflow?: boolean }[] = [];
  folds.forEach((test, f) => {
    const train = folds.flatMap((x, j) => (j === f ? [] : x));
    const fit = fitRecall(train, target);
    for (const it of test) {
      held.push({ raw: it.raw, needed: it.label, ...(it.overflow ? { overflow: true } : {}) });
      adjusted.push({ raw: adjustForRecall(it.raw, fit), needed: it.label, ...(it.overflow ? { overflow: true } : {}) });
    }
  });
  const u = recallAt(held, null);
  const a = recallAt(adjusted, null);
  return {
    folds: folds.length,
    uncorrected: { recall: u.recall, keptFraction: u.keptFraction },
    adjusted: { recall: a.recall, keptFraction: a.keptFraction },
  };
}

/**
 * `judge-codegrep` simulated from the two cached runs: the large build's raw
 * where the small one is inside `band`, each adjusted with its own build's
 * map. It is what the served route computes, item by item.
 */
export function escalatedItems(
  small: readonly ScoredItem[],
  large: readonly ScoredItem[],
  band: Band,
): { items: ScoredItem[]; fromLarge: boolean[] } {
  const key = (i: ScoredItem) => `${i.group}/${i.id}`;
  const big = new Map(large.map((i) => [key(i), i]));
  const unsure = new Set(unsureIndices(small.map((i) => (i.overflow ? NaN : i.raw)), band));
  const fromLarge: boolean[] = [];
  const items = small.map((i, n) => {
    const l = big.get(key(i));
    const esc = unsure.has(n) && l !== undefined;
    fromLarge.push(esc);
    return esc ? l : i;
  });
  return { items, fromLarge };
}

/**
 * `judge-factcheck` simulated per claim: whether the served path (families/factcheck.ts) gives the
 * claim the large build's score: always for a document of several windows, else when the small
 * build's calibrated score `small` lies inside the band.
 */
export function factCheckReadByLarge(item: ScoredItem, small: number, band: Band): boolean {
  return (item.windows ?? 1) > 1 || (small >= band.lo && small <= band.hi);
}

// ---- fact check: Platt --------------------------------------------------------

export interface BinaryScore {
  n: number;
  balancedAccuracy: number;
  ece: number;
  auroc: number | null;
}

export function binaryScore(p: readonly number[], y: readonly boolean[]): BinaryScore {
  let tp = 0;
  let tn = 0;
  let pos = 0;
  let neg = 0;
  const conf: number[] = [];
  const correct: boolean[] = [];
  p.forEach((x, i) => {
    const { pred, confidence } = binaryPrediction(x);
    conf.push(confidence);
    correct.push(pred === y[i]);
    if (y[i]) {
      pos++;
      if (pred) tp++;
    } else {
      neg++;
      if (!pred) tn++;
    }
  });
  const bal = ((pos ? tp / pos : 0) + (neg ? tn / neg : 0)) / (pos && neg ? 2 : 1);
  return { n: p.length, balancedAccuracy: bal, ece: reliability(conf, correct, 15).ece ?? 0, auroc: auroc(p, y) };
}

/**
 * Platt on the claims' log-odds, each set's supported and unsupported claims
 * weighing the same (the set is the claim id's prefix: summedits-…, wice-…):
 * the intercept must carry the model's lean, not the dev sets' label mix
 * (WiCE is two thirds unsupported), or a held-out set with another mix is
 * read with the wrong threshold (issue 18).
 */
export function fitFactCheckPlatt(items: readonly ScoredItem[]) {
  const w = balancedWeights(items.map((i) => ({ set: i.id.split("-")[0]!, y: i.label })));
  return fitPlatt(items.map((i, n) => ({ z: logit(i.raw), y: i.label, w: w[n]! })));
}

