import { AssayError } from "../errors/catalogue.js";
import { pack, readLabels, type EncodedQuestion } from "../inference/pack.js";
import type { InferencePool } from "../inference/pool.js";
import type { PlannedPass } from "../inference/work.js";
import type { PipelineContext } from "../pipeline/types.js";
import { softmax } from "../probability/index.js";
import { YES_NO, yesNoLabels } from "../prompt/families.js";
import { labelIds, type LoadedBuild } from "../pipeline/build.js";

/**
 * Yes/no scoring of many branches against one shared prefix, for the
 * families whose questions are all "is this claim supported / is this item
 * needed". Branches are packed into as few passes as the packed-token limit
 * allows; long and short branches go to different passes, because a pass
 * pads every branch to its longest one.
 */

export interface EncodedBranches {
  prefix: number[];
  branches: EncodedQuestion[];
  /** Tokens of each branch's prompt (suffix only, labels excluded). */
  suffixTokens: number[];
}

/**
 * `prefix` as text, or already as token ids (a document chunk cut by tokens).
 * A branch is its suffix text, read over yes/no; or its suffix with its own
 * labels (positive forms first, then negative, as YES_NO).
 */
export function encodeBranches(
  lb: LoadedBuild,
  prefix: string | number[],
  suffixes: readonly (string | { suffix: string; labels: readonly string[] })[],
): EncodedBranches {
  const labels = yesNoLabels(lb.style).map((l) => labelIds(lb, l));
  const prefixIds = typeof prefix === "string" ? lb.tokenizer.encode(prefix) : prefix;
  const branches = suffixes.map((s) =>
    typeof s === "string"
      ? { suffix: lb.tokenizer.encode(s), labels, terminator: lb.terminator }
      : { suffix: lb.tokenizer.encode(s.suffix), labels: s.labels.map((l) => labelIds(lb, l)), terminator: lb.terminator },
  );
  return { prefix: prefixIds, branches, suffixTokens: branches.map((b) => b.suffix.length) };
}

/** Tokens one branch adds to a pass: its suffix and its label trie (at most every label token plus an end). */
export function branchCost(b: EncodedQuestion): number {
  return b.suffix.length + b.labels.reduce((s, l) => s + l.length, 0) + 1;
}

/**
 * Groups branch indices into passes. The graph pads every branch of a pass to
 * the pass's longest one (attention is [branches × longest × (prefix +
 * longest)]), so the budget counts padded tokens: longest-first, a pass takes
 * branches while prefix + count × longest stays within `limit`. Branches of
 * similar length end up together and memory stays bounded by the limit.
 */
export function planPasses(prefixLength: number, costs: readonly number[], limit: number): number[][] {
  const order = costs.map((_, i) => i).sort((a, b) => costs[b]! - costs[a]!);
  const passes: number[][] = [];
  let cur: number[] = [];
  let longest = 0;
  for (const i of order) {
    if (cur.length > 0 && prefixLength + (cur.length + 1) * longest > limit) {
      passes.push(cur);
      cur = [];
    }
    if (cur.length === 0) longest = costs[i]!;
    cur.push(i);
  }
  if (cur.length > 0) passes.push(cur);
  return passes;
}

/**
 * The passes `scoreYesNo` will run for `which` branches (all when omitted),
 * as shapes for the work admission, planned exactly as it plans them. Block
 * widths use `branchCost`, a bound on the block (every label token counted).
 */
export function plannedPasses(lb: LoadedBuild, enc: EncodedBranches, limit: number, which?: readonly number[]): PlannedPass[] {
  const idx = which ? [...which] : enc.branches.map((_, i) => i);
  const costs = idx.map((i) => branchCost(enc.branches[i]!));
  const prefix = enc.prefix.length;
  return planPasses(prefix, costs, limit).map((pass) => {
    const c = pass.map((j) => costs[j]!);
    const shape = { tokens: prefix + c.reduce((a, b) => a + b, 0), prefix, branches: pass.length, width: Math.max(...c) };
    return { model: lb.build.onnxPath, shape };
  });
}

export interface YesNoScores {
  /** P(yes) per branch, in input order; NaN for branches not scored. */
  p: number[];
  passes: number;
}

/**
 * Scores the branches named by `which` (all when omitted). Each pass is one
 * `pool.infer`; the caller bills the prefix once and each branch once.
 */
export async function scoreYesNo(
  pool: InferencePool,
  lb: LoadedBuild,
  enc: EncodedBranches,
  limit: number,
  ctx: PipelineContext,
  which?: readonly number[],
): Promise<YesNoScores> {
  const idx = which ? [...which] : enc.branches.map((_, i) => i);
  const p = new Array<number>(enc.branches.length).fill(Number.NaN);
  const passes = planPasses(
    enc.prefix.length,
    idx.map((i) => branchCost(enc.branches[i]!)),
    limit,
  ).map((pass) => pass.map((j) => idx[j]!));
  for (const pass of passes) {
    // A request cut short (deadline, hang-up, drain) starts no further pass;
    // the queued one was dropped and the running one cut loose by the pool.
    ctx.signal?.throwIfAborted();
    const packed = pack(
      enc.prefix,
      pass.map((i) => enc.branches[i]!),
    );
    const q0 = performance.now();
    const out = await pool.infer(lb.build.onnxPath, packed, ctx.signal);
    ctx.timings.add("inference", out.runMs);
    ctx.timings.add("queue", Math.max(0, performance.now() - q0 - out.runMs));
    const lps = readLabels(packed, out.logprobs);
    pass.forEach((i, k) => {
      p[i] = yesProbability(lps[k]!);
    });
  }
  return { p, passes: passes.length };
}

/** P(yes) = mass of the yes forms over the mass of all forms, from the label log-probabilities (any labels ordered as YES_NO). */
export function yesProbability(lp: readonly number[]): number {
  if (!lp.every(Number.isFinite)) throw new AssayError("MODEL_FAILED", "the model returned non-finite log-probabilities");
  let yes = 0;
  softmax(lp).forEach((q, li) => {
    if (YES_NO.option[li] === 0) yes += q;
  });
  return yes;
}
