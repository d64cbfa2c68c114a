/**
 * In-process scoring: the same EnginePipeline.run the HTTP route calls, with
 * the model loaded in this process. No server, no key, no credit.
 */
import type { Config } from "../config/index.js";
import { isAssayError } from "../errors/catalogue.js";
import { passLimit } from "../engine/index.js";
import { prepare } from "../families/general.js";
import { EnginePipeline } from "../pipeline/index.js";
import { Timings } from "../pipeline/timings.js";
import { generalQuestions, type RequestEnvelope, type SystemOneResponse } from "../validate/schema.js";
import { ScoreError } from "./records.js";
import type { GroupInfo, Scorer } from "./scorer.js";

export class EngineScorer implements Scorer {
  readonly description: string;

  constructor(
    readonly pipeline: EnginePipeline,
    private readonly config: Config,
    private readonly ownsPipeline = true,
  ) {
    const def = pipeline.registry.file.default;
    this.description = `in-process ${def} (build ${pipeline.build(def).build.manifest.build_hash})`;
  }

  static async create(config: Config, log: (msg: string) => void = () => {}): Promise<EngineScorer> {
    return new EngineScorer(await EnginePipeline.create(config, log), config);
  }

  async score(request: RequestEnvelope, requestId: string): Promise<SystemOneResponse> {
    try {
      return await this.pipeline.run(request, { requestId, orgId: "batch", timings: new Timings() });
    } catch (e) {
      if (isAssayError(e)) {
        throw new ScoreError(e.status, typeof e.detail === "string" ? e.detail : e.message, e.code, e.retryAfterSeconds);
      }
      throw new ScoreError(500, `internal error: ${e instanceof Error ? e.message : String(e)}`, "INTERNAL");
    }
  }

  groupInfo(request: RequestEnvelope): GroupInfo | null {
    const reg = this.pipeline.registry;
    if (!reg.has(request.model)) return null;
    if (reg.resolve(request.model).family !== "general") return null;
    const parsed = generalQuestions().safeParse(request.questions);
    if (!parsed.success) return null; // runs alone, so that the error is its own
    const lb = this.pipeline.build(request.model);
    let packed;
    try {
      packed = prepare(lb, request.state, parsed.data).packed;
    } catch {
      return null;
    }
    return {
      key: `${request.model}\u0000${JSON.stringify(request.state)}`,
      questions: Object.keys(parsed.data).length,
      prefixTokens: packed.prefixLength,
      questionTokens: packed.promptTokens - packed.prefixLength,
      blockTokens: packed.inputIds.length - packed.prefixLength,
      maxPackedTokens: passLimit(lb, this.config.maxPackedTokens),
    };
  }

  family(model: string): "general" | "factcheck" | "codesearch" | null {
    return this.pipeline.registry.has(model) ? this.pipeline.registry.resolve(model).family : null;
  }

  async close(): Promise<void> {
    if (this.ownsPipeline) await this.pipeline.close();
  }
}
