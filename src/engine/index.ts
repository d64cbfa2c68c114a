import { AssayError } from "../errors/catalogue.js";
import { continuePacked, pack, readLabels, type EncodedQuestion, type PackedRequest } from "../inference/pack.js";
import type { AdmittedWork, InferencePool } from "../inference/pool.js";
import { workRequest, type PlannedPass, type RequestDeadline } from "../inference/work.js";
import type { LoadedBuild } from "./build.js";
import { PriorCache } from "./prior.js";
import { PrefixCache } from "./prefix-cache.js";
import { carries, COMPUTED_PREFIX_TOKENS, passesOf } from "./passes.js";
import { PassPlanner, type PriorRead } from "./planner.js";
import type { PrefixKv } from "../inference/protocol.js";
import { metrics } from "../observability/metrics.js";

export type { EncodedQuestion, PackedRequest, PlannedPass, PriorRead };

/** The one packed pass of a prefix and its branches: what a worker runs and what usage counts. */
export { pack };
export { likelyEscalated } from "../inference/work.js";
export { labelIds, loadBuild, passLimit, preambleIds, type LoadedBuild } from "./build.js";
export { NEUTRAL_STATE, PriorCache, subtractPrior } from "./prior.js";
export { PrefixCache } from "./prefix-cache.js";
export { branchCost, COMPUTED_PREFIX_TOKENS, LONG_STATE_CHUNKS, MIN_SPLIT_PAIRS, planPasses, prefillChunkSizes, SPLIT_WIDTH } from "./passes.js";

/**
 * The one seam between the families and the worker pool. A family turns a
 * request into a prefix and branches (a question's suffix and its answer
 * labels); the engine packs them, plans passes within a token limit, admits
 * the request's work, queues the passes and reads each branch's label
 * log-probabilities. Nothing else packs, queues or reads the pool.
 */

/** What a scoring call carries of its request; all optional, so offline tools pass nothing. */
export interface ScoreContext {
  /** Where queue and inference time are added (the request's Timings). */
  timings?: { add(phase: "queue" | "inference", ms: number): void; cached?(tokens: number): void };
  /** The request's signal: a pass is not started after it aborts, and the pool drops or cuts loose the one in flight. */
  signal?: AbortSignal | undefined;
  /** The organization charged: the partition of the prefix and prior caches (prefix-cache.ts, prior.ts). */
  orgId?: string;
}

/** Per branch, per label: the log-probability of each of its tokens. */
export type TokenReadings = number[][][];

export class Engine {
  /** Content-free readings of questions, per build and partition (prior.ts): the prefix cache's scope. */
  private readonly priors: PriorCache;

  /** Which passes a request takes and their shapes (planner.ts): the same plan admission prices and `scoreMany` runs. */
  private readonly planner: PassPlanner;

  /** Keys and values of each build's preamble, computed once. */
  private readonly preambles = new Preambles();

  /**
   * Prior readings being read now, by the branches they read (PriorCache.keyOf): requests that miss the
   * same prior at once (a burst asking one new question) wait for the one reading instead of each
   * reading it again (eight small requests right after boot: 1.5 s against 0.77 s once the prior was held).
   */
  private readonly priorFlights = new Map<string, Promise<unknown>>();

  constructor(
    readonly pool: InferencePool,
    /** Keys and values of recent prefixes (prefix-cache.ts); off when its budget is 0. */
    readonly prefixes: PrefixCache = new PrefixCache(0, "organization"),
    /** Whether passes start from the preamble's keys and values (off: every pass computes its whole prefix; tests compare the two). */
    readonly pinPreamble = true,
    opts: {
      /**
       * A state longer than twice this many tokens is computed apart from its
       * questions, in chunks of at most this many tokens' attention
       * (stateChunks), even when it would fit one pass with them; 0: only a
       * state too long to share a pass is (ASSAY_STATE_CHUNK_TOKENS).
       */
      stateChunk?: number;
      /**
       * The most bytes one pass's attention scores may take per layer
       * (maxPairs); 0: bounded by the pass limit alone (ASSAY_PASS_ATTENTION_MB).
       */
      attentionBytes?: number;
    } = {},
  ) {
    this.priors = new PriorCache(prefixes.scope);
    this.stateChunk = opts.stateChunk ?? 0;
    this.attentionBytes = opts.attentionBytes ?? 0;
    this.planner = new PassPlanner(prefixes, this.priors, pinPreamble, this.stateChunk, this.attentionBytes);
  }

  readonly stateChunk: number;
  readonly attentionBytes: number;

  /**
   * The preamble's keys and values, when `packed` starts with the preamble and
   * computes at least COMPUTED_PREFIX_TOKENS of its prefix past it.
   */
  private async preambleOf(lb: LoadedBuild, packed: PackedRequest, ctx: ScoreContext): Promise<PrefixKv | undefined> {
    const ids = lb.preamble;
    if (this.planner.pinnedLength(lb, packed.prefixLength, (i) => Number(packed.inputIds[i])) === 0) return undefined;
    return this.preambles.get(ids, async () => {
      // The preamble alone, reading one throwaway branch (the graph reads at least one).
      const alone = pack(ids, [{ suffix: [lb.terminator], labels: [[lb.terminator]], terminator: lb.terminator, billed: false }]);
      // Not under the request's signal: other requests may be waiting on the same keys and values.
      const out = await this.infer(lb, alone, ctx.timings ? { timings: ctx.timings } : {}, undefined, ids.length);
      if (!out.present || out.present.tokens !== ids.length) throw new AssayError("MODEL_FAILED", "the model returned no keys and values for the preamble");
      return out.present;
    });
  }

  /** Runs a packed pass: each branch's label log-probabilities (summed over the label's tokens), in branch order. */
  async run(lb: LoadedBuild, packed: PackedRequest, ctx: ScoreContext = {}): Promise<number[][]> {
    return readFinite(packed, (await this.infer(lb, packed, ctx)).logprobs);
  }

  /**
   * The branches named by `which` (all when omitted) against one prefix, in as
   * few passes as `limit` allows (planPasses). Readings come back in input
   * order, undefined for branches not read.
   */
  async scoreMany(
    lb: LoadedBuild,
    prefix: number[],
    branches: readonly EncodedQuestion[],
    limit: number,
    ctx: ScoreContext = {},
    which?: readonly number[],
  ): Promise<{ lps: (number[] | undefined)[]; passes: number }> {
    if (this.planner.isLong(lb, prefix.length, branches, limit, which)) return this.scoreLong(lb, prefix, branches, limit, ctx, which);
    const lps = new Array<number[] | undefined>(branches.length);
    const passes = this.planner.passes(lb, prefix.length, branches, limit, which);
    // The state's keys and values, held for this request's later passes: with the cache off, or its entry evicted mid-request.
    const carry: Carry | undefined = passes.length > 1 ? {} : undefined;
    for (const pass of passes) {
      // A request cut short (deadline, hang-up, drain) starts no further pass;
      // the queued one was dropped and the running one cut loose by the pool.
      ctx.signal?.throwIfAborted();
      const packed = pack(prefix, pass.map((i) => branches[i]!));
      const read = readFinite(packed, (await this.infer(lb, packed, ctx, undefined, 0, carry)).logprobs);
      pass.forEach((i, n) => (lps[i] = read[n]!));
    }
    return { lps, passes: passes.length };
  }

  /**
   * A state longer than one pass allows: its keys and values come from the
   * prefix cache or are computed in chunks (`prefillChunks`), and the branches
   * run in passes that carry only the state's last COMPUTED_PREFIX_TOKENS and
   * attend to the rest. Every pass keeps its attention within the pairs of one
   * full pass at the limit (limit²): the longer the state, the fewer branch
   * tokens per pass.
   */
  private async scoreLong(
    lb: LoadedBuild,
    prefix: number[],
    branches: readonly EncodedQuestion[],
    limit: number,
    ctx: ScoreContext,
    which?: readonly number[],
  ): Promise<{ lps: (number[] | undefined)[]; passes: number }> {
    const held = prefix.length - COMPUTED_PREFIX_TOKENS;
    const ids = BigInt64Array.from(prefix.slice(0, held), BigInt);
    const build = lb.build.manifest.build_hash;
    let past = this.prefixes.get(build, ctx.orgId, ids);
    if (past) ctx.timings?.cached?.(held);
    else {
      past = await this.prefillChunks(lb, prefix, held, limit, ctx);
      this.prefixes.set(build, ctx.orgId, ids, past);
    }
    const lps = new Array<number[] | undefined>(branches.length);
    const passes = this.planner.longPasses(lb, held, branches, limit, which);
    for (const pass of passes) {
      ctx.signal?.throwIfAborted();
      const packed = continuePacked(pack(prefix, pass.map((i) => branches[i]!)), held);
      const read = readFinite(packed, (await this.infer(lb, packed, ctx, past)).logprobs);
      pass.forEach((i, n) => (lps[i] = read[n]!));
    }
    return { lps, passes: passes.length + this.planner.stateChunks(lb, held, limit).length };
  }

  /** Keys and values of `prefix`'s first `held` tokens, computed chunk by chunk, each chunk continuing the ones before. */
  private async prefillChunks(lb: LoadedBuild, prefix: number[], held: number, limit: number, ctx: ScoreContext): Promise<PrefixKv> {
    let past: PrefixKv | undefined;
    let start = 0;
    for (const size of this.planner.stateChunks(lb, held, limit)) {
      ctx.signal?.throwIfAborted();
      const end = start + size;
      // A chunk pass reads one throwaway branch (the next state token): the graph reads at least one.
      const next = prefix[end]!;
      const full = pack(prefix.slice(0, end), [{ suffix: [next], labels: [[next]], terminator: lb.terminator, billed: false }]);
      const out = await this.infer(lb, start > 0 ? continuePacked(full, start) : full, ctx, past, end);
      if (!out.present || out.present.tokens !== end) throw new AssayError("MODEL_FAILED", "the model returned no keys and values for the state");
      past = out.present;
      start = end;
    }
    return past!;
  }

  /**
   * Each branch read against a neutral state (a content-free prior, prior.ts),
   * from the per-build cache where it was read before; the rest in as few
   * passes as `limit` allows.
   */
  async prior(lb: LoadedBuild, neutral: string, branches: readonly EncodedQuestion[], limit: number, ctx: ScoreContext = {}): Promise<number[][]> {
    const build = lb.build.manifest.build_hash;
    let { out, missing } = this.planner.priorsHeld(lb, neutral, branches, ctx.orgId, true);
    const key = () => this.priors.keyOf(build, ctx.orgId, neutral, missing.map((i) => branches[i]!));
    const flight = missing.length > 0 ? this.priorFlights.get(key()) : undefined;
    if (flight) {
      // Whatever became of it (the reader's request may have failed or passed its deadline), look again.
      await flight.catch(() => undefined);
      ({ out, missing } = this.planner.priorsHeld(lb, neutral, branches, ctx.orgId, true));
    }
    if (missing.length > 0) {
      const k = key();
      const reading = this.scoreMany(lb, this.planner.neutralIds(lb, neutral), branches, limit, ctx, missing);
      this.priorFlights.set(k, reading);
      try {
        const { lps } = await reading;
        for (const i of missing) {
          out[i] = lps[i]!;
          this.priors.store(build, ctx.orgId, neutral, branches[i]!, lps[i]!);
        }
      } finally {
        if (this.priorFlights.get(k) === reading) this.priorFlights.delete(k);
      }
    }
    return out as number[][];
  }

  /**
   * Every branch against one prefix, read token by token (the readout study
   * compares sums, means and first tokens from one reading). Passes are planned
   * as `scoreMany` plans them, blocks whole, but with the prefix computed in
   * every pass.
   */
  async readTokens(lb: LoadedBuild, prefix: number[], branches: readonly EncodedQuestion[], limit: number): Promise<{ readings: TokenReadings; ms: number; tokens: number }> {
    const readings: TokenReadings = new Array(branches.length);
    let ms = 0;
    let tokens = 0;
    // No prefix cache here: a narrow block in a pass of its own would pay the prefix again.
    for (const pass of passesOf(prefix.length, branches, limit, undefined, false, this.planner.maxPairs(lb))) {
      const packed = pack(prefix, pass.map((i) => branches[i]!));
      const { logprobs, runMs } = await this.infer(lb, packed, {});
      ms += runMs;
      tokens += packed.inputIds.length;
      pass.forEach((i, n) => (readings[i] = packed.readout[n]!.map((cells) => cells.map((c) => logprobs[c]!))));
    }
    return { readings, ms, tokens };
  }

  // Planning, passed through to the planner (planner.ts): the same plan `scoreMany` and `prior` run.

  /** Whether `scoreMany` would read these branches in one pass (PassPlanner.onePass). */
  onePass(...a: Parameters<PassPlanner["onePass"]>): boolean {
    return this.planner.onePass(...a);
  }

  /** The passes `scoreMany` will run, as shapes for admission (PassPlanner.plan). */
  plan(...a: Parameters<PassPlanner["plan"]>): PlannedPass[] {
    return this.planner.plan(...a);
  }

  /** `plan`'s passes as `infer` will run them for this organization, less what the caches hold (PassPlanner.planAsRun). */
  planAsRun(...a: Parameters<PassPlanner["planAsRun"]>): PlannedPass[] {
    return this.planner.planAsRun(...a);
  }

  /** The passes of a general request, its prior passes and a shortlist's second reading (PassPlanner.planGeneral). */
  planGeneral(...a: Parameters<PassPlanner["planGeneral"]>): PlannedPass[] {
    return this.planner.planGeneral(...a);
  }

  /** The passes `prior` will run for `branches` against `neutral` (PassPlanner.planPrior). */
  planPrior(...a: Parameters<PassPlanner["planPrior"]>): PlannedPass[] {
    return this.planner.planPrior(...a);
  }

  /**
   * Admits a request's planned work, or throws the 529 / 422 that says why
   * not (InferencePool.admit). Release it in `finally`.
   */
  admit(passes: readonly PlannedPass[], req: { orgId: string; signal?: AbortSignal | undefined; deadline?: RequestDeadline | undefined }): AdmittedWork {
    return this.pool.admit(passes, workRequest(req));
  }

  /**
   * One pass. On a build whose graph takes past keys and values, the
   * prefix less its last COMPUTED_PREFIX_TOKENS tokens is looked up in the
   * prefix cache: a hit runs only the rest of the pass against the cached
   * keys and values; a miss runs the whole pass and keeps those keys and
   * values. Both read the same log-probabilities
   * (test/engine/prefix-cache.test.ts).
   */
  private async infer(
    lb: LoadedBuild,
    packed: PackedRequest,
    ctx: ScoreContext,
    /** Given: the pass already continues these keys and values (a long state's); no lookup. */
    given?: PrefixKv,
    keep = 0,
    /** One request's passes over the same prefix: the first keeps its keys and values here, later ones continue them when the cache does not hold them. */
    carry?: Carry,
  ): Promise<{ logprobs: Float32Array; runMs: number; present?: PrefixKv }> {
    const q0 = performance.now();
    const kv = lb.build.manifest.kv;
    const held = packed.prefixLength - COMPUTED_PREFIX_TOKENS;
    let out;
    const layout = kv && { layers: kv.layers, kvHeads: kv.kv_heads, headDim: kv.head_dim };
    if (!layout) {
      out = await this.pool.infer(lb.build.onnxPath, packed, ctx.signal);
    } else if (given || keep > 0) {
      out = await this.pool.infer(lb.build.onnxPath, packed, ctx.signal, { layout, ...(given ? { past: given } : {}), keep });
    } else {
      const build = lb.build.manifest.build_hash;
      const worthKeeping = carries(lb, packed.prefixLength);
      const caching = this.prefixes.enabled && worthKeeping;
      const keeping = worthKeeping && (this.prefixes.enabled || carry !== undefined);
      const prefix = packed.inputIds.subarray(0, held);
      const cached = caching ? this.prefixes.get(build, ctx.orgId, prefix) : undefined;
      // A carry is only ever set by a pass that kept this same prefix.
      const past = cached ?? carry?.past;
      const opening = past ? undefined : await this.preambleOf(lb, packed, ctx);
      if (past) {
        out = await this.pool.infer(lb.build.onnxPath, continuePacked(packed, held), ctx.signal, { layout, past, keep: 0 });
        // The header counts what the cache gave; a carried state is this request's own first pass.
        if (cached) ctx.timings?.cached?.(held);
      } else {
        const keep = keeping ? held : 0;
        out = opening
          ? await this.pool.infer(lb.build.onnxPath, continuePacked(packed, opening.tokens), ctx.signal, { layout, past: opening, keep })
          : await this.pool.infer(lb.build.onnxPath, packed, ctx.signal, { layout, keep });
        if (opening) metrics.preambleTokensSaved.inc(opening.tokens);
        if (keeping && out.present) {
          if (caching) this.prefixes.set(build, ctx.orgId, prefix, out.present);
          if (carry) carry.past = out.present;
        }
      }
    }
    ctx.timings?.add("inference", out.runMs);
    ctx.timings?.add("queue", Math.max(0, performance.now() - q0 - out.runMs));
    return out;
  }
}

/**
 * Keys and values of a build's preamble, computed once per loaded build by
 * the first pass that needs them: the same tokens open every general prompt,
 * whoever sends it, so holding them tells no organization anything about
 * another and needs no partition. Keyed by the loaded build's own preamble
 * array (LoadedBuild.preamble), so an entry goes when its build is unloaded,
 * and a build read with and without the worked examples has one of each.
 */
class Preambles {
  private readonly kv = new WeakMap<readonly number[], Promise<PrefixKv | undefined>>();

  get(key: readonly number[], compute: () => Promise<PrefixKv | undefined>): Promise<PrefixKv | undefined> {
    let p = this.kv.get(key);
    if (!p) {
      // A failed computation (a worker fault) is not kept: the next pass tries again.
      p = compute().catch((e: unknown) => {
        this.kv.delete(key);
        throw e;
      });
      this.kv.set(key, p);
    }
    return p;
  }
}

/** A request's own copy of its state's keys and values, set by its first pass over them (Engine.infer). */
interface Carry {
  past?: PrefixKv;
}

/** Each branch's label log-probabilities from a pass's output; a non-finite one is the model's failure. */
function readFinite(packed: PackedRequest, logprobs: Float32Array): number[][] {
  const lps = readLabels(packed, logprobs);
  if (lps.some((b) => b.some((x) => !Number.isFinite(x)))) throw new AssayError("MODEL_FAILED", "the model returned non-finite log-probabilities");
  return lps;
}
