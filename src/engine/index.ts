import { AssayError } from "../errors/catalogue.js";
import { shapeOf, withPast, type PassShape } from "../inference/cost.js";
import { blocksOf, continuePacked, pack, packedShape, readLabels, type Block, type EncodedQuestion, type PackedRequest } from "../inference/pack.js";
import type { AdmittedWork, InferencePool } from "../inference/pool.js";
import { workRequest, type PlannedPass, type RequestDeadline } from "../inference/work.js";
import { buildPrefix } from "../prompt/index.js";
import type { LoadedBuild } from "./build.js";
import { PriorCache } from "./prior.js";
import { MIN_CACHED_TOKENS, PrefixCache } from "./prefix-cache.js";
import type { PrefixKv } from "../inference/protocol.js";
import { metrics } from "../observability/metrics.js";

export type { EncodedQuestion, PackedRequest, PlannedPass };

/** A request's content-free prior reading (prior.ts): its question blocks against one neutral state. */
export interface PriorRead {
  neutral: string;
  branches: readonly EncodedQuestion[];
}
/** The one packed pass of a prefix and its branches: what a worker runs and what usage counts. */
export { pack };
export { likelyEscalated } from "../inference/work.js";
export { labelIds, loadBuild, passLimit, preambleIds, type LoadedBuild } from "./build.js";
export { NEUTRAL_STATE, PriorCache, subtractPrior } from "./prior.js";
export { PrefixCache } from "./prefix-cache.js";

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

  /** Keys and values of each build's preamble, computed once. */
  private readonly preambles = new Preambles();

  /** Per build, the prompt ids of each neutral state (neutralIds). */
  private readonly neutrals = new WeakMap<LoadedBuild, Map<string, number[]>>();
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
  }

  readonly stateChunk: number;
  readonly attentionBytes: number;

  /**
   * The most query–key pairs one pass of `lb` may hold at once: its score
   * tensor is [heads, rows, keys] float32 per layer, and onnxruntime's arena
   * keeps the largest it has built for the life of the worker, so the biggest
   * pass a server ever ran sets its memory from then on (an 8,000-token pass:
   * 3 GB per operator; docs/experiments/attention-and-long-states.md). Only builds that take
   * past keys and values are bounded: their later passes continue the state
   * (from the prefix cache, or carried from the request's first pass with the
   * cache off), so a smaller pass costs one more reading of the weights, not
   * another prefill.
   */
  private maxPairs(lb: LoadedBuild): number {
    const kv = lb.build.manifest.kv;
    if (!kv || this.attentionBytes <= 0) return Infinity;
    const heads = lb.build.manifest.hidden_size / kv.head_dim;
    return Math.max(1, Math.floor(this.attentionBytes / (4 * heads)));
  }

  /**
   * The preamble's keys and values, when `packed` starts with the preamble and
   * computes at least COMPUTED_PREFIX_TOKENS of its prefix past it.
   */
  private async preambleOf(lb: LoadedBuild, packed: PackedRequest, ctx: ScoreContext): Promise<PrefixKv | undefined> {
    const ids = lb.preamble;
    if (this.pinnedLength(lb, packed.prefixLength, (i) => Number(packed.inputIds[i])) === 0) return undefined;
    return this.preambles.get(ids, async () => {
      // The preamble alone, reading one throwaway branch (the graph reads at least one).
      const alone = pack(ids, [{ suffix: [lb.terminator], labels: [[lb.terminator]], terminator: lb.terminator, billed: false }]);
      // Not under the request's signal: other requests may be waiting on the same keys and values.
      const out = await this.infer(lb, alone, ctx.timings ? { timings: ctx.timings } : {}, undefined, ids.length);
      if (!out.present || out.present.tokens !== ids.length) throw new AssayError("MODEL_FAILED", "the model returned no keys and values for the preamble");
      return out.present;
    });
  }

  /** The preamble's length when a prefix of `length` tokens (token i: `at(i)`) starts with it and computes at least COMPUTED_PREFIX_TOKENS past it; else 0. */
  private pinnedLength(lb: LoadedBuild, length: number, at: (i: number) => number): number {
    const ids = lb.preamble;
    const pinned = this.pinPreamble && ids.length >= MIN_CACHED_TOKENS && length - ids.length >= COMPUTED_PREFIX_TOKENS && ids.every((t, i) => at(i) === t);
    return pinned ? ids.length : 0;
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
    if (this.isLong(lb, prefix.length, branches, limit, which)) return this.scoreLong(lb, prefix, branches, limit, ctx, which);
    const lps = new Array<number[] | undefined>(branches.length);
    const passes = passesOf(prefix.length, branches, limit, which, this.splitsWidths(lb, prefix.length), this.maxPairs(lb));
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
   * Whether a state is too long to share a pass with its widest branch: then
   * (on a build that takes past keys and values) it is computed on its own,
   * in chunks, and the branches are read against it (`scoreLong`).
   */
  private isLong(lb: LoadedBuild, prefixLength: number, branches: readonly EncodedQuestion[], limit: number, which?: readonly number[]): boolean {
    const idx = which ?? branches.map((_, i) => i);
    if (lb.build.manifest.kv === undefined || idx.length === 0) return false;
    // One pass computes all its state's rows against all its keys (the causal half masked, not skipped):
    // in chunks, a long state costs about half the attention (docs/experiments/attention-and-long-states.md).
    if (this.stateChunk > 0 && prefixLength > LONG_STATE_CHUNKS * this.stateChunk) return true;
    // The state's own scores are [state × state] in one pass: past the pair bound it is computed in chunks.
    if (prefixLength * prefixLength > this.maxPairs(lb)) return true;
    return prefixLength + Math.max(...blocksOf(branches, idx).map((b) => blockCost(branches, b))) > limit;
  }

  /** The chunk sizes of a long state's first `held` tokens: within the pass limit, the pair bound and, where set, the state chunk. */
  private stateChunks(lb: LoadedBuild, held: number, limit: number): number[] {
    const side = Math.min(limit, Math.floor(Math.sqrt(this.maxPairs(lb))), this.stateChunk > 0 ? this.stateChunk : Infinity);
    return prefillChunkSizes(held, Math.max(side, COMPUTED_PREFIX_TOKENS + 1));
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
    const passes = longPassesOf(held, branches, limit, which, this.maxPairs(lb));
    for (const pass of passes) {
      ctx.signal?.throwIfAborted();
      const packed = continuePacked(pack(prefix, pass.map((i) => branches[i]!)), held);
      const read = readFinite(packed, (await this.infer(lb, packed, ctx, past)).logprobs);
      pass.forEach((i, n) => (lps[i] = read[n]!));
    }
    return { lps, passes: passes.length + this.stateChunks(lb, held, limit).length };
  }

  /** Keys and values of `prefix`'s first `held` tokens, computed chunk by chunk, each chunk continuing the ones before. */
  private async prefillChunks(lb: LoadedBuild, prefix: number[], held: number, limit: number, ctx: ScoreContext): Promise<PrefixKv> {
    let past: PrefixKv | undefined;
    let start = 0;
    for (const size of this.stateChunks(lb, held, limit)) {
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
    let { out, missing } = this.priorsHeld(lb, neutral, branches, ctx.orgId, true);
    const key = () => this.priors.keyOf(build, ctx.orgId, neutral, missing.map((i) => branches[i]!));
    const flight = missing.length > 0 ? this.priorFlights.get(key()) : undefined;
    if (flight) {
      // Whatever became of it (the reader's request may have failed or passed its deadline), look again.
      await flight.catch(() => undefined);
      ({ out, missing } = this.priorsHeld(lb, neutral, branches, ctx.orgId, true));
    }
    if (missing.length > 0) {
      const k = key();
      const reading = this.scoreMany(lb, this.neutralIds(lb, neutral), branches, limit, ctx, missing);
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

  /** The cached prior readings of `branches` against `neutral` for `orgId`, and the branches a prior pass must read (groups whole). */
  private priorsHeld(
    lb: LoadedBuild,
    neutral: string,
    branches: readonly EncodedQuestion[],
    orgId: string | undefined,
    touch: boolean,
  ): { out: (number[] | undefined)[]; missing: number[] } {
    const out = this.priors.lookup(lb.build.manifest.build_hash, orgId, neutral, branches, touch);
    // A group is read whole when any of it is missing: its block's layout depends on all its members.
    const missing = blocksOf(branches).flatMap((b) => (b.members.some((i) => out[i] === undefined) ? b.members : []));
    return { out, missing };
  }

  /** A neutral state's prompt ids, encoded once per build and state: admission plans them and `prior` reads them. */
  private neutralIds(lb: LoadedBuild, neutral: string): number[] {
    let byState = this.neutrals.get(lb);
    if (!byState) this.neutrals.set(lb, (byState = new Map()));
    let ids = byState.get(neutral);
    if (!ids) byState.set(neutral, (ids = lb.tokenizer.encode(buildPrefix(lb.style, neutral))));
    return ids;
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
    for (const pass of passesOf(prefix.length, branches, limit, undefined, false, this.maxPairs(lb))) {
      const packed = pack(prefix, pass.map((i) => branches[i]!));
      const { logprobs, runMs } = await this.infer(lb, packed, {});
      ms += runMs;
      tokens += packed.inputIds.length;
      pass.forEach((i, n) => (readings[i] = packed.readout[n]!.map((cells) => cells.map((c) => logprobs[c]!))));
    }
    return { readings, ms, tokens };
  }

  /** Whether `scoreMany` would read these branches in one pass (then the request's own packed pass is the fast path). */
  onePass(lb: LoadedBuild, prefixLength: number, branches: readonly EncodedQuestion[], limit: number): boolean {
    return !this.isLong(lb, prefixLength, branches, limit) && passesOf(prefixLength, branches, limit, undefined, this.splitsWidths(lb, prefixLength), this.maxPairs(lb)).length === 1;
  }

  /**
   * Whether a request's narrow blocks go to a pass of their own rather than
   * padded to its widest block: where a later pass continues the state's keys
   * and values from the prefix cache instead of computing it again. (With the
   * cache off a request's later passes carry its state too, but a request that
   * fits one pass is kept whole there: the split was measured with the cache
   * on only, docs/experiments/prefix-cache.md.)
   */
  private splitsWidths(lb: LoadedBuild, prefixLength: number): boolean {
    return this.prefixes.enabled && carries(lb, prefixLength);
  }

  /** The passes `scoreMany` will run, as shapes for admission: grouped as it groups them (by `branchCost`, a bound on a block), each shaped as it will be packed. */
  plan(lb: LoadedBuild, prefixLength: number, branches: readonly EncodedQuestion[], limit: number, which?: readonly number[]): PlannedPass[] {
    const model = lb.build.onnxPath;
    // The shape as the pass will be packed (label tries shared), not the bound that groups the blocks.
    const shapeOfPass = (prefix: number, pass: number[], past = 0) => ({ model, shape: withPast(packedShape(prefix, pass.map((i) => branches[i]!)), past) });
    if (!this.isLong(lb, prefixLength, branches, limit, which))
      return passesOf(prefixLength, branches, limit, which, this.splitsWidths(lb, prefixLength), this.maxPairs(lb)).map((pass) => shapeOfPass(prefixLength, pass));
    // The chunks of the state, each continuing the ones before, then branch passes carrying its last tokens and attending to the rest.
    const held = prefixLength - COMPUTED_PREFIX_TOKENS;
    let start = 0;
    return [
      ...this.stateChunks(lb, held, limit).map((c) => {
        const shape = withPast({ tokens: c + 1, prefix: c, branches: 1, width: 1 }, start);
        start += c;
        return { model, shape, prefill: true as const };
      }),
      ...longPassesOf(held, branches, limit, which, this.maxPairs(lb)).map((pass) => shapeOfPass(COMPUTED_PREFIX_TOKENS, pass, held)),
    ];
  }

  /** `plan`'s passes as `infer` will run them for this organization: less what the caches hold (asRun). */
  planAsRun(lb: LoadedBuild, prefix: readonly number[], branches: readonly EncodedQuestion[], limit: number, orgId?: string, which?: readonly number[]): PlannedPass[] {
    const planned = this.lessCachedState(lb, this.plan(lb, prefix.length, branches, limit, which), prefix, orgId);
    const shapes = this.asRun(lb, planned.map((p) => p.shape), prefix, orgId);
    return planned.map((p, i) => ({ ...p, shape: shapes[i]! }));
  }

  /**
   * The passes of a general request: its packed pass or the passes `plan`
   * gave for it, its content-free prior passes as `prior` will run them (per
   * neutral state, only the questions the prior cache does not hold: a caller
   * who asks the same questions of many states pays for them once, and its
   * estimate says so), and a second reading where questions are shortlisted.
   */
  planGeneral(
    lb: LoadedBuild,
    passes: readonly (PackedRequest | PlannedPass)[],
    priors: readonly PriorRead[],
    shortlist: boolean,
    /** The request's prefix, organization and pass limit: passes are planned as they will run, less what the caches hold. */
    from: { prefix: readonly number[]; orgId?: string | undefined; limit: number },
  ): PlannedPass[] {
    const model = lb.build.onnxPath;
    const shapes = this.lessCachedState(lb, passes, from.prefix, from.orgId).map((p) => ("shape" in p ? p.shape : shapeOf(p)));
    const main: PlannedPass[] = this.asRun(lb, shapes, from.prefix, from.orgId).map((shape) => ({ model, shape }));
    const one = [...main, ...priors.flatMap(({ neutral, branches }) => this.planPrior(lb, neutral, branches, from.limit, from.orgId))];
    // The shortlist's second reading counts as the first again: its k presentations of k options weigh
    // about what one list of all the options did.
    return shortlist ? [...one, ...one] : one;
  }

  /** The passes `prior` will run for `branches` against `neutral`: none for those the prior cache holds. */
  planPrior(lb: LoadedBuild, neutral: string, branches: readonly EncodedQuestion[], limit: number, orgId?: string): PlannedPass[] {
    const { missing } = this.priorsHeld(lb, neutral, branches, orgId, false);
    return missing.length > 0 ? this.planAsRun(lb, this.neutralIds(lb, neutral), branches, limit, orgId, missing) : [];
  }

  /**
   * The passes without a long state's prefill chunks when the prefix cache
   * holds the state for this organization: `scoreLong` then runs only the
   * branch passes (a second request on a long document would otherwise be
   * estimated at a whole prefill, raising its deadline or refusing it).
   */
  private lessCachedState<P extends PackedRequest | PlannedPass>(lb: LoadedBuild, passes: readonly P[], prefix: readonly number[], orgId?: string): readonly P[] {
    if (!passes.some((p) => "prefill" in p && p.prefill)) return passes;
    const held = BigInt64Array.from(prefix.slice(0, prefix.length - COMPUTED_PREFIX_TOKENS), BigInt);
    if (!this.prefixes.has(lb.build.manifest.build_hash, orgId, held)) return passes;
    return passes.filter((p) => !("prefill" in p && p.prefill));
  }

  /**
   * Pass shapes as `infer` will run them: a pass over the whole prefix
   * computes only what neither the prefix cache (the first pass, when the
   * organization's entry is there; every later pass, when the first keeps
   * it) nor the preamble provides. An entry evicted between this estimate and
   * the pass makes the pass slower than estimated: a rare mis-estimate, not a
   * refusal of work that would fit.
   */
  private asRun(lb: LoadedBuild, shapes: readonly PassShape[], prefix: readonly number[], orgId?: string): PassShape[] {
    if (!lb.build.manifest.kv) return [...shapes];
    const held = prefix.length - COMPUTED_PREFIX_TOKENS;
    // Cached or carried (scoreMany), a request's later passes continue its first's keys and values.
    const continued = carries(lb, prefix.length);
    const fromPreamble = prefix.length - this.pinnedLength(lb, prefix.length, (i) => prefix[i]!);
    let first = continued && this.prefixes.enabled && this.prefixes.has(lb.build.manifest.build_hash, orgId, BigInt64Array.from(prefix.slice(0, held), BigInt)) ? COMPUTED_PREFIX_TOKENS : fromPreamble;
    return shapes.map((s) => {
      if (s.prefix !== prefix.length) return s;
      const computed = first;
      if (continued) first = COMPUTED_PREFIX_TOKENS;
      // What the caches hold is not computed again, but every row of the pass still attends to it.
      return withPast({ ...s, tokens: s.tokens - s.prefix + computed, prefix: computed }, s.prefix - computed);
    });
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

/**
 * Prefix tokens a pass always computes itself, even on a cache hit. Two, not
 * one: with a single prefix row the attention products run as
 * matrix × vector, whose sums round differently from the matrix × matrix
 * products of a whole pass, and the int8 rewrite's per-row activation scales
 * amplify that (a hit read 0.27 off in log-probability on the 0.5B with one
 * row, exactly equal with two; docs/experiments/prefix-cache.md).
 */
export const COMPUTED_PREFIX_TOKENS = 2;

/** A request's own copy of its state's keys and values, set by its first pass over them (Engine.infer). */
interface Carry {
  past?: PrefixKv;
}

/**
 * Whether a prefix's keys and values outlive its pass (the prefix cache, or a
 * request's carry): a build that takes past keys and values, and a state worth
 * keeping (MIN_CACHED_TOKENS).
 */
function carries(lb: LoadedBuild, prefixLength: number): boolean {
  return lb.build.manifest.kv !== undefined && prefixLength - COMPUTED_PREFIX_TOKENS >= MIN_CACHED_TOKENS;
}

/**
 * A state is computed apart, in chunks, once it is longer than this many
 * state chunks: below it, the chunks' saving in attention does not pay for
 * the passes they add (at a chunk of 2,048 on the 1.5B: even at 3,100
 * tokens, 1.07× at 4,100, 1.37× at 8,000; docs/experiments/attention-and-long-states.md).
 */
export const LONG_STATE_CHUNKS = 2;

/**
 * Chunk sizes that compute a long state's first `held` tokens: a chunk of c
 * tokens after p computed ones attends to p + c keys, so c·(p + c) stays
 * within limit² (one full pass's pairs) and c within the limit.
 */
export function prefillChunkSizes(held: number, limit: number): number[] {
  const sizes: number[] = [];
  for (let p = 0; p < held; ) {
    const c = Math.max(COMPUTED_PREFIX_TOKENS, Math.min(limit - 1, pairsRoom(p, limit), held - p));
    sizes.push(c);
    p += c;
  }
  return sizes;
}

/**
 * Branch passes against a long state of `held` computed tokens: padded
 * branch tokens t with t·(held + t) within limit², and each pass's branch
 * scores within `maxPairs`.
 */
function longPassesOf(held: number, branches: readonly EncodedQuestion[], limit: number, which: readonly number[] | undefined, maxPairs: number): number[][] {
  // Every pass continues the state's keys and values: narrow blocks cost a pass of their own nothing more.
  const room = Math.min(limit, Math.max(pairsRoom(held, limit), COMPUTED_PREFIX_TOKENS));
  return passesOf(COMPUTED_PREFIX_TOKENS, branches, room, which, true, maxPairs, held);
}

/** The most tokens t that can follow p computed ones with t·(p + t) ≤ limit² attention pairs. */
function pairsRoom(p: number, limit: number): number {
  return Math.floor((-p + Math.sqrt(p * p + 4 * limit * limit)) / 2);
}

/** Each branch's label log-probabilities from a pass's output; a non-finite one is the model's failure. */
function readFinite(packed: PackedRequest, logprobs: Float32Array): number[][] {
  const lps = readLabels(packed, logprobs);
  if (lps.some((b) => b.some((x) => !Number.isFinite(x)))) throw new AssayError("MODEL_FAILED", "the model returned non-finite log-probabilities");
  return lps;
}

/** Tokens one branch adds to a pass: its suffix and its label trie (at most every label token plus an end). */
export function branchCost(b: EncodedQuestion): number {
  return b.suffix.length + b.labels.reduce((s, l) => s + l.length, 0) + 1;
}

/**
 * With `splitWidths`, a block starts a pass of its own when it is at most
 * SPLIT_WIDTH of the pass's longest and the padding this saves is worth a
 * pass: the blocks that would join, each padded by (longest − its width)
 * slots, each slot a row of attention against prefix + longest keys, at
 * least MIN_SPLIT_PAIRS pairs. A padded slot costs a whole row of attention
 * against the state; a pass continuing a cached state costs its own tokens
 * plus a fixed part, the weights read once more: about 250 ms on the 1.5B
 * and 50 ms on the 0.5B here, or 70,000 and 27,000 pairs at the cost
 * model's per-pair prior (docs/experiments/packing-and-presentations.md). Against the
 * earlier rule (half the longest), three code search dev rows (items from tens
 * to 1,500 tokens wide) took 0.96× the time, the widest of them 0.88×, and
 * mixed general requests 0.96–1.02×.
 */
export const SPLIT_WIDTH = 0.9;
export const MIN_SPLIT_PAIRS = 70_000;

/**
 * Groups blocks into passes. The graph pads every block of a pass to the
 * pass's longest one (attention is [blocks × longest × (prefix + longest)]),
 * so the budget counts padded tokens: longest-first, a pass takes blocks
 * while prefix + count × longest stays within `limit`. Blocks of similar
 * length end up together and memory stays bounded by the limit. With
 * `splitWidths` (a later pass continues the prefix's keys and values instead
 * of computing them again), a block narrower than the pass's longest starts
 * a pass of its own where the padding saved is worth a pass (SPLIT_WIDTH,
 * MIN_SPLIT_PAIRS): a 4-option question's shared block among 30 statements'
 * made the request 1.24× slower in one pass (docs/experiments/packing-and-presentations.md).
 */
export function planPasses(
  prefixLength: number,
  costs: readonly number[],
  limit: number,
  splitWidths = false,
  /** The most branch score pairs a pass may hold (blocks × longest × keys): a block wider than that goes alone. */
  maxPairs = Infinity,
  /** Keys and values every pass continues before its prefix (a long state's). */
  past = 0,
): number[][] {
  const order = costs.map((_, i) => i).sort((a, b) => costs[b]! - costs[a]!);
  const passes: number[][] = [];
  let cur: number[] = [];
  let longest = 0;
  // Blocks a pass padded to `longest` holds: within the token limit and the pair bound.
  const room = () => Math.min(Math.floor((limit - prefixLength) / longest), Math.floor(maxPairs / (longest * (past + prefixLength + longest))));
  // Padded pairs saved by starting a new pass at the n-th block: it and the narrower blocks after it that would still fit.
  const saved = (n: number) => {
    const joining = Math.min(order.length - n, room() - cur.length);
    return joining * (longest - costs[order[n]!]!) * (past + prefixLength + longest);
  };
  for (const [n, i] of order.entries()) {
    const full = cur.length + 1 > room();
    if (cur.length > 0 && (full || (splitWidths && costs[i]! <= SPLIT_WIDTH * longest && saved(n) >= MIN_SPLIT_PAIRS))) {
      passes.push(cur);
      cur = [];
    }
    if (cur.length === 0) longest = costs[i]!;
    cur.push(i);
  }
  if (cur.length > 0) passes.push(cur);
  return passes;
}

/** Tokens a block adds to a pass (a bound, as `branchCost`): the stem once, then each member's rest. */
function blockCost(branches: readonly EncodedQuestion[], b: Block): number {
  return b.stem + b.members.reduce((s, i) => s + branchCost(branches[i]!) - b.stem, 0);
}

/** `planPasses` over the blocks of the branches named by `which` (all when omitted), as branch indices. */
function passesOf(
  prefixLength: number,
  branches: readonly EncodedQuestion[],
  limit: number,
  which: readonly number[] | undefined,
  splitWidths: boolean,
  maxPairs = Infinity,
  past = 0,
): number[][] {
  const blocks = blocksOf(branches, which);
  return planPasses(prefixLength, blocks.map((b) => blockCost(branches, b)), limit, splitWidths, maxPairs, past).map((pass) => pass.flatMap((j) => blocks[j]!.members));
}
