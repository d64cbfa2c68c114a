import type { Config } from "../config/index.js";
import { AssayError, invalid } from "../errors/catalogue.js";
import { readBuild, type ModelBuild } from "../models/manifest.js";
import { ModelRegistry, type ResolvedModel } from "../models/registry.js";
import { buildPrompt, DEFAULT_DEBIAS, DEFAULT_MAX_PACKED_TOKENS, NO_DEBIAS, styleFromTemplate, type Debias, type PromptStyle } from "../prompt/index.js";
import { TextTokenizer } from "../tokenizer/index.js";
import { pack, readLabels, type EncodedQuestion, type PackedRequest } from "../inference/pack.js";
import { InferencePool } from "../inference/pool.js";
import { answer, averageReadings, calibrationForMode } from "../probability/index.js";
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
import type { Timings } from "./timings.js";

/** What a loaded model build needs on the request path, made once at load. */
export interface LoadedBuild {
  build: ModelBuild;
  tokenizer: TextTokenizer;
  style: PromptStyle;
  terminator: number;
  /** Label text → token ids, per build: option labels are tokenized once. */
  labelCache: Map<string, number[]>;
}

export function loadBuild(dir: string): LoadedBuild {
  const build = readBuild(dir);
  const tokenizer = new TextTokenizer(build);
  const style = styleFromTemplate(build.manifest.chat_template);
  const endToken = style.kind === "chatml" ? style.end : build.manifest.special_tokens.eos;
  const terminator = (endToken ? tokenizer.specialId(endToken) : undefined) ?? build.manifest.eos_token_id;
  if (terminator === undefined || terminator === null) throw new Error(`${dir}: no end-of-turn token`);
  return { build, tokenizer, style, terminator, labelCache: new Map() };
}

export interface PreparedQuestion {
  id: string;
  type: Question["type"];
  keys: string[];
  levels?: string[];
  /** Option index of each label read (several surface forms may share one). */
  option: number[];
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
}

/** ASSAY_DEBIAS / ASSAY_DEBIAS_MAX_SHIFTS as the prompt layer takes them. */
export function debiasOf(config: Pick<Config, "debias"> & { debiasMaxShifts?: number }): Debias {
  return config.debias === "off" ? NO_DEBIAS : { mode: config.debias, maxShifts: config.debiasMaxShifts ?? DEFAULT_DEBIAS.maxShifts };
}

const sameDebias = (a: Debias | undefined, b: Debias) => a !== undefined && a.mode === b.mode && (a.mode === "off" || a.maxShifts === b.maxShifts);

/** Per option, the log of the summed probability of its labels. */
export function optionLogprobs(q: PreparedQuestion, labelLp: readonly number[]): number[] {
  const out = new Array<number>(q.keys.length).fill(-Infinity);
  labelLp.forEach((lp, i) => {
    const o = q.option[i]!;
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
  const labelIds = (label: string): number[] => {
    let ids = lb.labelCache.get(label);
    if (!ids) {
      ids = lb.tokenizer.encode(label);
      if (lb.labelCache.size < 100_000) lb.labelCache.set(label, ids);
    }
    return ids;
  };
  const prefix = lb.tokenizer.encode(prompt.prefix);
  let packed: PackedRequest;
  let blocks: number[][];
  for (;;) {
    const encoded: EncodedQuestion[] = [];
    blocks = [];
    for (const q of prompt.questions) {
      const labels = q.labels.map(labelIds);
      const mine = [encoded.length];
      encoded.push({ suffix: lb.tokenizer.encode(q.suffix), labels, terminator: lb.terminator });
      for (const v of q.variants ?? []) {
        mine.push(encoded.length);
        encoded.push({ suffix: lb.tokenizer.encode(v), labels, terminator: lb.terminator, billed: false });
      }
      blocks.push(mine);
    }
    packed = pack(prefix, encoded);
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
    questions: prompt.questions.map((q, i) => {
      const src = questions[q.id]!;
      const base = { id: q.id, type: q.type, keys: q.keys, option: q.option, blocks: blocks[i]! };
      return src.type === "score" ? { ...base, levels: src.criteria } : base;
    }),
  };
}

export class EnginePipeline implements Pipeline {
  private readonly builds = new Map<string, LoadedBuild>();
  private warm = false;

  private constructor(
    private readonly config: Config,
    readonly registry: ModelRegistry,
    readonly pool: InferencePool,
  ) {}

  /** Loads every configured build and warms the default model on every lane. */
  static async create(config: Config, log: (msg: string) => void = () => {}): Promise<EnginePipeline> {
    const registry = ModelRegistry.load(config.modelsConfig, config.modelsDir);
    const pool = new InferencePool(config);
    const p = new EnginePipeline(config, registry, pool);
    try {
      const def = registry.resolve(registry.file.default);
      for (const name of registry.names()) {
        const r = registry.resolve(name);
        if (!p.builds.has(r.build)) p.builds.set(r.build, loadBuild(r.buildDir));
      }
      const lb = p.builds.get(def.build)!;
      const loads = await pool.setLoaded(lb.build.onnxPath, true);
      log(`model ${def.target} (${lb.build.manifest.build_hash}) loaded on ${loads.map((l) => l.provider).join(", ")}`);
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
        ready: this.warm,
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
    if (model.family !== "general") {
      throw invalid(`model "${env.model}" (${model.family}) is not served by this deployment yet`);
    }
    const parsed = generalQuestions().safeParse(env.questions);
    if (!parsed.success) throw invalid(describeZodError(parsed.error).replace(/^body/, "questions"));
    const lb = this.builds.get(model.build)!;
    const prepared = prepare(lb, env.state, parsed.data, ctx.timings);
    const limit = Math.min(this.config.maxPackedTokens, lb.build.manifest.context_length);
    if (prepared.packed.inputIds.length > limit) {
      throw invalid(
        `request too long for model "${env.model}": ${prepared.packed.inputIds.length} tokens to process ` +
          `(state + questions + answer labels), limit ${limit}; send a shorter state or fewer questions`,
      );
    }
    await ctx.admit?.(prepared.packed.promptTokens);
    const answers = await this.score(lb, prepared, ctx);
    return {
      model: env.model,
      answers,
      usage: { input_tokens: prepared.packed.promptTokens, output_tokens: 0 },
    };
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
    const q0 = performance.now();
    const out = await this.pool.infer(lb.build.onnxPath, prepared.packed, ctx.signal);
    const total = performance.now() - q0;
    ctx.timings.add("inference", out.runMs);
    ctx.timings.add("queue", Math.max(0, total - out.runMs));
    const t = performance.now();
    const lps = readLabels(prepared.packed, out.logprobs);
    const answers: Record<string, Answer> = {};
    const fit = calibrationForMode(lb.build.manifest.calibration, prepared.debias?.mode ?? "off");
    prepared.questions.forEach((q, i) => {
      const readings = (q.blocks ?? [i]).map((b) => optionLogprobs(q, lps[b]!));
      if (readings.some((lp) => lp.some((x) => !Number.isFinite(x)))) {
        throw new AssayError("MODEL_FAILED", `the model returned non-finite log-probabilities for question "${q.id}"`);
      }
      const lp = readings.length === 1 ? readings[0]! : averageReadings(readings);
      answers[q.id] = answer(q, lp, fit);
    });
    ctx.timings.add("probability", performance.now() - t);
    return answers;
  }

  async close(): Promise<void> {
    this.warm = false;
    await this.pool.close();
  }
}
