/**
 * Runs datasets through a Pipeline in-process: builds the requests (items
 * sharing a state are batched), runs them with bounded concurrency, reads each
 * answer back into the dataset's label order, and (for choice/score) re-asks
 * with the options reversed to measure order flips.
 */
import type { CalibrationFit } from "../models/manifest.js";
import type { Pipeline } from "../pipeline/types.js";
import { Timings } from "../pipeline/timings.js";
import { temperatureFor, topLabelFor, uncalibrateNoulLogit, type QuestionReading } from "../probability/index.js";
import type { Answer, ChoiceQuestion, Question, ScoreQuestion } from "../validate/schema.js";
import { groupByState, type Dataset, type EvalItem } from "./datasets.js";
import { argmaxIndex, logSoftmax, unreverseLevel } from "./metrics.js";

export type Pass = "main" | "flip";

/** One answer read back in the dataset's label order. */
export interface Readout {
  /**
   * Probabilities in label order: noul [true, false]; choice the dataset's
   * options; score the levels low → high (also for the reversed pass).
   */
  probabilities: number[];
  /** noul: p > 0.5; choice: the option; score: the argmax level index. */
  pred: boolean | string | number;
  /** Probability of the predicted class (noul: max(p, 1 − p)). */
  confidence: number;
  /** noul only: the answer's `noul`. */
  noul?: number;
  /** score only: the answer's expected level `score` (mapped back to low → high). */
  expected?: number;
  /**
   * Label log-probabilities normalised over the labels (log-softmax at
   * temperature 1), in label order, recovered from the calibrated answer and
   * the manifest's temperature; null where the probability underflowed.
   */
  labelLogprobs: (number | null)[];
  /** What the engine read for the question (general family): what a confidence map is fitted on. */
  reading?: QuestionReading;
}

export interface ItemResult {
  id: string;
  gold: boolean | string | number;
  main: Readout | null;
  mainError?: string;
  flip: Readout | null;
  flipError?: string;
}

export interface RequestRecord {
  dataset: string;
  pass: Pass;
  questions: number;
  /** Wall time of `pipeline.run`, including waiting for a worker. */
  wallMs: number;
  /** Time spent waiting for a worker (the pipeline's `queue` stage). */
  queueMs: number;
  inferenceMs: number;
  inputTokens: number;
  error?: string;
}

export interface DatasetRun {
  dataset: Dataset;
  items: ItemResult[];
  requests: RequestRecord[];
}

export interface Progress {
  start(total: number): void;
  /** Called after each request with the dataset it belonged to. */
  tick(dataset: string): void;
  addToTotal(n: number): void;
  stop(): void;
}

export interface RunOptions {
  pipeline: Pipeline;
  model: string;
  /** Calibration applied by the pipeline, under its debias mode (to recover label log-probabilities). */
  calibration: CalibrationFit | null;
  /** Requests in flight at once (default 2). */
  concurrency?: number;
  /** Also ask choice/score questions with the options reversed (default true). */
  flip?: boolean;
  /** Questions per request at most (default 64, the spec limit). */
  maxQuestions?: number;
  progress?: Progress;
}

interface Job {
  run: DatasetRun;
  pass: Pass;
  items: EvalItem[];
}

/** The question asked in the reversed pass: choice keys reversed; score levels presented high → low. */
export function reversedQuestion(item: EvalItem): Question {
  switch (item.type) {
    case "noul":
      return item.question;
    case "choice": {
      const criteria: Record<string, string | null> = {};
      for (const k of Object.keys(item.question.criteria).reverse()) criteria[k] = item.question.criteria[k] ?? null;
      const q: ChoiceQuestion = { ...item.question, criteria };
      return q;
    }
    case "score": {
      const q: ScoreQuestion = { ...item.question, criteria: [...item.question.criteria].reverse() };
      return q;
    }
  }
}

/**
 * The label log-probabilities behind a choice/score answer, undoing the
 * temperature. A top-label map (floored per question) cannot be undone:
 * then there is nothing to recover, and every entry is null.
 */
function recoverLogprobs(p: readonly number[], calibration: CalibrationFit | null, type: "choice" | "score"): (number | null)[] {
  if (topLabelFor(calibration, type, p.length)) return p.map(() => null);
  const t = temperatureFor(calibration, type, p.length);
  return logSoftmax(p.map((x) => t * Math.log(x))).map((x) => (Number.isFinite(x) ? x : null));
}

/** noul: undo the Platt map (or temperature) on the answer's log-odds. */
function recoverNoul(p: number, calibration: CalibrationFit | null): (number | null)[] {
  const z = uncalibrateNoulLogit(Math.log(p) - Math.log1p(-p), calibration);
  return logSoftmax([z, 0]).map((x) => (Number.isFinite(x) ? x : null));
}

/** Read an answer back into the item's label order (mapping reversed score levels back). */
export function readAnswer(item: EvalItem, a: Answer, pass: Pass, calibration: CalibrationFit | null): Readout {
  if (a.type !== item.type) throw new Error(`question "${item.id}": expected a ${item.type} answer, got ${a.type}`);
  switch (a.type) {
    case "noul": {
      const p = [a.noul, 1 - a.noul];
      return {
        probabilities: p,
        pred: a.noul > 0.5,
        confidence: Math.max(a.noul, 1 - a.noul),
        noul: a.noul,
        labelLogprobs: recoverNoul(a.noul, calibration),
      };
    }
    case "choice": {
      const options = (item as Extract<EvalItem, { type: "choice" }>).options;
      const p = options.map((o) => a.probabilities[o] ?? 0);
      const best = argmaxIndex(p);
      return {
        probabilities: p,
        pred: a.choice,
        confidence: p[best]!,
        labelLogprobs: recoverLogprobs(p, calibration, "choice"),
      };
    }
    case "score": {
      const k = (item as Extract<EvalItem, { type: "score" }>).levels.length;
      const p = Array.from({ length: k }, (_, i) => {
        const shown = pass === "flip" ? unreverseLevel(i, k) : i;
        return a.probabilities[String(shown)] ?? 0;
      });
      const best = argmaxIndex(p);
      return {
        probabilities: p,
        pred: best,
        confidence: p[best]!,
        expected: pass === "flip" ? unreverseLevel(a.score, k) : a.score,
        labelLogprobs: recoverLogprobs(p, calibration, "score"),
      };
    }
  }
}

const message = (e: unknown) => (e instanceof Error ? e.message : String(e));

/** Run every dataset; requests of all datasets share one queue of `concurrency` runners. */
export async function runDatasets(datasets: readonly Dataset[], opts: RunOptions): Promise<DatasetRun[]> {
  const concurrency = Math.max(1, opts.concurrency ?? 2);
  const maxQ = opts.maxQuestions ?? 64;
  const flip = opts.flip ?? true;
  const runs: DatasetRun[] = [];
  const jobs: Job[] = [];
  const byId = new Map<DatasetRun, Map<string, ItemResult>>();
  for (const ds of datasets) {
    const run: DatasetRun = {
      dataset: ds,
      items: ds.items.map((it) => ({ id: it.id, gold: it.gold, main: null, flip: null })),
      requests: [],
    };
    runs.push(run);
    byId.set(run, new Map(run.items.map((r) => [r.id, r])));
    for (const group of groupByState(ds.items, maxQ)) jobs.push({ run, pass: "main", items: group });
    if (flip && ds.task !== "noul") {
      for (const group of groupByState(ds.items, maxQ)) jobs.push({ run, pass: "flip", items: group });
    }
  }

  const progress = opts.progress;
  progress?.start(jobs.length);
  const queue = [...jobs];

  const runJob = async (job: Job): Promise<void> => {
    const questions: Record<string, Question> = {};
    for (const it of job.items) questions[it.id] = job.pass === "flip" ? reversedQuestion(it) : it.question;
    const timings = new Timings();
    const t0 = performance.now();
    const record: RequestRecord = {
      dataset: job.run.dataset.name,
      pass: job.pass,
      questions: job.items.length,
      wallMs: 0,
      queueMs: 0,
      inferenceMs: 0,
      inputTokens: 0,
    };
    const results = byId.get(job.run)!;
    const readings = new Map<string, QuestionReading>();
    try {
      const res = await opts.pipeline.run(
        { model: opts.model, state: job.items[0]!.state, questions },
        {
          requestId: `eval-${job.run.dataset.name}-${job.pass}-${job.run.requests.length}`,
          orgId: "eval",
          timings,
          onReading: (id, r) => readings.set(id, r),
        },
      );
      record.wallMs = performance.now() - t0;
      record.queueMs = timings.ms.queue ?? 0;
      record.inferenceMs = timings.ms.inference ?? 0;
      record.inputTokens = res.usage.input_tokens;
      job.run.requests.push(record);
      for (const it of job.items) {
        const r = results.get(it.id)!;
        const a = res.answers[it.id];
        try {
          if (!a) throw new Error(`no answer for question "${it.id}"`);
          const readout = readAnswer(it, a, job.pass, opts.calibration);
          const reading = readings.get(it.id);
          if (reading) readout.reading = reading;
          if (job.pass === "main") r.main = readout;
          else r.flip = readout;
        } catch (e) {
          if (job.pass === "main") r.mainError = message(e);
          else r.flipError = message(e);
        }
      }
    } catch (e) {
      record.wallMs = performance.now() - t0;
      record.error = message(e);
      job.run.requests.push(record);
      if (job.items.length > 1) {
        // A batch can fail for one question or for its total length: retry in halves.
        const mid = Math.ceil(job.items.length / 2);
        queue.unshift({ ...job, items: job.items.slice(0, mid) }, { ...job, items: job.items.slice(mid) });
        progress?.addToTotal(2);
      } else {
        for (const it of job.items) {
          const r = results.get(it.id)!;
          if (job.pass === "main") r.mainError = record.error;
          else r.flipError = record.error;
        }
      }
    }
    progress?.tick(job.run.dataset.name);
  };

  const lanes = Array.from({ length: concurrency }, async () => {
    for (let job = queue.shift(); job; job = queue.shift()) await runJob(job);
  });
  try {
    await Promise.all(lanes);
  } finally {
    progress?.stop();
  }
  return runs;
}
