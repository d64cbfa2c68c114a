/**
 * Per-dataset numbers from a DatasetRun: the metrics of metrics.ts applied to
 * the items that were answered, plus request latency and token counts.
 */
import type { DatasetFormat, TaskType } from "./datasets.js";
import {
  accuracy,
  auroc,
  brier,
  flipRate,
  macroF1,
  mean,
  meanAbsoluteError,
  offByOneAccuracy,
  reliability,
  type Reliability,
} from "./metrics.js";
import type { DatasetRun, Pass, RequestRecord } from "./runner.js";

export interface PassStats {
  requests: number;
  failedRequests: number;
  /** Mean wall time of a request minus its wait for a worker (what a lone request would see). */
  latencyMs: number | null;
  /** Mean wall time including the wait for a worker under the eval's concurrency. */
  wallMs: number | null;
  queueMs: number | null;
  inferenceMs: number | null;
  p50LatencyMs: number | null;
  p95LatencyMs: number | null;
  inputTokens: number;
  tokensPerRequest: number | null;
  questionsPerRequest: number | null;
}

export interface DatasetSummary {
  dataset: string;
  file: string;
  format: DatasetFormat;
  task: TaskType;
  totalRows: number;
  /** Items asked (after --limit). */
  items: number;
  /** Items answered in the main pass (the metrics' n). */
  n: number;
  errors: number;
  accuracy: number | null;
  macroF1: number | null;
  /** score: |expected level − gold| and |argmax level − gold|. */
  maeExpected: number | null;
  maeArgmax: number | null;
  offByOne: number | null;
  auroc: number | null;
  brier: number | null;
  ece: number | null;
  /** The mean probability of the answer given (noul: max(p, 1 − p)): beside accuracy, how sure the answers are on the whole. */
  meanConfidence: number | null;
  reliability: Reliability;
  /** choice/score: fraction of items whose argmax changed with the options reversed; null when not measured. */
  flipRate: number | null;
  flipN: number;
  flipErrors: number;
  /** Gold class counts (choice/noul) or level counts (score). */
  goldCounts: Record<string, number>;
  predCounts: Record<string, number>;
  main: PassStats;
  flip: PassStats | null;
}

function quantile(sorted: readonly number[], q: number): number | null {
  if (sorted.length === 0) return null;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
}

export function passStats(requests: readonly RequestRecord[], pass: Pass): PassStats {
  const mine = requests.filter((r) => r.pass === pass);
  const ok = mine.filter((r) => r.error === undefined);
  const latency = ok.map((r) => Math.max(0, r.wallMs - r.queueMs));
  const tokens = ok.reduce((s, r) => s + r.inputTokens, 0);
  const sorted = [...latency].sort((a, b) => a - b);
  return {
    requests: ok.length,
    failedRequests: mine.length - ok.length,
    latencyMs: mean(latency),
    wallMs: mean(ok.map((r) => r.wallMs)),
    queueMs: mean(ok.map((r) => r.queueMs)),
    inferenceMs: mean(ok.map((r) => r.inferenceMs)),
    p50LatencyMs: quantile(sorted, 0.5),
    p95LatencyMs: quantile(sorted, 0.95),
    inputTokens: tokens,
    tokensPerRequest: ok.length > 0 ? tokens / ok.length : null,
    questionsPerRequest: mean(ok.map((r) => r.questions)),
  };
}

const count = (xs: readonly (string | number | boolean)[]): Record<string, number> => {
  const out: Record<string, number> = {};
  for (const x of xs) out[String(x)] = (out[String(x)] ?? 0) + 1;
  return out;
};

export function summarize(run: DatasetRun, nBins = 15): DatasetSummary {
  const ds = run.dataset;
  const answered = run.items.filter((r) => r.main !== null);
  const mains = answered.map((r) => r.main!);
  const correct = answered.map((r) => r.main!.pred === r.gold);
  const rel = reliability(
    mains.map((m) => m.confidence),
    correct,
    nBins,
  );
  const flipMeasured = run.requests.some((r) => r.pass === "flip");
  const flipPairs = answered.filter((r) => r.flip !== null);

  const s: DatasetSummary = {
    dataset: ds.name,
    file: ds.file,
    format: ds.format,
    task: ds.task,
    totalRows: ds.totalRows,
    items: ds.items.length,
    n: answered.length,
    errors: run.items.length - answered.length,
    accuracy: accuracy(correct),
    meanConfidence: mean(mains.map((m) => m.confidence)),
    macroF1: null,
    maeExpected: null,
    maeArgmax: null,
    offByOne: null,
    auroc: null,
    brier: null,
    ece: rel.ece,
    reliability: rel,
    flipRate: flipMeasured ? flipRate(flipPairs.map((r) => r.main!.pred), flipPairs.map((r) => r.flip!.pred)) : null,
    flipN: flipPairs.length,
    flipErrors: flipMeasured ? run.items.filter((r) => r.main !== null && r.flip === null).length : 0,
    goldCounts: count(answered.map((r) => r.gold)),
    predCounts: count(mains.map((m) => m.pred)),
    main: passStats(run.requests, "main"),
    flip: flipMeasured ? passStats(run.requests, "flip") : null,
  };
  switch (ds.task) {
    case "choice":
      s.macroF1 = macroF1(
        answered.map((r) => String(r.gold)),
        mains.map((m) => String(m.pred)),
      );
      break;
    case "score": {
      const gold = answered.map((r) => r.gold as number);
      s.maeExpected = meanAbsoluteError(
        gold,
        mains.map((m) => m.expected ?? (m.pred as number)),
      );
      const argmax = mains.map((m) => m.pred as number);
      s.maeArgmax = meanAbsoluteError(gold, argmax);
      s.offByOne = offByOneAccuracy(gold, argmax);
      break;
    }
    case "noul": {
      const labels = answered.map((r) => r.gold as boolean);
      const p = mains.map((m) => m.noul ?? 0);
      s.auroc = auroc(p, labels);
      s.brier = brier(p, labels);
      break;
    }
  }
  return s;
}
