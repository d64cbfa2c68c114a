/**
 * The batch run: input lines → records in the output file.
 *
 *   1. parse every line (bad lines become error records, written first);
 *   2. skip ids the output already has (resume);
 *   3. group the rest: requests with the same model and an identical state
 *      share one pipeline request of up to 64 questions (and at most the
 *      model's packed-token limit), their question ids renamed `<k>:<id>`;
 *   4. run the groups with bounded concurrency, split each answer back per
 *      request, and append one record per line as it completes.
 *
 * Usage of a group is split exactly: the first request of the group (in
 * input order) is charged the shared prefix (system text + state) plus its
 * own questions, which is what it would be charged alone; every other
 * request is charged its own questions' tokens only. The shares sum to the
 * tokens the engine processed, so nothing is counted twice.
 *
 * A group that fails is split in halves and retried down to single
 * requests, so that an error is reported on the line that caused it.
 */
import fs from "node:fs";
import type { Question, RequestEnvelope, SystemOneResponse } from "../validate/schema.js";
import { parseInput, type InputLine } from "./input.js";
import { OutputWriter, addToTally, emptyTally, isDone, readExisting, type Tally } from "./output.js";
import { ScoreError, type OutRecord } from "./records.js";
import type { GroupInfo, Scorer } from "./scorer.js";

export interface BatchOptions {
  inFile: string;
  outFile: string;
  /** Model for lines without one. */
  defaultModel: string;
  /**
   * Pipeline requests in flight at once (default 8): the passes of requests in flight together wait
   * together, and a lane runs short ones as one pass (src/inference/batch.ts).
   */
  concurrency?: number;
  /** Group requests that share a state (default true; in-process only). */
  group?: boolean;
  /** Questions per grouped request at most (default 64, the spec limit). */
  maxQuestions?: number;
  /** Retries of a 429/503/529 answer (default 5). */
  retries?: number;
  /** Stop taking new work when aborted; requests in flight finish and are written. */
  signal?: AbortSignal;
  /** Charge in µUSD of `tokens` for `model`, or null when unknown (summary only). */
  charge?: (model: string, tokens: number) => number | null;
  onStart?: (info: { lines: number; skipped: number; todo: number; truncatedBytes: number; invalidLines: number }) => void;
  onProgress?: (done: number) => void;
}

export interface BatchTally extends Tally {
  /** µUSD, when every scored record could be priced. */
  costMicro: number | null;
}

export interface BatchResult {
  /** Non-blank input lines. */
  lines: number;
  /** Lines whose id the output already had. */
  skipped: number;
  /** Records written by this run. */
  run: BatchTally;
  /** The whole output file after this run. */
  file: BatchTally;
  /** Scorer calls (pipeline requests) made, and how many lines they carried. */
  passes: number;
  groupedLines: number;
  elapsedMs: number;
  interrupted: boolean;
  truncatedBytes: number;
  invalidLines: number;
}

interface Member {
  input: InputLine & { request: RequestEnvelope };
  info: GroupInfo | null;
}

interface Job {
  members: Member[];
}

const RETRY_STATUSES = new Set([429, 503, 529]);

function priced(t: Tally, costMicro: number | null): BatchTally {
  return { ...t, byStatus: { ...t.byStatus }, costMicro };
}

export async function runBatch(scorer: Scorer, opts: BatchOptions): Promise<BatchResult> {
  const t0 = performance.now();
  const concurrency = Math.max(1, opts.concurrency ?? 8);
  const maxQ = Math.max(1, Math.min(64, opts.maxQuestions ?? 64));
  const retries = opts.retries ?? 5;
  const group = (opts.group ?? true) && typeof scorer.groupInfo === "function";

  const text = fs.readFileSync(opts.inFile, "utf8");
  const lines = parseInput(text, opts.defaultModel);
  const existing = readExisting(opts.outFile);
  const todo = lines.filter((l) => !isDone(existing, l));
  opts.onStart?.({
    lines: lines.length,
    skipped: lines.length - todo.length,
    todo: todo.length,
    truncatedBytes: existing.truncatedBytes,
    invalidLines: existing.invalidLines,
  });

  // Cost is summed per record (each rounded up on its own, as the server charges).
  let fileCost: number | null = 0;
  let runCost: number | null = 0;
  const costOf = (r: OutRecord): number | null => {
    if (!opts.charge) return null;
    if (r.status !== 200 || !("response" in r)) return 0;
    return opts.charge(r.response.model, r.response.usage?.input_tokens ?? 0);
  };
  const fileTally = existing.tally;
  if (opts.charge && existing.tally.records > 0) {
    // Price what earlier runs wrote, too.
    fileCost = null;
    try {
      fileCost = 0;
      for (const line of fs.readFileSync(opts.outFile, "utf8").split("\n")) {
        if (!line.trim()) continue;
        try {
          const c = costOf(JSON.parse(line) as OutRecord);
          fileCost = c === null || fileCost === null ? null : fileCost + c;
        } catch {
          // ignored, as in readExisting
        }
      }
    } catch {
      fileCost = null;
    }
  }
  if (!opts.charge) fileCost = runCost = null;

  const runTally = emptyTally();
  const writer = new OutputWriter(opts.outFile);
  let done = 0;
  const emit = (r: OutRecord) => {
    writer.write(r);
    addToTally(runTally, r);
    addToTally(fileTally, r);
    const c = costOf(r);
    runCost = runCost === null || c === null ? null : runCost + c;
    fileCost = fileCost === null || c === null ? null : fileCost + c;
    done++;
    opts.onProgress?.(done);
  };
  const errorRecord = (l: InputLine, e: ScoreError): OutRecord => ({
    id: l.id,
    line: l.line,
    status: e.status,
    error: e.code ? { detail: e.detail, code: e.code } : { detail: e.detail },
  });

  // 1. Lines that are not requests.
  const jobs: Job[] = [];
  const open = new Map<string, { job: Job; questions: number; packed: number }>();
  for (const l of todo) {
    if (l.error || !l.request) {
      emit(errorRecord(l, l.error ?? new ScoreError(422, "not a request", "INVALID_REQUEST")));
      continue;
    }
    const member: Member = { input: l as Member["input"], info: null };
    if (group) {
      try {
        member.info = scorer.groupInfo!(l.request);
      } catch {
        member.info = null;
      }
    }
    const info = member.info;
    if (!info) {
      jobs.push({ members: [member] });
      continue;
    }
    // 2. Group with the open group of the same state when it still fits.
    const g = open.get(info.key);
    if (g && g.questions + info.questions <= maxQ && g.packed + info.blockTokens <= info.maxPackedTokens) {
      g.job.members.push(member);
      g.questions += info.questions;
      g.packed += info.blockTokens;
      continue;
    }
    const job: Job = { members: [member] };
    jobs.push(job);
    open.set(info.key, { job, questions: info.questions, packed: info.prefixTokens + info.blockTokens });
  }

  let passes = 0;
  let groupedLines = 0;
  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

  const scoreWithRetry = async (req: RequestEnvelope, requestId: string): Promise<SystemOneResponse> => {
    for (let attempt = 0; ; attempt++) {
      try {
        passes++;
        return await scorer.score(req, requestId);
      } catch (e) {
        if (!(e instanceof ScoreError) || !RETRY_STATUSES.has(e.status) || attempt >= retries) throw e;
        await sleep(Math.min(30_000, Math.max((e.retryAfterSeconds ?? 0) * 1000, 250 * 2 ** attempt)));
      }
    }
  };

  const runJob = async (job: Job, queue: Job[]): Promise<void> => {
    const members = job.members;
    if (members.length === 1) {
      const m = members[0]!;
      try {
        const response = await scoreWithRetry(m.input.request, `batch-${m.input.line}`);
        emit({ id: m.input.id, line: m.input.line, status: 200, response });
      } catch (e) {
        if (!(e instanceof ScoreError)) throw e;
        emit(errorRecord(m.input, e));
      }
      return;
    }
    const first = members[0]!.input.request;
    const questions: Record<string, Question> = {};
    members.forEach((m, k) => {
      for (const [qid, q] of Object.entries(m.input.request.questions)) questions[`${k}:${qid}`] = q as Question;
    });
    let response: SystemOneResponse;
    try {
      response = await scoreWithRetry(
        { model: first.model, state: first.state, questions },
        `batch-${members[0]!.input.line}-x${members.length}`,
      );
    } catch (e) {
      if (!(e instanceof ScoreError)) throw e;
      const mid = Math.ceil(members.length / 2);
      queue.unshift({ members: members.slice(0, mid) }, { members: members.slice(mid) });
      return;
    }
    groupedLines += members.length;
    for (const r of splitGroup(members, response)) emit(r);
  };

  const queue = [...jobs];
  let interrupted = false;
  try {
    const lanes = Array.from({ length: concurrency }, async () => {
      for (;;) {
        if (opts.signal?.aborted) {
          interrupted = queue.length > 0;
          return;
        }
        const job = queue.shift();
        if (!job) return;
        await runJob(job, queue);
      }
    });
    await Promise.all(lanes);
  } finally {
    writer.close();
  }
  return {
    lines: lines.length,
    skipped: lines.length - todo.length,
    run: priced(runTally, runCost),
    file: priced(fileTally, fileCost),
    passes,
    groupedLines,
    elapsedMs: performance.now() - t0,
    interrupted,
    truncatedBytes: existing.truncatedBytes,
    invalidLines: existing.invalidLines,
  };
}

/**
 * One grouped response → one record per request. Answers are read back
 * under each request's own question ids, in its order. Usage: see the top
 * of this file (the first request carries the shared prefix).
 */
export function splitGroup(members: readonly Member[], response: SystemOneResponse): OutRecord[] {
  const total = response.usage.input_tokens;
  const others = members.slice(1).reduce((s, m) => s + (m.info?.questionTokens ?? 0), 0);
  return members.map((m, k): OutRecord => {
    const answers: SystemOneResponse["answers"] = {};
    for (const qid of Object.keys(m.input.request.questions)) {
      const a = response.answers[`${k}:${qid}`];
      if (!a) {
        return {
          id: m.input.id,
          line: m.input.line,
          status: 502,
          error: { detail: `the model returned no answer for question "${qid}"`, code: "MODEL_FAILED" },
        };
      }
      answers[qid] = a;
    }
    const inputTokens = k === 0 ? total - others : (m.info?.questionTokens ?? 0);
    return {
      id: m.input.id,
      line: m.input.line,
      status: 200,
      response: {
        ...response,
        model: m.input.request.model,
        answers,
        usage: { input_tokens: inputTokens, output_tokens: k === 0 ? response.usage.output_tokens : 0 },
      },
    };
  });
}
