/**
 * Fitting and scoring the code search reading (src/probability/codesearch-reading.ts)
 * on the dev rows, leave-one-repository-out: the repositories differ far more
 * than rows of one repository do (sympy is 35 of 57), so a held-out figure
 * must come from a repository the fit never saw. Offline only.
 */
import fs from "node:fs";
import { mulberry32 } from "../src/eval/calibrate.js";
import { fitRecallThreshold, newtonLogistic } from "../src/eval/fitting.js";
import { auroc } from "../src/eval/metrics.js";
import { logit } from "../src/probability/calibration.js";
import { readRequest, readingNoul, type CodeSearchReading, type LinearFit } from "../src/probability/codesearch-reading.js";
import { requestEvidence, type RequestEvidence } from "../src/prompt/codesearch-features.js";
import type { CodeItem } from "../src/prompt/families.js";

export interface StudyRow {
  id: string;
  repo: string;
  query: string;
  items: CodeItem[];
  labels: boolean[];
  ev: RequestEvidence;
}

export function readRows(file: string): StudyRow[] {
  return fs
    .readFileSync(file, "utf8")
    .split("\n")
    .filter((l) => l.trim())
    .map((l) => {
      const r = JSON.parse(l) as { id: string; repo: string; query: string; items: CodeItem[]; needed: string[] };
      const needed = new Set(r.needed);
      return { id: r.id, repo: r.repo, query: r.query, items: r.items, labels: r.items.map((it) => needed.has(it.id)), ev: requestEvidence(r.query, r.items) };
    });
}

/** Raw scores per row id (item order), from a `runScored` cache (`.cache/codesearch/raw-<name>.jsonl`). */
export function readRaw(file: string): Map<string, number[]> {
  const out = new Map<string, number[]>();
  if (!fs.existsSync(file)) return out;
  for (const l of fs.readFileSync(file, "utf8").split("\n")) {
    if (!l.trim()) continue;
    const rec = JSON.parse(l) as { group: string; items: { id: string; raw: number; overflow?: boolean }[] };
    const byItem = new Map(rec.items.map((it) => [`n${it.id.slice(1)}`, it.overflow ? Number.NaN : it.raw]));
    out.set(rec.group, [...byItem.keys()].sort((a, b) => Number(a.slice(1)) - Number(b.slice(1))).map((k) => byItem.get(k)!));
  }
  return out;
}

// ---- logistic regression ------------------------------------------------------

/** L2-penalised logistic regression (no penalty on the bias), Newton steps. */
export function fitLogistic(x: readonly Readonly<Record<string, number>>[], y: readonly boolean[], names: readonly string[], l2 = 1): LinearFit {
  let w = new Array<number>(names.length + 1).fill(0);
  const pos = y.filter(Boolean).length;
  w[0] = logit(Math.min(0.99, Math.max(0.01, pos / Math.max(1, y.length))));
  const rows = x.map((r) => [1, ...names.map((k) => r[k] ?? 0)]);
  w = newtonLogistic(rows, y, rows.map(() => 1), { l2, start: w, tol: 1e-8, biasRidge: 1e-6 });
  return { bias: w[0]!, weights: Object.fromEntries(names.map((k, i) => [k, w[i + 1]!])) };
}

// ---- levers -------------------------------------------------------------------

/** One reading to try: which features each of the three maps may use. `plain`: the raw score with one global threshold (today's map). */
export interface Lever {
  name: string;
  file: string[];
  share: string[];
  folder: string[];
  plain?: boolean;
}

export const RAW = ["raw"];
export const REL = ["raw", "rawRel"];
export const LEX_FILE = ["pathMention", "stemMention", "defsMention", "bm25", "source", "docPath"];
export const LEX_CORE = ["bm25", "bm25Path", "source", "docPath"];
export const LEX_FOLDER = ["pathMention", "entriesMention", "filesBeneath"];

export const LEVERS: Lever[] = [
  { name: "raw, one global threshold (shipped before)", file: [], share: [], folder: [], plain: true },
  { name: "raw, per kind", file: RAW, share: ["score"], folder: RAW },
  { name: "raw + relative to the request (rawRel, file share)", file: REL, share: ["score", "logShare"], folder: REL },
  { name: "raw + folder from the files beneath", file: REL, share: ["score", "logShare"], folder: [...REL, "childShare"] },
  { name: "lexical only, no folder-from-files", file: LEX_FILE, share: ["score", "logShare"], folder: LEX_FOLDER },
  { name: "lexical + folder from the files beneath", file: LEX_FILE, share: ["score", "logShare"], folder: [...LEX_FOLDER, "childShare"] },
  { name: "bm25 only + folder from files", file: ["bm25"], share: ["score", "logShare"], folder: ["childShare"] },
  { name: "bm25 + stem + defs, folder from files", file: ["bm25", "stemMention", "defsMention"], share: ["score", "logShare"], folder: ["childShare"] },
  { name: "bm25 + path, folder from files", file: ["bm25", "pathMention"], share: ["score", "logShare"], folder: ["childShare"] },
  { name: "lexical files, folder from files only", file: LEX_FILE, share: ["score", "logShare"], folder: ["childShare"] },
  { name: "bm25, folder from files + filesBeneath", file: ["bm25"], share: ["score", "logShare"], folder: ["childShare", "filesBeneath"] },
  { name: "bm25, share only", file: ["bm25"], share: ["logShare"], folder: ["childShare"] },
  { name: "bm25 + source + docPath, folder from files", file: ["bm25", "source", "docPath"], share: ["score", "logShare"], folder: ["childShare"] },
  { name: "bm25 + bm25Path + source + docPath, folder from files", file: ["bm25", "bm25Path", "source", "docPath"], share: ["score", "logShare"], folder: ["childShare"] },
  { name: "bm25 + source + docPath, folder from files + own lexical", file: ["bm25", "source", "docPath"], share: ["score", "logShare"], folder: ["childShare", ...LEX_FOLDER] },
  { name: "raw + rawRel + bm25 + bm25Path + source + docPath; folder raw + rawRel + from files", file: [...REL, ...LEX_CORE], share: ["score", "logShare"], folder: [...REL, "childShare"] },
  { name: "rawRel + bm25 + bm25Path + source + docPath; folder from files", file: ["rawRel", ...LEX_CORE], share: ["score", "logShare"], folder: ["childShare"] },
  { name: "raw + rawRel + lexical core; folder rawRel + from files", file: [...REL, ...LEX_CORE], share: ["score", "logShare"], folder: ["rawRel", "childShare"] },
  { name: "escalated: raw + rawRel + rawLarge + escalated + lexical core; folder + from files", file: [...REL, "rawLarge", "escalated", ...LEX_CORE], share: ["score", "logShare"], folder: [...REL, "rawLarge", "escalated", "childShare"] },
  { name: "bm25 + source + docPath + path + stem, folder from files", file: ["bm25", "source", "docPath", "pathMention", "stemMention"], share: ["score", "logShare"], folder: ["childShare"] },
  { name: "raw + lexical + folder from files (full)", file: [...REL, ...LEX_FILE], share: ["score", "logShare"], folder: [...REL, ...LEX_FOLDER, "childShare"] },
  { name: "full, folder from files only (no folder raw)", file: [...REL, ...LEX_FILE], share: ["score", "logShare"], folder: [...LEX_FOLDER, "childShare"] },
];

/** A row with the raw scores of one name (NaN where an item was not scored). */
export interface ScoredRow extends StudyRow {
  raw: number[];
  /** The escalating name: the large build's score where it rescored (NaN elsewhere); `raw` is then the small build's. */
  large?: number[];
}

const esc = (r: ScoredRow) => (r.large ? { small: r.raw, large: r.large } : undefined);

const NEUTRAL: LinearFit = { bias: 0, weights: {} };

/** Fits a lever's three maps on `rows` (recall threshold left at 0.5; see fitLever). */
function fitMaps(rows: readonly ScoredRow[], lever: Lever, l2: number): CodeSearchReading {
  const base = { recall: { target: 0.95, threshold: 0.5 } };
  // Stage 1: the file map on absolute evidence.
  const fx: Record<string, number>[] = [];
  const fy: boolean[] = [];
  const probe: CodeSearchReading = { file: NEUTRAL, share: NEUTRAL, folder: NEUTRAL, ...base };
  for (const r of rows) {
    const { inputs } = readRequest(r.ev, r.raw, probe, esc(r));
    inputs.fileX.forEach((x, i) => {
      if (x) {
        fx.push(x);
        fy.push(r.labels[i]!);
      }
    });
  }
  const file = fitLogistic(fx, fy, lever.file, l2);
  // Stage 2: the file's share of its request, and the folders from the shares beneath them.
  const sx: Record<string, number>[] = [];
  const sy: boolean[] = [];
  const dx: Record<string, number>[] = [];
  const dy: boolean[] = [];
  const withFile: CodeSearchReading = { file, share: NEUTRAL, folder: NEUTRAL, ...base };
  for (const r of rows) {
    const { inputs } = readRequest(r.ev, r.raw, withFile, esc(r));
    inputs.fileX.forEach((x, i) => {
      if (x) {
        sx.push(x);
        sy.push(r.labels[i]!);
      }
    });
    inputs.folderX.forEach((x, i) => {
      if (x) {
        dx.push(x);
        dy.push(r.labels[i]!);
      }
    });
  }
  return { file, share: fitLogistic(sx, sy, lever.share, l2), folder: fitLogistic(dx, dy, lever.folder, l2), ...base };
}

/** The probability a lever gives each item of a row. */
function predict(r: ScoredRow, lever: Lever, reading: CodeSearchReading | null): number[] {
  if (lever.plain || !reading) return r.large ? r.raw.map((x, i) => (Number.isFinite(r.large![i]!) ? r.large![i]! : x)) : r.raw;
  return readRequest(r.ev, r.raw, reading, esc(r)).p;
}

const repos = (rows: readonly ScoredRow[]) => [...new Set(rows.map((r) => r.repo))];

/** Held-out probabilities, each row scored by maps fitted without its repository. */
function outOfRepo(rows: readonly ScoredRow[], lever: Lever, l2: number): Map<string, number[]> {
  const out = new Map<string, number[]>();
  for (const repo of repos(rows)) {
    const train = rows.filter((r) => r.repo !== repo);
    const reading = lever.plain ? null : fitMaps(train, lever, l2);
    for (const r of rows.filter((x) => x.repo === repo)) out.set(r.id, predict(r, lever, reading));
  }
  return out;
}

const isFolderItem = (it: { kind: string }) => it.kind === "directory";

function thresholdFrom(rows: readonly ScoredRow[], probs: Map<string, number[]>, target: number, kind?: "file" | "folder"): number {
  const needed = rows.flatMap((r) =>
    r.labels.flatMap((l, i) => {
      const p = probs.get(r.id)![i]!;
      const ok = kind === undefined || (kind === "folder") === isFolderItem(r.items[i]!);
      return l && ok && Number.isFinite(p) ? [p] : [];
    }),
  );
  return fitRecallThreshold(needed, target);
}

/** Files and folders get a recall threshold each (each kind keeps the target share of its needed items), instead of one over both. */
export let perKind = false;
export const setPerKind = (on: boolean) => {
  perKind = on;
};

/** A lever fitted on `rows`: its maps on all of them, its threshold from their leave-one-repository-out probabilities. */
/**
 * Where the recall threshold is read from: `nested`, the leave-one-repository-out
 * probabilities of the fitting rows (each from maps fitted on one repository
 * fewer, so weaker than the maps shipped: the threshold comes out low and the
 * recall high); `insample`, the shipped maps' own probabilities on the fitting
 * rows (optimistic by the few parameters the maps have).
 */
export type ThresholdMode = "nested" | "insample";
export let thresholdMode: ThresholdMode = "nested";
export const setThresholdMode = (m: ThresholdMode) => {
  thresholdMode = m;
};

export function fitLever(rows: readonly ScoredRow[], lever: Lever, target: number, l2 = 1): CodeSearchReading & { plainThreshold?: number } {
  if (lever.plain) {
    const threshold = thresholdFrom(rows, new Map(rows.map((r) => [r.id, predict(r, lever, null)])), target);
    return { file: NEUTRAL, share: NEUTRAL, folder: NEUTRAL, recall: { target, threshold }, plainThreshold: threshold };
  }
  const maps = fitMaps(rows, lever, l2);
  const probs = thresholdMode === "nested" ? outOfRepo(rows, lever, l2) : new Map(rows.map((r) => [r.id, predict(r, lever, maps)]));
  if (!perKind) return { ...maps, recall: { target, threshold: thresholdFrom(rows, probs, target) } };
  return { ...maps, recall: { target, threshold: thresholdFrom(rows, probs, target, "file"), folder_threshold: thresholdFrom(rows, probs, target, "folder") } };
}

export interface HeldOut {
  rows: number;
  items: number;
  needed: number;
  /** Recall of needed items and share of all items kept at noul > 0.5, and the recall's 95% bootstrap interval over rows. */
  recall: number;
  recallLo: number;
  recallHi: number;
  kept: number;
  /** Share kept at noul > 0.5 among files and among folders. */
  keptFiles: number;
  keptFolders: number;
  /** Recall of the needed files alone (one per row here), the item an agent reads first. */
  recallFiles: number;
  aurocAll: number;
  aurocWithin: number;
  /** Share of all items kept to reach 95% recall with one cut over the pooled ranking. */
  keptAt95: number;
  /** The same, each request cut where it reaches 95% of its own needed items (a bound: it knows the answer). */
  keptAt95PerRequest: number;
}

/** Pooled held-out noul per row: maps and threshold both fitted without the row's repository (the threshold by a nested leave-one-repository-out). */
export function heldOutNoul(rows: readonly ScoredRow[], lever: Lever, target: number, l2 = 1): Map<string, number[]> {
  const out = new Map<string, number[]>();
  for (const repo of repos(rows)) {
    const train = rows.filter((r) => r.repo !== repo);
    const fit = fitLever(train, lever, target, l2);
    for (const r of rows.filter((x) => x.repo === repo)) {
      const p = predict(r, lever, lever.plain ? null : fit);
      out.set(r.id, p.map((x, i) => (Number.isFinite(x) ? readingNoul(x, fit, isFolderItem(r.items[i]!)) : 1)));
    }
  }
  return out;
}


export function summarize(rows: readonly ScoredRow[], noul: Map<string, number[]>, boot = 2000): HeldOut {
  const all: { p: number; y: boolean; folder: boolean }[] = [];
  const within: number[] = [];
  let perRequestKept = 0;
  const perRow = rows.map((r) => {
    const p = noul.get(r.id)!;
    const items = r.items.map((it, i) => ({ p: p[i]!, y: r.labels[i]!, folder: it.kind === "directory" }));
    all.push(...items);
    const a = auroc(items.map((x) => x.p), items.map((x) => x.y));
    if (a !== null) within.push(a);
    const need = items.filter((x) => x.y).map((x) => x.p).sort((x, y) => y - x);
    const must = Math.ceil(0.95 * need.length - 1e-9);
    const cut = must > 0 ? need[must - 1]! : Infinity;
    perRequestKept += items.filter((x) => x.p >= cut).length;
    return { kept: items.filter((x) => x.p > 0.5 && x.y).length, needed: need.length };
  });
  const needed = all.filter((x) => x.y).length;
  const keptNeeded = all.filter((x) => x.y && x.p > 0.5).length;
  const sorted = [...all].sort((a, b) => b.p - a.p);
  let got = 0;
  let k = 0;
  while (k < sorted.length && got < Math.ceil(0.95 * needed - 1e-9)) if (sorted[k++]!.y) got++;
  while (k < sorted.length && sorted[k]!.p === sorted[k - 1]!.p) k++;
  const rand = mulberry32(50);
  const recalls: number[] = [];
  for (let b = 0; b < boot; b++) {
    let kn = 0;
    let nn = 0;
    for (let j = 0; j < perRow.length; j++) {
      const r = perRow[Math.floor(rand() * perRow.length)]!;
      kn += r.kept;
      nn += r.needed;
    }
    recalls.push(nn ? kn / nn : 1);
  }
  recalls.sort((a, b) => a - b);
  const files = all.filter((x) => !x.folder);
  const folders = all.filter((x) => x.folder);
  return {
    rows: rows.length,
    items: all.length,
    needed,
    recall: needed ? keptNeeded / needed : 1,
    recallLo: recalls[Math.floor(0.025 * boot)] ?? 1,
    recallHi: recalls[Math.floor(0.975 * boot)] ?? 1,
    kept: all.filter((x) => x.p > 0.5).length / all.length,
    keptFiles: files.filter((x) => x.p > 0.5).length / Math.max(1, files.length),
    recallFiles: files.filter((x) => x.y && x.p > 0.5).length / Math.max(1, files.filter((x) => x.y).length),
    keptFolders: folders.filter((x) => x.p > 0.5).length / Math.max(1, folders.length),
    aurocAll: auroc(all.map((x) => x.p), all.map((x) => x.y)) ?? Number.NaN,
    aurocWithin: within.reduce((s, x) => s + x, 0) / Math.max(1, within.length),
    keptAt95: k / all.length,
    keptAt95PerRequest: perRequestKept / all.length,
  };
}
