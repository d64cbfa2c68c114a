/**
 * The code search reading: an item's probability from the model's own score
 * and the request's lexical evidence (src/prompt/codesearch-features.ts),
 * read over the request as a whole. Files are scored, then each file's share
 * of the request (a softmax over its files: a request is built around the
 * files an issue touches, few of them) is read again; a folder is read from
 * the shares of the request's files beneath it, since a needed folder is one
 * that holds a needed file. Three small logistic maps, fitted offline on the
 * dev rows leave-one-repository-out (bench/codesearch-study.ts); the recall
 * threshold then maps to 0.5 as in src/probability/recall.ts.
 */
import { z } from "zod";
import { logit, sigmoid } from "./calibration.js";
import { adjustForRecall } from "./recall.js";

export const LinearFit = z.object({ bias: z.number(), weights: z.record(z.string(), z.number()) });
export type LinearFit = z.infer<typeof LinearFit>;

export const CodeSearchReading = z.object({
  /** File features: raw, rawRel, pathMention, stemMention, defsMention, bm25. */
  file: LinearFit,
  /** A file's score again with its share of the request: score, logShare. */
  share: LinearFit,
  /** Folder features: raw, rawRel, childShare, pathMention, entriesMention, filesBeneath. */
  folder: LinearFit,
  /** Probabilities that map to 0.5: `threshold` for files, `folder_threshold` (when fitted apart) for folders. */
  recall: z.object({ target: z.number().gt(0).lt(1), threshold: z.number().gt(0).lt(1), folder_threshold: z.number().gt(0).lt(1).optional() }),
});
export type CodeSearchReading = z.infer<typeof CodeSearchReading>;

/** A folder with none of the request's files beneath it reads as holding this share. */
const SHARE_FLOOR = 1e-3;

const linear = (fit: LinearFit, x: Record<string, number>): number => {
  let s = fit.bias;
  for (const [k, w] of Object.entries(fit.weights)) s += w * (x[k] ?? 0);
  return s;
};

function logSumExp(xs: readonly number[]): number {
  const m = Math.max(...xs);
  if (!Number.isFinite(m)) return m;
  let s = 0;
  for (const x of xs) s += Math.exp(x - m);
  return m + Math.log(s);
}

/**
 * What the reading needs of a request's evidence (src/prompt/codesearch-features.ts
 * builds it; probability/ does not import prompt/): per item, the file or the
 * folder features by name, and per folder the file items beneath it.
 */
export interface ItemEvidence {
  file: (Readonly<Record<string, number>> | null)[];
  folder: (Readonly<Record<string, number>> | null)[];
  beneath: number[][];
}

const mean = (xs: readonly number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0);

/** The per-item inputs of the three maps, exposed so the offline fit sees exactly what serving computes. */
export interface ReadingInputs {
  fileX: (Record<string, number> | null)[];
  folderX: (Record<string, number> | null)[];
}

/** The escalating name's two scores: the small build's for every item, the large build's (NaN where it did not rescore). */
export interface Escalation {
  small: readonly number[];
  large: readonly number[];
}

/**
 * Probabilities per item (NaN where `raw` is NaN: an item that was not
 * scored). `raw` is the model's probability; the reading's maps read its
 * log-odds and its log-odds against the mean of the request's items of the
 * same kind. With `escalation`, `raw` and `rawRel` are the small build's
 * (on every item alike) and `rawLarge` / `escalated` add the large build's
 * log-odds where it rescored.
 */
export function readRequest(
  ev: ItemEvidence,
  raw: readonly number[],
  reading: CodeSearchReading,
  escalation?: Escalation,
): { p: number[]; inputs: ReadingInputs } {
  const n = raw.length;
  const z = raw.map((r, i) => (Number.isFinite(r) ? logit(escalation ? escalation.small[i]! : r) : Number.NaN));
  const extra = (i: number): Record<string, number> => {
    if (!escalation) return {};
    const l = escalation.large[i]!;
    return Number.isFinite(l) ? { rawLarge: logit(l), escalated: 1 } : { rawLarge: 0, escalated: 0 };
  };
  const files = ev.file.flatMap((f, i) => (f && Number.isFinite(z[i]!) ? [i] : []));
  const folders = ev.folder.flatMap((f, i) => (f && Number.isFinite(z[i]!) ? [i] : []));
  const fileMean = mean(files.map((i) => z[i]!));
  const folderMean = mean(folders.map((i) => z[i]!));

  const fileX: (Record<string, number> | null)[] = Array.from({ length: n }, () => null);
  const folderX: (Record<string, number> | null)[] = Array.from({ length: n }, () => null);
  const score = new Map<number, number>();
  for (const i of files) {
    const f = ev.file[i]!;
    fileX[i] = { raw: z[i]!, rawRel: z[i]! - fileMean, ...extra(i), ...f };
    score.set(i, linear(reading.file, fileX[i]!));
  }
  const lse = files.length ? logSumExp([...score.values()]) : 0;
  const share = new Map<number, number>();
  const p = raw.map(() => Number.NaN);
  for (const i of files) {
    const s = score.get(i)!;
    share.set(i, Math.exp(s - lse));
    fileX[i] = { ...fileX[i]!, score: s, logShare: s - lse };
    p[i] = sigmoid(linear(reading.share, fileX[i]!));
  }
  for (const i of folders) {
    const beneath = ev.beneath[i]!.reduce((s, j) => s + (share.get(j) ?? 0), 0);
    folderX[i] = { raw: z[i]!, rawRel: z[i]! - folderMean, ...extra(i), childShare: Math.log(beneath + SHARE_FLOOR), ...ev.folder[i]! };
    p[i] = sigmoid(linear(reading.folder, folderX[i]!));
  }
  return { p, inputs: { fileX, folderX } };
}

/** `noul` from the reading's probability: the recall threshold of the item's kind maps to 0.5. */
export function readingNoul(p: number, reading: CodeSearchReading, folder = false): number {
  const t = folder && reading.recall.folder_threshold !== undefined ? reading.recall.folder_threshold : reading.recall.threshold;
  return adjustForRecall(p, { target: reading.recall.target, threshold: t });
}
