import { blocksOf, type Block, type EncodedQuestion } from "../inference/pack.js";
import type { LoadedBuild } from "./build.js";
import { MIN_CACHED_TOKENS } from "./prefix-cache.js";

/**
 * The arithmetic of pass planning, pure: which branches share a pass within
 * the token limit and the pair bound, the chunks of a long state, and the
 * token costs they are grouped by. The planner (planner.ts) applies it to a
 * loaded build and the caches; the engine (index.ts) runs what it plans.
 */

/**
 * Prefix tokens a pass always computes itself, even on a cache hit. Two, not
 * one: with a single prefix row the attention products run as
 * matrix × vector, whose sums round differently from the matrix × matrix
 * products of a whole pass, and the int8 rewrite's per-row activation scales
 * amplify that (a hit read 0.27 off in log-probability on the 0.5B with one
 * row, exactly equal with two; docs/experiments/prefix-cache.md).
 */
export const COMPUTED_PREFIX_TOKENS = 2;

/**
 * Whether a prefix's keys and values outlive its pass (the prefix cache, or a
 * request's carry): a build that takes past keys and values, and a state worth
 * keeping (MIN_CACHED_TOKENS).
 */
export function carries(lb: LoadedBuild, prefixLength: number): boolean {
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
export function longPassesOf(held: number, branches: readonly EncodedQuestion[], limit: number, which: readonly number[] | undefined, maxPairs: number): number[][] {
  // Every pass continues the state's keys and values: narrow blocks cost a pass of their own nothing more.
  const room = Math.min(limit, Math.max(pairsRoom(held, limit), COMPUTED_PREFIX_TOKENS));
  return passesOf(COMPUTED_PREFIX_TOKENS, branches, room, which, true, maxPairs, held);
}

/** The most tokens t that can follow p computed ones with t·(p + t) ≤ limit² attention pairs. */
function pairsRoom(p: number, limit: number): number {
  return Math.floor((-p + Math.sqrt(p * p + 4 * limit * limit)) / 2);
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
export function blockCost(branches: readonly EncodedQuestion[], b: Block): number {
  return b.stem + b.members.reduce((s, i) => s + branchCost(branches[i]!) - b.stem, 0);
}

/** `planPasses` over the blocks of the branches named by `which` (all when omitted), as branch indices. */
export function passesOf(
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
