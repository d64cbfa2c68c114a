import { invalid } from "../errors/catalogue.js";
import { branchCost, labelIds, pack, passLimit, subtractPrior, NEUTRAL_STATE, type Engine, type EncodedQuestion, type LoadedBuild, type PackedRequest, type PlannedPass, type PriorRead, type ScoreContext } from "../engine/index.js";
import type { ResolvedModel } from "../models/registry.js";
import type { CalibrationFit } from "../models/manifest.js";
import type { PipelineContext } from "../pipeline/types.js";
import type { Timings } from "../pipeline/timings.js";
import { answer, averageReadings, calibrationForMode, logSumExp, questionKey, type QuestionReading } from "../probability/index.js";
import { buildPrompt, DEFAULT_DEBIAS, NUMBERED_MAX_OPTIONS, type Debias } from "../prompt/index.js";
import {
  type Answer,
  type Question,
  type RequestEnvelope,
  type State,
  type SystemOneResponse,
} from "../validate/schema.js";
import { generalRequest } from "../validate/families.js";
import type { FamilyEnv } from "./types.js";

/**
 * The general family: any state, any mix of noul / choice / score questions.
 * All questions are branches of one packed pass over the state (plus their
 * option-order presentations); a content-free prior pass and a shortlist
 * pass where the build's calibration asks for them.
 */

export interface PreparedQuestion {
  id: string;
  type: Question["type"];
  keys: string[];
  levels?: string[];
  /** Option index of each label read (several surface forms may share one). */
  option: number[];
  /** Per block, when the blocks map labels to options differently (numbered options): the label → option map. */
  blockOptions?: number[][];
  /**
   * Packed blocks holding this question's presentations (one unless the
   * options are shown in several orders, see ASSAY_DEBIAS); their readings
   * are averaged.
   */
  blocks: number[];
}

export interface PreparedRequest {
  packed: PackedRequest;
  questions: PreparedQuestion[];
  /** The prompt prefix (system text + state) as token ids. */
  prefix: number[];
  /** Option-order debiasing: every question is read in all its presentations. */
  debias: Debias;
  /** What it was prepared from, so that a shortlist can be asked of the same state. */
  source: { state: State; questions: Record<string, Question> };
  /** The packed blocks as encoded, in block order: the branches of a multi-pass read, and what a content-free prior reads again. */
  encoded: EncodedQuestion[];
}

/** Per option, the log of the summed probability of its labels. */
export function optionLogprobs(q: PreparedQuestion, labelLp: readonly number[], option: readonly number[] = q.option): number[] {
  const out = new Array<number>(q.keys.length).fill(-Infinity);
  labelLp.forEach((lp, i) => {
    const o = option[i]!;
    const a = out[o]!;
    const m = Math.max(a, lp);
    out[o] = m === -Infinity ? -Infinity : m + Math.log(Math.exp(a - m) + Math.exp(lp - m));
  });
  return out;
}

/**
 * Prompt → tokens → packed sequence. Pure given the build; used by the bench too.
 * `debias` (default: the configuration's default) adds each question's other
 * presentations as unbilled branches. Every presentation is kept whatever
 * the size: a request whose packed sequence exceeds the pass limit is read in
 * several passes over the same prefix (`readBranches`), so a question gets
 * the same answer among 64 others as alone.
 */
export function prepare(
  lb: LoadedBuild,
  state: State,
  questions: Record<string, Question>,
  timings?: Timings,
  opts: { debias?: Debias } = {},
): PreparedRequest {
  const t0 = performance.now();
  const debias = opts.debias ?? DEFAULT_DEBIAS;
  const prompt = buildPrompt(lb.style, state, questions, debias);
  const t1 = performance.now();
  const prefix = lb.tokenizer.encode(prompt.prefix);
  const encoded: EncodedQuestion[] = [];
  const blocks: number[][] = [];
  for (const [group, q] of prompt.questions.entries()) {
    const labels = q.labels.map((l) => labelIds(lb, l));
    const mine = [encoded.length];
    // Billing counts the caller's own wording of the question (see QuestionPrompt.billedSuffix).
    encoded.push({ suffix: lb.tokenizer.encode(q.suffix), labels, terminator: lb.terminator, billed: q.billedSuffix === undefined, group });
    for (const [j, v] of (q.variants ?? []).entries()) {
      mine.push(encoded.length);
      const own = q.variantLabels?.[j];
      encoded.push({ suffix: lb.tokenizer.encode(v), labels: own ? own.map((l) => labelIds(lb, l)) : labels, terminator: lb.terminator, billed: false, group });
    }
    blocks.push(mine);
  }
  const packed = pack(prefix, encoded);
  for (const q of prompt.questions) if (q.billedSuffix !== undefined) packed.promptTokens += lb.tokenizer.encode(q.billedSuffix).length;
  const t2 = performance.now();
  timings?.add("prompt", t1 - t0);
  timings?.add("tokenize", t2 - t1);
  return {
    packed,
    prefix,
    debias,
    source: { state, questions },
    encoded,
    questions: prompt.questions.map((q, i) => {
      const src = questions[q.id]!;
      const base = {
        id: q.id,
        type: q.type,
        keys: q.keys,
        option: q.option,
        blocks: blocks[i]!,
        ...(q.variantOptions ? { blockOptions: [q.option, ...q.variantOptions] } : {}),
      };
      return src.type === "score" ? { ...base, levels: src.criteria } : base;
    }),
  };
}


/** Whether the prepared request is one pass (the fast path: its own packed pass) or several over the same prefix. */
const fitsOnePass = (engine: Engine, lb: LoadedBuild, prepared: PreparedRequest, limit: number) =>
  prepared.packed.inputIds.length <= limit && engine.onePass(lb, prepared.prefix.length, prepared.encoded, limit);

/**
 * Every block's label log-probabilities: the packed pass where it fits and
 * the planner keeps it whole, else the blocks in as few passes over the same
 * prefix as the limit and their widths call for (Engine.scoreMany).
 */
export async function readBranches(engine: Engine, lb: LoadedBuild, prepared: PreparedRequest, limit: number, ctx: ScoreContext): Promise<number[][]> {
  if (fitsOnePass(engine, lb, prepared, limit)) return engine.run(lb, prepared.packed, ctx);
  return (await engine.scoreMany(lb, prepared.prefix, prepared.encoded, limit, ctx)).lps as number[][];
}

/**
 * The passes a general request will run, as admission counts them: its pass
 * (or passes), the content-free prior passes its calibration weighs in (less
 * what the prior cache holds for `orgId`), and the shortlist's second reading.
 */
export function plannedGeneral(fam: FamilyEnv, lb: LoadedBuild, prepared: PreparedRequest, orgId: string | undefined): PlannedPass[] {
  const limit = passLimit(lb, fam.maxPackedTokens);
  const priors = priorReads(prepared, calibrationForMode(lb.build.manifest.calibration, prepared.debias.mode));
  const passes = fitsOnePass(fam.engine, lb, prepared, limit) ? [prepared.packed] : fam.engine.plan(lb, prepared.prefix.length, prepared.encoded, limit);
  return fam.engine.planGeneral(lb, passes, priors, shortlisted(fam, lb, prepared).length > 0, { prefix: prepared.prefix, orgId, limit });
}

export async function runGeneral(fam: FamilyEnv, model: ResolvedModel, env: RequestEnvelope, ctx: PipelineContext): Promise<SystemOneResponse> {
  const questions = generalRequest(env);
  // Nothing is tokenized, held or charged while the build is not running.
  const release = fam.acquire(model.build, env.model);
  try {
    return await scoreGeneral(fam, fam.build(model.build), questions, env, ctx);
  } finally {
    release();
  }
}

async function scoreGeneral(
  fam: FamilyEnv,
  lb: LoadedBuild,
  questions: Record<string, Question>,
  env: RequestEnvelope,
  ctx: PipelineContext,
): Promise<SystemOneResponse> {
  const limit = passLimit(lb, fam.maxPackedTokens);
  const prepared = prepare(lb, env.state, questions, ctx.timings, { debias: fam.debias });
  // The questions are read in as many passes as they need; the state with one
  // question must fit in the model's context (a build that takes past keys and
  // values computes a state longer than one pass in chunks), else in one pass.
  const widest = Math.max(...prepared.encoded.map(branchCost));
  const room = lb.build.manifest.kv ? lb.build.manifest.context_length : limit;
  if (prepared.prefix.length + widest > room) {
    throw invalid(
      `request too long for model "${env.model}": the state takes ${prepared.prefix.length} tokens and its longest question ` +
        `(with its answer labels) ${widest}, over the ${lb.build.manifest.kv ? "model's context" : "limit per pass"} of ${room} tokens; send a shorter state or shorter questions`,
    );
  }
  // Admission by estimated work, before the credit hold (529 / 422 hold nothing).
  const work = fam.engine.admit(plannedGeneral(fam, lb, prepared, ctx.orgId), ctx);
  try {
    await ctx.admit?.(prepared.packed.promptTokens);
    const answers = await score(fam, lb, prepared, ctx);
    return {
      model: env.model,
      answers,
      usage: { input_tokens: prepared.packed.promptTokens, output_tokens: 0 },
    };
  } finally {
    work.release();
  }
}

async function score(fam: FamilyEnv, lb: LoadedBuild, prepared: PreparedRequest, ctx: PipelineContext): Promise<Record<string, Answer>> {
  const fit = calibrationForMode(lb.build.manifest.calibration, prepared.debias.mode);
  const readings = await read(fam, lb, prepared, fit, ctx);
  await shortlist(fam, lb, prepared, readings, fit, ctx);
  const t = performance.now();
  const answers: Record<string, Answer> = {};
  // A question's own map is looked up by its key, hashed only where the build has such maps.
  const own = fit?.questions && Object.keys(fit.questions).length > 0;
  prepared.questions.forEach((q, i) => {
    ctx.onReading?.(q.id, readings[i]!);
    answers[q.id] = answer(own ? { ...q, key: questionKey(prepared.source.questions[q.id]!) } : q, readings[i]!, fit);
  });
  ctx.timings.add("probability", performance.now() - t);
  return answers;
}

/**
 * Shortlist, then choose: a question with more options than are numbered
 * (BANKING77's 77 intents) is read once by key; its `shortlist` most likely
 * options are then asked again as a numbered question in all their cyclic
 * shifts (the readout that reads best with few options), against the same
 * state, in one more pass. The shortlist's share of probability is kept and
 * split as the second reading says; the other options keep the first
 * reading. Measured in docs/experiments/readout-study.md. Unbilled, like the
 * debias presentations: the caller's question was read as sent.
 */
async function shortlist(fam: FamilyEnv, lb: LoadedBuild, prepared: PreparedRequest, readings: QuestionReading[], fit: CalibrationFit | null, ctx: PipelineContext): Promise<void> {
  const k = shortlistSize(fam, lb);
  const src = prepared.source;
  const which = shortlisted(fam, lb, prepared);
  if (which.length === 0) return;
  const picks = new Map<number, number[]>();
  const sub: Record<string, Question> = {};
  which.forEach((i) => {
    const q = prepared.questions[i]!;
    const orig = src.questions[q.id];
    if (orig?.type !== "choice") return;
    const lp = readings[i]!.lp;
    const top = lp.map((_, j) => j).sort((a, b) => lp[b]! - lp[a]!).slice(0, k);
    picks.set(i, top);
    sub[q.id] = { ...orig, criteria: Object.fromEntries(top.map((j) => [q.keys[j]!, orig.criteria[q.keys[j]!] ?? null])) };
  });
  if (picks.size === 0) return;
  const second = prepare(lb, src.state, sub, ctx.timings, { debias: fam.debias });
  const again = await read(fam, lb, second, fit, ctx);
  const byId = new Map(second.questions.map((q, j) => [q.id, j]));
  for (const [i, top] of picks) {
    const q = prepared.questions[i]!;
    const j = byId.get(q.id)!;
    const keys = second.questions[j]!.keys;
    const z = logSumExp(readings[i]!.lp);
    const lp = readings[i]!.lp.map((x) => x - z);
    const share = logSumExp(top.map((o) => lp[o]!));
    const z2 = logSumExp(again[j]!.lp);
    keys.forEach((key, n) => (lp[q.keys.indexOf(key)] = share + again[j]!.lp[n]! - z2));
    readings[i] = { lp, presentations: [lp], raw: lp, prior: null, shortlisted: true };
  }
}

/** ASSAY_SHORTLIST, lowered by the build's fit where a shortlist was measured not to help it. */
function shortlistSize(fam: FamilyEnv, lb: LoadedBuild): number {
  const own = lb.build.manifest.calibration?.shortlist;
  return own === undefined ? fam.shortlist : Math.min(own, fam.shortlist);
}

/** Indices of the questions read again over a shortlist. */
function shortlisted(fam: FamilyEnv, lb: LoadedBuild, prepared: PreparedRequest): number[] {
  const k = shortlistSize(fam, lb);
  if (k < 2) return [];
  return prepared.questions.flatMap((q, i) => (q.type === "choice" && q.keys.length > Math.max(k, NUMBERED_MAX_OPTIONS) ? [i] : []));
}

/**
 * Per question, what was read: every presentation, the prior taken off,
 * averaged (the answer's log-probabilities), and beside it each
 * presentation, the average without the prior and the prior itself (what a
 * confidence map reads, src/probability/confidence.ts).
 */
async function read(fam: FamilyEnv, lb: LoadedBuild, prepared: PreparedRequest, fit: CalibrationFit | null, ctx: PipelineContext): Promise<QuestionReading[]> {
  const lps = await readBranches(fam.engine, lb, prepared, passLimit(lb, fam.maxPackedTokens), ctx);
  const priors = await readPriors(fam, lb, prepared, fit, ctx);
  const mean = (rs: number[][]) => (rs.length === 1 ? rs[0]! : averageReadings(rs));
  return prepared.questions.map((q) => {
    const w = fit?.prior?.[q.type] ?? 0;
    const raw: number[][] = [];
    const content: number[][] = [];
    const presentations = q.blocks.map((b, j) => {
      const option = q.blockOptions?.[j] ?? q.option;
      // Score level names differ in length ("negative", "very negative"):
      // a level is read by its mean log-probability per token, so that a
      // longer name is not penalised for its length (the readout study).
      const perToken = (xs: readonly number[]) =>
        q.type === "score" ? xs.map((x, l) => x / Math.max(1, prepared.encoded[b]!.labels[l]!.length)) : xs;
      const lp = optionLogprobs(q, perToken(lps[b]!), option);
      raw.push(lp);
      const prior = priors.get(b);
      if (!(prior && w > 0)) return lp;
      const p = optionLogprobs(q, perToken(prior), option);
      content.push(p);
      return subtractPrior(lp, p, w);
    });
    return {
      lp: mean(presentations),
      presentations,
      raw: mean(raw),
      prior: content.length === presentations.length ? mean(content) : null,
      shortlisted: false,
    };
  });
}

/**
 * The content-free prior readings a request needs: per neutral state, the
 * blocks of the questions whose type has a prior weight (each type reads its
 * prior against its own neutral state, prior_state; "N/A" by default).
 * Admission plans these and readPriors reads them: one grouping for both.
 */
export function priorReads(prepared: PreparedRequest, fit: CalibrationFit | null): (PriorRead & { blocks: number[] })[] {
  if (!fit?.prior) return [];
  const byNeutral = new Map<string, number[]>();
  prepared.questions.forEach((q) => {
    if (!((fit.prior?.[q.type] ?? 0) > 0)) return;
    const neutral = fit.prior_state?.[q.type] ?? NEUTRAL_STATE;
    byNeutral.set(neutral, [...(byNeutral.get(neutral) ?? []), ...q.blocks]);
  });
  return [...byNeutral].map(([neutral, blocks]) => ({ neutral, blocks, branches: blocks.map((b) => prepared.encoded[b]!) }));
}

/** Content-free readings of the blocks whose question type has a prior weight, by block index. */
async function readPriors(fam: FamilyEnv, lb: LoadedBuild, prepared: PreparedRequest, fit: CalibrationFit | null, ctx: PipelineContext): Promise<Map<number, number[]>> {
  const out = new Map<number, number[]>();
  const limit = passLimit(lb, fam.maxPackedTokens);
  for (const { neutral, blocks, branches } of priorReads(prepared, fit)) {
    const reads = await fam.engine.prior(lb, neutral, branches, limit, ctx);
    blocks.forEach((b, n) => out.set(b, reads[n]!));
  }
  return out;
}

