import { shapeOf, withPast, type PassShape } from "../inference/cost.js";
import { blocksOf, packedShape, type EncodedQuestion, type PackedRequest } from "../inference/pack.js";
import type { PlannedPass } from "../inference/work.js";
import { buildPrefix } from "../prompt/index.js";
import type { LoadedBuild } from "./build.js";
import { MIN_CACHED_TOKENS, type PrefixCache } from "./prefix-cache.js";
import type { PriorCache } from "./prior.js";
import { blockCost, carries, COMPUTED_PREFIX_TOKENS, LONG_STATE_CHUNKS, longPassesOf, passesOf, prefillChunkSizes } from "./passes.js";

/** A request's content-free prior reading (prior.ts): its question blocks against one neutral state. */
export interface PriorRead {
  neutral: string;
  branches: readonly EncodedQuestion[];
}

/**
 * The pass planner: which passes a request's branches take on a loaded build
 * (the arithmetic of passes.ts against the build's pair bound, its preamble
 * and what the prefix and prior caches hold), and each pass's shape as it
 * will run, for admission. The engine (index.ts) runs the same plan; nothing
 * here runs a pass.
 */
export class PassPlanner {
  /** Per build, the prompt ids of each neutral state (neutralIds). */
  private readonly neutrals = new WeakMap<LoadedBuild, Map<string, number[]>>();

  constructor(
    private readonly prefixes: PrefixCache,
    private readonly priors: PriorCache,
    /** Whether passes start from the preamble's keys and values (Engine.pinPreamble). */
    private readonly pinPreamble: boolean,
    /** Engine.stateChunk (ASSAY_STATE_CHUNK_TOKENS). */
    private readonly stateChunk: number,
    /** Engine.attentionBytes (ASSAY_PASS_ATTENTION_MB). */
    private readonly attentionBytes: number,
  ) {}

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
  maxPairs(lb: LoadedBuild): number {
    const kv = lb.build.manifest.kv;
    if (!kv || this.attentionBytes <= 0) return Infinity;
    const heads = lb.build.manifest.hidden_size / kv.head_dim;
    return Math.max(1, Math.floor(this.attentionBytes / (4 * heads)));
  }

  /** The preamble's length when a prefix of `length` tokens (token i: `at(i)`) starts with it and computes at least COMPUTED_PREFIX_TOKENS past it; else 0. */
  pinnedLength(lb: LoadedBuild, length: number, at: (i: number) => number): number {
    const ids = lb.preamble;
    const pinned = this.pinPreamble && ids.length >= MIN_CACHED_TOKENS && length - ids.length >= COMPUTED_PREFIX_TOKENS && ids.every((t, i) => at(i) === t);
    return pinned ? ids.length : 0;
  }

  /**
   * Whether a state is too long to share a pass with its widest branch: then
   * (on a build that takes past keys and values) it is computed on its own,
   * in chunks, and the branches are read against it (`scoreLong`).
   */
  isLong(lb: LoadedBuild, prefixLength: number, branches: readonly EncodedQuestion[], limit: number, which?: readonly number[]): boolean {
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
  stateChunks(lb: LoadedBuild, held: number, limit: number): number[] {
    const side = Math.min(limit, Math.floor(Math.sqrt(this.maxPairs(lb))), this.stateChunk > 0 ? this.stateChunk : Infinity);
    return prefillChunkSizes(held, Math.max(side, COMPUTED_PREFIX_TOKENS + 1));
  }

  /** The cached prior readings of `branches` against `neutral` for `orgId`, and the branches a prior pass must read (groups whole). */
  priorsHeld(
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
  neutralIds(lb: LoadedBuild, neutral: string): number[] {
    let byState = this.neutrals.get(lb);
    if (!byState) this.neutrals.set(lb, (byState = new Map()));
    let ids = byState.get(neutral);
    if (!ids) byState.set(neutral, (ids = lb.tokenizer.encode(buildPrefix(lb.style, neutral))));
    return ids;
  }

  /** Whether `scoreMany` would read these branches in one pass (then the request's own packed pass is the fast path). */
  onePass(lb: LoadedBuild, prefixLength: number, branches: readonly EncodedQuestion[], limit: number): boolean {
    return !this.isLong(lb, prefixLength, branches, limit) && this.passes(lb, prefixLength, branches, limit).length === 1;
  }

  /** The passes of a state that shares them with its branches (not `isLong`), as branch indices: what `scoreMany` runs and `plan` prices. */
  passes(lb: LoadedBuild, prefixLength: number, branches: readonly EncodedQuestion[], limit: number, which?: readonly number[]): number[][] {
    return passesOf(prefixLength, branches, limit, which, this.splitsWidths(lb, prefixLength), this.maxPairs(lb));
  }

  /** The branch passes against a long state of `held` computed tokens (`isLong`), as branch indices: what `scoreLong` runs and `plan` prices. */
  longPasses(lb: LoadedBuild, held: number, branches: readonly EncodedQuestion[], limit: number, which?: readonly number[]): number[][] {
    return longPassesOf(held, branches, limit, which, this.maxPairs(lb));
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
      return this.passes(lb, prefixLength, branches, limit, which).map((pass) => shapeOfPass(prefixLength, pass));
    // The chunks of the state, each continuing the ones before, then branch passes carrying its last tokens and attending to the rest.
    const held = prefixLength - COMPUTED_PREFIX_TOKENS;
    let start = 0;
    return [
      ...this.stateChunks(lb, held, limit).map((c) => {
        const shape = withPast({ tokens: c + 1, prefix: c, branches: 1, width: 1 }, start);
        start += c;
        return { model, shape, prefill: true as const };
      }),
      ...this.longPasses(lb, held, branches, limit, which).map((pass) => shapeOfPass(COMPUTED_PREFIX_TOKENS, pass, held)),
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
}
