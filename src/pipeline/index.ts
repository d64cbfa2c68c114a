import type { Config } from "../config/index.js";
import { AssayError, invalid } from "../errors/catalogue.js";
import { ModelRegistry, type ResolvedModel } from "../models/registry.js";
import { buildPrompt, DEFAULT_DEBIAS, DEFAULT_MAX_PACKED_TOKENS, NO_DEBIAS, NUMBERED_MAX_OPTIONS, type Debias } from "../prompt/index.js";
import { labelIds, loadBuild, type LoadedBuild } from "./build.js";
import { pack, readLabels, type EncodedQuestion, type PackedRequest } from "../inference/pack.js";
import { InferencePool } from "../inference/pool.js";
import { generalPasses } from "../inference/cost.js";
import { workRequest } from "../inference/work.js";
import { answer, averageReadings, calibrationForMode, logSumExp } from "../probability/index.js";
import {
  describeZodError,
  generalQuestions,
  type Answer,
  type Question,
  type RequestEnvelope,
  type State,
  type SystemOneResponse,
} from "../validate/schema.js";
import type { ModelListing, Pipeline, PipelineContext } from "./types.js";
import { ModelLifecycle } from "../models/lifecycle.js";
import { parseSchedule } from "../models/schedule.js";
import { runCodeSearch } from "../families/codesearch.js";
import { runFactCheck } from "../families/factcheck.js";
import type { FamilyEnv } from "../families/types.js";
import type { Timings } from "./timings.js";
import { NEUTRAL_STATE, PriorCache, subtractPrior } from "./prior.js";
import type { CalibrationFit } from "../models/manifest.js";

export { loadBuild, type LoadedBuild } from "./build.js";

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
   * are averaged. Absent: the question's own index.
   */
  blocks?: number[];
}

export interface PreparedRequest {
  packed: PackedRequest;
  questions: PreparedQuestion[];
  /**
   * Option-order debiasing asked for (a long request may have been packed
   * with fewer presentations than `maxShifts`, see `prepare`).
   */
  debias?: Debias;
  /** What it was prepared from, so that it can be packed again another way. */
  source?: { state: State; questions: Record<string, Question> };
  /** The packed blocks as encoded, in block order: what a content-free prior reads again. */
  encoded?: EncodedQuestion[];
}

/** ASSAY_DEBIAS / ASSAY_DEBIAS_MAX_SHIFTS as the prompt layer takes them. */
export function debiasOf(config: Pick<Config, "debias"> & { debiasMaxShifts?: number }): Debias {
  return config.debias === "off" ? NO_DEBIAS : { mode: config.debias, maxShifts: config.debiasMaxShifts ?? DEFAULT_DEBIAS.maxShifts };
}

const sameDebias = (a: Debias | undefined, b: Debias) => a !== undefined && a.mode === b.mode && (a.mode === "off" || a.maxShifts === b.maxShifts);

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
 * presentations as unbilled branches; when `maxTokens` is given and the
 * packed sequence would exceed it, fewer presentations are used (down to one,
 * which under `cyclic` is still the canonical order), never a longer request.
 */
export function prepare(
  lb: LoadedBuild,
  state: State,
  questions: Record<string, Question>,
  timings?: Timings,
  opts: { debias?: Debias; maxTokens?: number } = {},
): PreparedRequest {
  const t0 = performance.now();
  const requested = opts.debias ?? DEFAULT_DEBIAS;
  // Callers that give no limit get the model's context, capped at the default ASSAY_MAX_PACKED_TOKENS.
  const maxTokens = opts.maxTokens ?? Math.min(lb.build.manifest.context_length, DEFAULT_MAX_PACKED_TOKENS);
  let debias = requested;
  let prompt = buildPrompt(lb.style, state, questions, debias);
  const t1 = performance.now();
  const prefix = lb.tokenizer.encode(prompt.prefix);
  let packed: PackedRequest;
  let blocks: number[][];
  let encoded: EncodedQuestion[];
  for (;;) {
    encoded = [];
    blocks = [];
    for (const q of prompt.questions) {
      const labels = q.labels.map((l) => labelIds(lb, l));
      const mine = [encoded.length];
      // Billing counts the caller's own wording of the question (see QuestionPrompt.billedSuffix).
      encoded.push({ suffix: lb.tokenizer.encode(q.suffix), labels, terminator: lb.terminator, billed: q.billedSuffix === undefined });
      for (const [j, v] of (q.variants ?? []).entries()) {
        mine.push(encoded.length);
        const own = q.variantLabels?.[j];
        encoded.push({ suffix: lb.tokenizer.encode(v), labels: own ? own.map((l) => labelIds(lb, l)) : labels, terminator: lb.terminator, billed: false });
      }
      blocks.push(mine);
    }
    packed = pack(prefix, encoded);
    for (const q of prompt.questions) if (q.billedSuffix !== undefined) packed.promptTokens += lb.tokenizer.encode(q.billedSuffix).length;
    if (encoded.length === prompt.questions.length || debias.maxShifts <= 1 || packed.inputIds.length <= maxTokens) break;
    debias = { ...debias, maxShifts: Math.floor(debias.maxShifts / 2) };
    prompt = buildPrompt(lb.style, state, questions, debias);
  }
  const t2 = performance.now();
  timings?.add("prompt", t1 - t0);
  timings?.add("tokenize", t2 - t1);
  return {
    packed,
    debias: requested,
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
        // Blocks dropped for length (above) are the trailing variants: their maps go with them.
        ...(q.variantOptions ? { blockOptions: [q.option, ...q.variantOptions].slice(0, blocks[i]!.length) } : {}),
      };
      return src.type === "score" ? { ...base, levels: src.criteria } : base;
    }),
  };
}

export class EnginePipeline implements Pipeline {
  private readonly builds = new Map<string, LoadedBuild>();
  /** Content-free readings of questions, per build (src/pipeline/prior.ts). */
  readonly priors = new PriorCache();
  private warm = false;
  private readonly families: FamilyEnv;

  private constructor(
    private readonly config: Config,
    readonly registry: ModelRegistry,
    readonly pool: InferencePool,
    readonly lifecycle: ModelLifecycle,
  ) {
    this.families = {
      pool,
      build: (name) => {
        const lb = this.builds.get(name);
        if (!lb) throw new Error(`model build "${name}" is not loaded in this process`);
        return lb;
      },
      acquire: (build, forModel) => lifecycle.acquire(build, forModel),
      maxPackedTokens: config.maxPackedTokens,
      priors: this.priors,
    };
  }

  /** Loads every configured build and warms the default model on every lane. */
  static async create(config: Config, log: (msg: string) => void = () => {}): Promise<EnginePipeline> {
    const registry = ModelRegistry.load(config.modelsConfig, config.modelsDir);
    const pool = new InferencePool(config);
    const lifecycle = new ModelLifecycle(pool, {
      schedule: parseSchedule(config.modelSchedule),
      idleUnloadMs: config.modelIdleUnloadMs,
      log,
    });
    const p = new EnginePipeline(config, registry, pool, lifecycle);
    try {
      const def = registry.resolve(registry.file.default);
      for (const build of registry.usedBuilds()) {
        const lb = loadBuild(registry.buildDir(build));
        p.builds.set(build, lb);
        lifecycle.register(build, lb.build.onnxPath, registry.availability(build));
      }
      const lb = p.builds.get(def.build)!;
      // The default build first: it is what readiness waits for.
      const boot = lifecycle.bootBuilds().sort((a, b) => Number(b === def.build) - Number(a === def.build));
      for (const build of boot) await lifecycle.load(build);
      log(`models loaded: ${boot.map((b) => `${b} (${p.builds.get(b)!.build.manifest.build_hash})`).join(", ")}`);
      lifecycle.start();
      // One small pass so the first request does not pay for kernel set-up.
      const warmup = prepare(lb, "warm-up", { q: { type: "noul", instructions: "warm" } });
      await pool.infer(lb.build.onnxPath, warmup.packed);
      p.warm = true;
    } catch (e) {
      await pool.close();
      throw e;
    }
    return p;
  }

  ready(): boolean {
    return this.warm;
  }

  /**
   * Loads the default build into the express workers now rather than on
   * first need (InferencePool.preloadExpress). The server does it before it
   * reports ready; the CLI tools, whose passes all belong to one caller and
   * never go beside each other, do not.
   */
  async preloadExpress(): Promise<void> {
    await this.pool.preloadExpress(this.build(this.registry.file.default).build.onnxPath);
  }

  build(name: string): LoadedBuild {
    return this.builds.get(this.registry.resolve(name).build)!;
  }

  listModels(): ModelListing[] {
    return this.registry.names().map((id) => {
      const r = this.registry.resolve(id);
      return {
        id,
        family: r.family,
        alias_of: r.aliasOf,
        deprecated: r.deprecated,
        build: this.builds.get(r.build)?.build.manifest.build_hash ?? null,
        ready: this.warm && this.lifecycle.state(r.build) === "loaded",
      };
    });
  }

  private resolve(name: string): ResolvedModel {
    if (!this.registry.has(name)) {
      throw invalid(`unknown model "${name}"; available models: ${this.registry.names().join(", ")}`);
    }
    return this.registry.resolve(name);
  }

  async run(env: RequestEnvelope, ctx: PipelineContext): Promise<SystemOneResponse> {
    const model = this.resolve(env.model);
    if (model.family === "codesearch") return runCodeSearch(this.families, model, env, ctx);
    if (model.family === "factcheck") {
      return runFactCheck(this.families, model, env, ctx, this.config.factcheckChunkTokens, this.config.factcheckChunkOverlap);
    }
    const release = this.lifecycle.acquire(model.build, env.model);
    try {
      return await this.runGeneral(model, env, ctx);
    } finally {
      release();
    }
  }

  private async runGeneral(model: ResolvedModel, env: RequestEnvelope, ctx: PipelineContext): Promise<SystemOneResponse> {
    const parsed = generalQuestions().safeParse(env.questions);
    if (!parsed.success) throw invalid(describeZodError(parsed.error).replace(/^body/, "questions"));
    const lb = this.builds.get(model.build)!;
    const limit = Math.min(this.config.maxPackedTokens, lb.build.manifest.context_length);
    // Debias presentations are dropped before the request is refused: only the
    // caller's own questions have to fit.
    const prepared = prepare(lb, env.state, parsed.data, ctx.timings, { debias: debiasOf(this.config), maxTokens: limit });
    if (prepared.packed.inputIds.length > limit) {
      throw invalid(
        `request too long for model "${env.model}": ${prepared.packed.inputIds.length} tokens to process ` +
          `(state + questions + answer labels), limit ${limit}; send a shorter state or fewer questions`,
      );
    }
    // Admission by estimated work, before the credit hold (529 / 422 hold nothing): the
    // pass, and a content-free prior pass where the calibration weighs one in.
    const priorPass = Object.values(calibrationForMode(lb.build.manifest.calibration, prepared.debias?.mode ?? "off")?.prior ?? {}).some((w) => w > 0);
    const work = this.pool.admit(generalPasses(lb.build.onnxPath, prepared.packed, priorPass, this.shortlisted(lb, prepared).length > 0), workRequest(ctx));
    try {
      await ctx.admit?.(prepared.packed.promptTokens);
      const answers = await this.score(lb, prepared, ctx);
      return {
        model: env.model,
        answers,
        usage: { input_tokens: prepared.packed.promptTokens, output_tokens: 0 },
      };
    } finally {
      work.release();
    }
  }

  private async score(lb: LoadedBuild, prepared: PreparedRequest, ctx: PipelineContext): Promise<Record<string, Answer>> {
    const debias = debiasOf(this.config);
    if (!sameDebias(prepared.debias, debias) && prepared.source) {
      // Prepared under another debias setting than this deployment's (a
      // caller that did not pass it): pack again. Billing keeps the count the
      // caller already admitted.
      const limit = Math.min(this.config.maxPackedTokens, lb.build.manifest.context_length);
      prepared = prepare(lb, prepared.source.state, prepared.source.questions, undefined, { debias, maxTokens: limit });
    }
    const fit = calibrationForMode(lb.build.manifest.calibration, prepared.debias?.mode ?? "off");
    const readings = await this.read(lb, prepared, fit, ctx);
    await this.shortlist(lb, prepared, readings, fit, ctx);
    const t = performance.now();
    const answers: Record<string, Answer> = {};
    prepared.questions.forEach((q, i) => (answers[q.id] = answer(q, readings[i]!, fit)));
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
   * reading. Measured in bench/RESULTS.md (issue 18). Unbilled, like the
   * debias presentations: the caller's question was read as sent.
   */
  private async shortlist(lb: LoadedBuild, prepared: PreparedRequest, readings: number[][], fit: CalibrationFit | null, ctx: PipelineContext): Promise<void> {
    const k = this.shortlistSize(lb);
    const src = prepared.source;
    const which = this.shortlisted(lb, prepared);
    if (which.length === 0 || !src) return;
    const picks = new Map<number, number[]>();
    const sub: Record<string, Question> = {};
    which.forEach((i) => {
      const q = prepared.questions[i]!;
      const orig = src.questions[q.id];
      if (orig?.type !== "choice") return;
      const lp = readings[i]!;
      const top = lp.map((_, j) => j).sort((a, b) => lp[b]! - lp[a]!).slice(0, k);
      picks.set(i, top);
      sub[q.id] = { ...orig, criteria: Object.fromEntries(top.map((j) => [q.keys[j]!, orig.criteria[q.keys[j]!] ?? null])) };
    });
    if (picks.size === 0) return;
    const limit = Math.min(this.config.maxPackedTokens, lb.build.manifest.context_length);
    const second = prepare(lb, src.state, sub, ctx.timings, { debias: debiasOf(this.config), maxTokens: limit });
    const again = await this.read(lb, second, fit, ctx);
    const byId = new Map(second.questions.map((q, j) => [q.id, j]));
    for (const [i, top] of picks) {
      const q = prepared.questions[i]!;
      const j = byId.get(q.id)!;
      const keys = second.questions[j]!.keys;
      const z = logSumExp(readings[i]!);
      const lp = readings[i]!.map((x) => x - z);
      const share = logSumExp(top.map((o) => lp[o]!));
      const z2 = logSumExp(again[j]!);
      keys.forEach((key, n) => (lp[q.keys.indexOf(key)] = share + again[j]![n]! - z2));
      readings[i] = lp;
    }
  }

  /** ASSAY_SHORTLIST, lowered by the build's fit where a shortlist was measured not to help it. */
  private shortlistSize(lb: LoadedBuild): number {
    const own = lb.build.manifest.calibration?.shortlist;
    return own === undefined ? this.config.shortlist : Math.min(own, this.config.shortlist);
  }

  /** Indices of the questions read again over a shortlist. */
  private shortlisted(lb: LoadedBuild, prepared: PreparedRequest): number[] {
    const k = this.shortlistSize(lb);
    if (k < 2 || !prepared.source) return [];
    return prepared.questions.flatMap((q, i) => (q.type === "choice" && q.keys.length > Math.max(k, NUMBERED_MAX_OPTIONS) ? [i] : []));
  }

  /** Per question, its options' log-probabilities: every presentation read, the prior taken off, averaged. */
  private async read(lb: LoadedBuild, prepared: PreparedRequest, fit: CalibrationFit | null, ctx: PipelineContext): Promise<number[][]> {
    const q0 = performance.now();
    const out = await this.pool.infer(lb.build.onnxPath, prepared.packed, ctx.signal);
    const total = performance.now() - q0;
    ctx.timings.add("inference", out.runMs);
    ctx.timings.add("queue", Math.max(0, total - out.runMs));
    const lps = readLabels(prepared.packed, out.logprobs);
    const priors = await this.readPriors(lb, prepared, fit, ctx);
    return prepared.questions.map((q, i) => {
      const w = fit?.prior?.[q.type] ?? 0;
      const readings = (q.blocks ?? [i]).map((b, j) => {
        const option = q.blockOptions?.[j] ?? q.option;
        // Score level names differ in length ("negative", "very negative"):
        // a level is read by its mean log-probability per token, so that a
        // longer name is not penalised for its length (the readout study).
        const perToken = (xs: readonly number[]) =>
          q.type === "score" && prepared.encoded ? xs.map((x, l) => x / Math.max(1, prepared.encoded![b]!.labels[l]!.length)) : xs;
        const lp = optionLogprobs(q, perToken(lps[b]!), option);
        const prior = priors.get(b);
        return prior && w > 0 ? subtractPrior(lp, optionLogprobs(q, perToken(prior), option), w) : lp;
      });
      if (readings.some((lp) => lp.some((x) => !Number.isFinite(x)))) {
        throw new AssayError("MODEL_FAILED", `the model returned non-finite log-probabilities for question "${q.id}"`);
      }
      return readings.length === 1 ? readings[0]! : averageReadings(readings);
    });
  }

  /** Content-free readings of the blocks whose question type has a prior weight, by block index. */
  private async readPriors(lb: LoadedBuild, prepared: PreparedRequest, fit: CalibrationFit | null, ctx: PipelineContext): Promise<Map<number, number[]>> {
    const out = new Map<number, number[]>();
    if (!fit?.prior || !prepared.encoded) return out;
    const t0 = performance.now();
    const limit = Math.min(this.config.maxPackedTokens, lb.build.manifest.context_length);
    // Each type reads its prior against its own neutral state (prior_state; "N/A" by default).
    const byNeutral = new Map<string, number[]>();
    prepared.questions.forEach((q, i) => {
      if (!((fit.prior?.[q.type] ?? 0) > 0)) return;
      const neutral = fit.prior_state?.[q.type] ?? NEUTRAL_STATE;
      byNeutral.set(neutral, [...(byNeutral.get(neutral) ?? []), ...(q.blocks ?? [i])]);
    });
    for (const [neutral, blocks] of byNeutral) {
      const reads = await this.priors.read(lb, this.pool, neutral, blocks.map((b) => prepared.encoded![b]!), limit, ctx.signal);
      blocks.forEach((b, n) => out.set(b, reads[n]!));
    }
    // The prior pass is model work like the main pass (a cache hit costs nothing here).
    if (byNeutral.size > 0) ctx.timings.add("inference", performance.now() - t0);
    return out;
  }

  async close(): Promise<void> {
    this.warm = false;
    this.lifecycle.stop();
    await this.pool.close();
  }
}
