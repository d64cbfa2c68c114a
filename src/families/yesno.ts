import { labelIds, type Engine, type EncodedQuestion, type LoadedBuild, type PlannedPass, type ScoreContext } from "../engine/index.js";
import { softmax } from "../probability/index.js";
import { YES_NO, yesNoLabels } from "../prompt/families.js";

/**
 * Yes/no scoring of many branches against one shared prefix, for the
 * families whose questions are all "is this claim supported / is this item
 * needed". The engine plans the passes (Engine.scoreMany).
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

/**
 * The passes `scoreYesNo` will run for `which` branches (all when omitted), as shapes for the work
 * admission: as they will run for `orgId` (less the preamble, and what its prefix cache holds).
 */
export function plannedPasses(engine: Engine, lb: LoadedBuild, enc: EncodedBranches, limit: number, orgId: string | undefined, which?: readonly number[]): PlannedPass[] {
  return engine.planAsRun(lb, enc.prefix, enc.branches, limit, orgId, which);
}

export interface YesNoScores {
  /** P(yes) per branch, in input order; NaN for branches not scored. */
  p: number[];
  passes: number;
}

/** Scores the branches named by `which` (all when omitted); the caller bills the prefix once and each branch once. */
export async function scoreYesNo(
  engine: Engine,
  lb: LoadedBuild,
  enc: EncodedBranches,
  limit: number,
  ctx: ScoreContext,
  which?: readonly number[],
): Promise<YesNoScores> {
  const { lps, passes } = await engine.scoreMany(lb, enc.prefix, enc.branches, limit, ctx, which);
  return { p: lps.map((lp) => (lp ? yesProbability(lp) : Number.NaN)), passes };
}

/** P(yes) = mass of the yes forms over the mass of all forms, from the label log-probabilities (any labels ordered as YES_NO). */
export function yesProbability(lp: readonly number[]): number {
  let yes = 0;
  softmax(lp).forEach((q, li) => {
    if (YES_NO.option[li] === 0) yes += q;
  });
  return yes;
}
