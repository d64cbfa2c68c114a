import type { Config } from "../config/index.js";
import { Engine, PrefixCache, loadBuild, type LoadedBuild } from "../engine/index.js";
import { InferencePool } from "../inference/pool.js";
import { cpuInt8Products, INT8_GRAPH, int8Products } from "../models/int8.js";
import { ModelLifecycle } from "../models/lifecycle.js";
import { ModelRegistry, type ResolvedModel } from "../models/registry.js";
import { GPU16_GRAPH, GPU_GRAPH, type ReadBuildOptions } from "../models/manifest.js";
import { parseSchedule } from "../models/schedule.js";
import { DEFAULT_DEBIAS, NO_DEBIAS, type Debias } from "../prompt/index.js";
import { runCodeSearch } from "../families/codesearch.js";
import { runFactCheck } from "../families/factcheck.js";
import { plannedGeneral, prepare, runGeneral } from "../families/general.js";
import type { FamilyEnv } from "../families/types.js";
import { unknownModel } from "../validate/families.js";
import type { RequestEnvelope, SystemOneResponse } from "../validate/schema.js";
import type { ModelListing, Pipeline, PipelineContext } from "./types.js";

/** ASSAY_DEBIAS / ASSAY_DEBIAS_MAX_SHIFTS as the prompt layer takes them. */
function debiasOf(config: Pick<Config, "debias"> & { debiasMaxShifts?: number }): Debias {
  return config.debias === "off" ? NO_DEBIAS : { mode: config.debias, maxShifts: config.debiasMaxShifts ?? DEFAULT_DEBIAS.maxShifts };
}

export class EnginePipeline implements Pipeline {
  private readonly builds = new Map<string, LoadedBuild>();
  readonly engine: Engine;
  private warm = false;
  private readonly families: FamilyEnv;

  /** The packed-token limit per pass (ASSAY_MAX_PACKED_TOKENS): what a request's passes are planned against. */
  get maxPackedTokens(): number {
    return this.families.maxPackedTokens;
  }

  private constructor(
    config: Config,
    readonly registry: ModelRegistry,
    readonly pool: InferencePool,
    readonly lifecycle: ModelLifecycle,
  ) {
    this.engine = new Engine(pool, new PrefixCache(config.prefixCache.bytes, config.prefixCache.scope), true, {
      stateChunk: config.stateChunkTokens,
      attentionBytes: config.passAttentionBytes,
    });
    this.families = {
      engine: this.engine,
      build: (name) => {
        const lb = this.builds.get(name);
        if (!lb) throw new Error(`model build "${name}" is not loaded in this process`);
        return lb;
      },
      acquire: (build, forModel) => lifecycle.acquire(build, forModel),
      maxPackedTokens: config.maxPackedTokens,
      debias: debiasOf(config),
      shortlist: config.shortlist,
      factcheckReading: { chunkTokens: config.factcheckChunkTokens, overlap: config.factcheckChunkOverlap, evidenceTokens: config.factcheckEvidenceTokens },
    };
  }

  /**
   * Loads every configured build and warms the default model on every lane.
   * `calibration` replaces the fit of the build behind one model name, at
   * load (the offline tools: eval and calibrate read a build raw or under
   * another file).
   */
  static async create(
    config: Config,
    log: (msg: string) => void = () => {},
    opts: { calibration?: { model: string; fit: NonNullable<ReadBuildOptions["calibration"]> } } = {},
  ): Promise<EnginePipeline> {
    const registry = ModelRegistry.load(config.modelsConfig, config.modelsDir);
    // A GPU lane that falls back to the CPU swaps the GPU graph for the one this CPU runs exactly.
    const pool = new InferencePool(config, { cpuGraph: { from: [GPU_GRAPH.file, GPU16_GRAPH.file, INT8_GRAPH.s8s8], to: INT8_GRAPH[cpuInt8Products().use] } });
    const lifecycle = new ModelLifecycle(pool, {
      schedule: parseSchedule(config.modelSchedule),
      idleUnloadMs: config.modelIdleUnloadMs,
      log,
    });
    const p = new EnginePipeline(config, registry, pool, lifecycle);
    try {
      const def = registry.resolve(registry.file.default);
      const override = opts.calibration && registry.has(opts.calibration.model) ? registry.resolve(opts.calibration.model).build : null;
      const int8 = int8Products(config.int8Products, config.provider);
      log(`int8 products: ${int8.use} (${int8.why})${config.provider === "cpu" ? "" : `; on ${config.provider}, each build's GPU graph (${GPU_GRAPH.file}) where it has one`}`);
      for (const build of registry.usedBuilds()) {
        const lb = loadBuild(registry.buildDir(build), { int8: int8.use, provider: config.provider, gpuPrecision: config.gpuPrecision, ...(build === override ? { calibration: opts.calibration!.fit } : {}) });
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
      await p.engine.run(lb, warmup.packed);
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
   * What a request on a warm server may need, loaded now rather than on first need: the default build
   * in the express workers (InferencePool.preloadExpress) and its batch graph on the main workers
   * (InferencePool.preloadBatch), side by side (they are different workers). The server does it before
   * it reports ready; the CLI tools, whose passes all belong to one caller, neither go beside each other
   * nor batch, and do not.
   */
  async preloadForServing(): Promise<void> {
    const model = this.build(this.registry.file.default).build.onnxPath;
    await Promise.all([this.pool.preloadExpress(model), this.pool.preloadBatch(model)]);
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
        calibrated: this.builds.has(r.build) ? this.builds.get(r.build)!.build.manifest.calibration !== null : null,
        ready: this.warm && this.lifecycle.state(r.build) === "loaded",
      };
    });
  }

  /**
   * The ms admission would count now for a general request from `orgId` (its
   * passes, priors and shortlist at the live pass rate, as `runGeneral` plans
   * them): what the operating tests size their deadlines by.
   */
  estimateGeneralMs(env: Pick<RequestEnvelope, "model" | "state" | "questions">, orgId?: string): number {
    const lb = this.build(env.model);
    const prepared = prepare(lb, env.state, env.questions as Parameters<typeof prepare>[2], undefined, { debias: this.families.debias });
    return this.pool.estimate(plannedGeneral(this.families, lb, prepared, orgId));
  }

  private resolve(name: string): ResolvedModel {
    if (!this.registry.has(name)) throw unknownModel(name, this.registry.names());
    return this.registry.resolve(name);
  }

  async run(env: RequestEnvelope, ctx: PipelineContext): Promise<SystemOneResponse> {
    const model = this.resolve(env.model);
    if (model.family === "codesearch") return runCodeSearch(this.families, model, env, ctx);
    if (model.family === "factcheck") return runFactCheck(this.families, model, env, ctx);
    return runGeneral(this.families, model, env, ctx);
  }

  async close(): Promise<void> {
    this.warm = false;
    this.lifecycle.stop();
    await this.pool.close();
  }
}
