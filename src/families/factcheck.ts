import { invalid } from "../errors/catalogue.js";
import type { ResolvedModel } from "../models/registry.js";
import type { PipelineContext } from "../pipeline/types.js";
import { NOUL_KEY, calibrateNoul, logit, sigmoid } from "../probability/calibration.js";
import { claimQuestion, factcheckClaim, factcheckClaimTrueFalse, factcheckPrefixParts } from "../prompt/families.js";
import { factCheckRequest } from "../validate/families.js";
import type { NoulAnswer, RequestEnvelope, SystemOneResponse } from "../validate/schema.js";
import { DEFAULT_BAND, escalate } from "./escalation.js";
import { FactCheckFit, familyFit, type DocumentReading, type FamilyEnv, type FamilyPrior } from "./types.js";
import { encodeBranches, plannedPasses, scoreYesNo, yesProbability, type EncodedBranches } from "./yesno.js";
import { isStatement } from "../prompt/index.js";
import { EvidenceIndex } from "../prompt/evidence.js";
import { branchCost, likelyEscalated, NEUTRAL_STATE, passLimit, type LoadedBuild } from "../engine/index.js";

/**
 * Fact check: the state is a document, each question a claim; the answer is
 * the probability that the document supports the claim. A document longer
 * than one chunk is read, for each claim, from its evidence cut: the passage
 * of the document most like the claim, up to a token budget
 * (`prompt/evidence.ts`). With the cut off (0), it is read in overlapping
 * token windows and each claim takes its best-supported window (the MiniCheck
 * approach): nothing is cut, and every claim pays for every window.
 */

export const FACTCHECK_CALIBRATION_KEY = "factcheck:noul";

export function chunkRanges(length: number, size: number, overlap: number): [number, number][] {
  if (length <= size) return [[0, length]];
  const step = Math.max(1, size - overlap);
  const out: [number, number][] = [];
  for (let start = 0; ; start += step) {
    const end = Math.min(length, start + size);
    out.push([start, end]);
    if (end === length) break;
  }
  return out;
}

export interface FactCheckDetail {
  raw: number;
  escalated: boolean;
  scores: Record<string, number>;
  /** Index of the best-supported window (0 when the document is one window or read from its evidence cut). */
  chunk: number;
  /** Windows the document spans (`ASSAY_FACTCHECK_CHUNK_TOKENS`), however it was read. */
  chunks: number;
  /** Read from the evidence cut: the `[start, end)` character range of the document the claim was read against (one passage; a list, so the field can carry several). */
  evidence?: [number, number][];
}

interface Scored {
  /** Max over chunks of P(supported), per claim. */
  p: number[];
  bestChunk: number[];
  tokens: number;
}

/** One build's encoding of a request, made once: every prefix the claims are read under, and every claim. */
interface EncodedDocument {
  lb: LoadedBuild;
  /** The prefix token ids (system text + the document, a window of it, or a claim's evidence cut). */
  prefixes: number[][];
  /** Per prefix, the claims read under it: every claim for a window, its claims for an evidence cut. */
  reads: number[][];
  /** Per prefix, the window of the document it holds (0 for the whole document or an evidence cut). */
  window: number[];
  /** Windows the document spans. */
  windows: number;
  /** Per claim, the character ranges of its evidence cut (null when read from the document or its windows). */
  evidence: ([number, number][] | null)[];
  /**
   * Claim i's yes/no reading is branch i (the billed one); a claim written as
   * a statement also has a true/false reading, branch `second[i]` (unbilled).
   */
  claims: EncodedBranches;
  second: (number | null)[];
  /** The most tokens one pass of `lb` packs (passLimit): every pass of this encoding is planned within it. */
  limit: number;
}

/** The branches that read `which` claims: each claim's yes/no reading and, for a statement, its true/false one. */
function readingsOf(d: EncodedDocument, which: readonly number[]): number[] {
  return [...which, ...which.flatMap((i) => (d.second[i] === null ? [] : [d.second[i]!]))];
}

/** A claim's P(supported): the mean log-odds of its readings (as the general family averages a statement's). */
function claimProbability(d: EncodedDocument, p: readonly number[], i: number): number {
  const j = d.second[i];
  return j === null || j === undefined ? p[i]! : sigmoid((logit(p[i]!) + logit(p[j]!)) / 2);
}

function encodeDocument(lb: LoadedBuild, document: string, claims: readonly string[], reading: DocumentReading, maxPackedTokens: number): EncodedDocument {
  const { head, tail } = factcheckPrefixParts(lb.style);
  const docIds = lb.tokenizer.encode(document);
  // A document of one window, and an evidence cut, are encoded with the text around them, as the
  // general family encodes its prefix (token merges at the seams match); windows are cut by tokens.
  const ranges = chunkRanges(docIds.length, reading.chunkTokens, reading.overlap);
  const all = claims.map((_, i) => i);
  let prefixes: number[][];
  let reads: number[][];
  let window: number[];
  const evidence: ([number, number][] | null)[] = claims.map(() => null);
  let around: [number[], number[]] | null = null;
  const windowIds = ([a, b]: [number, number]) => {
    const [headIds, tailIds] = (around ??= [lb.tokenizer.encode(head), lb.tokenizer.encode(tail)]);
    return [...headIds, ...docIds.slice(a, b), ...tailIds];
  };
  if (ranges.length === 1) {
    prefixes = [lb.tokenizer.encode(`${head}${document}${tail}`)];
    reads = [all];
    window = [0];
  } else if (reading.evidenceTokens > 0) {
    // Claims whose cuts are the same text share one prefix (and its pass).
    const index = new EvidenceIndex(document, (text) => lb.tokenizer.encode(text).length + 1);
    const byText = new Map<string, number>();
    prefixes = [];
    reads = [];
    claims.forEach((claim, i) => {
      const cut = index.passage(claim, reading.evidenceTokens);
      const text = cut?.text ?? "";
      let at = byText.get(text);
      if (at === undefined) {
        at = prefixes.length;
        byText.set(text, at);
        // A cut with nothing in it (every segment alone over the budget) is read from the first window instead.
        prefixes.push(text.length > 0 ? lb.tokenizer.encode(`${head}${text}${tail}`) : windowIds(ranges[0]!));
        reads.push([]);
      }
      reads[at]!.push(i);
      if (cut) evidence[i] = [[cut.start, cut.end]];
    });
    window = prefixes.map(() => 0);
  } else {
    prefixes = ranges.map(windowIds);
    reads = prefixes.map(() => all);
    window = prefixes.map((_, ci) => ci);
  }
  // The claims are encoded once; each chunk's pass reuses them under its own prefix. A claim is
  // read twice when it is a statement: "does the document support …" (yes/no) and "is the statement
  // true or false" (true/false), as the general family reads a noul statement. Measured on the fact
  // check dev sets, docs/experiments/fact-check.md.
  const statements = claims.map((c) => isStatement(claimQuestion(c)));
  const second: (number | null)[] = [];
  let next = claims.length;
  for (const st of statements) second.push(st ? next++ : null);
  const texts = [
    ...claims.map((c) => factcheckClaim(lb.style, c)),
    ...claims.flatMap((c, i) => (statements[i] ? [factcheckClaimTrueFalse(lb.style, c)] : [])),
  ];
  const encoded = encodeBranches(lb, [], texts);
  // A claim's two readings are one question's presentations: one block behind their stem, as the
  // general family lays out a statement's (pack.ts), so that both families read a claim alike.
  second.forEach((j, i) => {
    if (j === null) return;
    encoded.branches[i]!.group = i;
    encoded.branches[j]!.group = i;
  });
  return { lb, prefixes, reads, window, windows: ranges.length, evidence, claims: encoded, second, limit: passLimit(lb, maxPackedTokens) };
}

/** Per prefix, which of `which` it reads (empty: the prefix is not read for them). */
function readsOf(d: EncodedDocument, which: readonly number[]): number[][] {
  const asked = new Set(which);
  return d.reads.map((r) => r.filter((i) => asked.has(i)));
}

/** Tokens billed for `which` claims: each prefix they are read under, plus those claims as written (yes/no reading) under it. */
function readTokens(d: EncodedDocument, which: readonly number[]): number {
  return readsOf(d, which).reduce((s, r, ci) => (r.length === 0 ? s : s + d.prefixes[ci]!.length + r.reduce((t, i) => t + d.claims.suffixTokens[i]!, 0)), 0);
}

/**
 * How a build's claims are calibrated: the family's own fit where one was
 * shipped (`factcheck:noul` and the `factcheck` section's prior), else the
 * general family's noul map and prior, which then read a claim exactly as
 * `judge-*` names on the same build read "The document supports this claim:
 * …" about the document. The general map is fitted on BoolQ and both fact
 * check sets pooled and gated leave-one-dataset-out (`assay calibrate`);
 * on these two sets alone a family map did not hold on the other set
 * (docs/experiments/fact-check.md).
 */
export function claimFit(lb: LoadedBuild): { key: string; prior: FamilyPrior | null } {
  const cal = lb.build.manifest.calibration;
  const own = familyFit(lb, "factcheck", FactCheckFit);
  if (cal?.platt?.[FACTCHECK_CALIBRATION_KEY] || cal?.temperatures?.[FACTCHECK_CALIBRATION_KEY] || own?.prior) {
    return { key: FACTCHECK_CALIBRATION_KEY, prior: own?.prior && own.prior.weight > 0 ? own.prior : null };
  }
  const weight = cal?.prior?.["noul"] ?? 0;
  return { key: NOUL_KEY, prior: weight > 0 ? { weight, state: cal?.prior_state?.["noul"] ?? NEUTRAL_STATE } : null };
}

/** The build's content-free prior for claims, when its fit weighs one in. */
function priorOf(lb: LoadedBuild): FamilyPrior | null {
  return claimFit(lb).prior;
}

/**
 * Scores `which` claims with one build, each under every prefix that reads
 * it. A claim's score is its best window's (its one prefix's, for the whole
 * document or its evidence cut); with a prior, `weight` × the claim's
 * log-odds against the neutral document is then taken off (a constant per claim, so the best
 * window is the same either way). The model leans to "yes" for a claim that
 * sounds plausible on its own; what is left is what the document moved.
 */
async function scoreClaims(fam: FamilyEnv, d: EncodedDocument, which: readonly number[], ctx: PipelineContext): Promise<Scored> {
  const n = d.second.length;
  const p = new Array<number>(n).fill(Number.NaN);
  const bestChunk = new Array<number>(n).fill(0);
  const branches = readingsOf(d, which);
  for (const [ci, claims] of readsOf(d, which).entries()) {
    if (claims.length === 0) continue;
    const r = await scoreYesNo(fam.engine, d.lb, { ...d.claims, prefix: d.prefixes[ci]! }, d.limit, ctx, readingsOf(d, claims));
    for (const i of claims) {
      const q = claimProbability(d, r.p, i);
      if (!(p[i]! >= q)) {
        p[i] = q;
        bestChunk[i] = d.window[ci]!;
      }
    }
  }
  const prior = priorOf(d.lb);
  if (prior) {
    const reads = await fam.engine.prior(d.lb, prior.state, branches.map((b) => d.claims.branches[b]!), d.limit, ctx);
    const neutral = new Array<number>(d.claims.branches.length).fill(Number.NaN);
    branches.forEach((b, k) => (neutral[b] = yesProbability(reads[k]!)));
    for (const i of which) p[i] = sigmoid(logit(p[i]!) - prior.weight * logit(claimProbability(d, neutral, i)));
  }
  return { p, bestChunk, tokens: readTokens(d, which) };
}

/** The prior passes `scoreClaims` will run, for admission: none for claims whose prior the cache holds. */
function priorPasses(fam: FamilyEnv, d: EncodedDocument, which: readonly number[], orgId: string | undefined) {
  const prior = priorOf(d.lb);
  if (!prior) return [];
  return fam.engine.planPrior(d.lb, prior.state, readingsOf(d, which).map((b) => d.claims.branches[b]!), d.limit, orgId);
}

export async function runFactCheck(
  fam: FamilyEnv,
  asked: ResolvedModel,
  env: RequestEnvelope,
  ctx: PipelineContext,
): Promise<SystemOneResponse> {
  const { document, ids, claims } = factCheckRequest(env);
  const all = claims.map((_, i) => i);
  const t0 = performance.now();
  const encode = (lb: LoadedBuild) => encodeDocument(lb, document, claims, fam.factcheckReading, fam.maxPackedTokens);
  const wide = asked.escalateTo ? encode(fam.build(asked.escalateTo)) : null;
  // A document of several windows is read as the large build's own name reads it: the small build
  // reads windows that long at chance (WiCE's long test documents: AUROC 0.47–0.50), so its band
  // would escalate on noise and keep confident wrong answers (docs/experiments/fact-check.md).
  const direct = wide !== null && wide.windows > 1;
  const model = direct ? { ...asked, build: asked.escalateTo!, escalateTo: null } : asked;
  const small = direct ? wide : encode(fam.build(model.build));
  const big = direct ? null : wide;
  const first = small.lb;
  const large = big?.lb ?? null;
  ctx.timings.add("tokenize", performance.now() - t0);
  const release = fam.acquire(model.build, env.model);
  try {
    const reads = readsOf(small, all);
    all.forEach((i) => {
      const b = small.claims.branches[i]!;
      const longest = Math.max(...small.prefixes.filter((_, ci) => reads[ci]!.includes(i)).map((x) => x.length));
      const widest = Math.max(...readingsOf(small, [i]).map((j) => branchCost(small.claims.branches[j]!)));
      if (longest + widest > small.limit) {
        throw invalid(
          `the claim is ${b.suffix.length} tokens; with a document ${small.evidence[i] ? "cut" : "window"} of ${longest} tokens ` +
            `it exceeds the ${small.limit}-token limit of one pass; send a shorter claim`,
          ["questions", ids[i]!],
        );
      }
    });
    // Admission by estimated work before the hold (529 / 422 hold nothing): every
    // claim over every window, and with the large build the share of claims that
    // may escalate (replanned with the actual ones once they are known).
    const plan = (d: EncodedDocument, which: readonly number[]) => [
      ...readsOf(d, which).flatMap((r, ci) =>
        r.length === 0 ? [] : plannedPasses(fam.engine, d.lb, { ...d.claims, prefix: d.prefixes[ci]! }, d.limit, ctx.orgId, readingsOf(d, r)),
      ),
      ...priorPasses(fam, d, which, ctx.orgId),
    ];
    const escalating = big ? plan(big, likelyEscalated(all, (i) => big.claims.suffixTokens[i]!)) : [];
    const work = fam.engine.admit([...plan(small, all), ...escalating], ctx);
    try {
      // The hold covers the worst case: every claim re-read by the large build.
      await ctx.admit?.(readTokens(small, all) + (big ? readTokens(big, all) : 0));

      const smallScores = await scoreClaims(fam, small, all, ctx);
      const chunks = small.windows;
      const firstCal = first.build.manifest.calibration;
      const firstKey = claimFit(first).key;
      const smallCal = smallScores.p.map((p) => calibrateNoul(logit(p), firstCal, firstKey));
      let final = smallCal;
      let raw = smallScores.p;
      let escalated = claims.map(() => false);
      const bestChunk = smallScores.bestChunk;
      const largeRaw = claims.map(() => Number.NaN);
      let tokens = smallScores.tokens;
      if (large && big && model.escalateTo) {
        const band = familyFit(first, "factcheck", FactCheckFit)?.band ?? DEFAULT_BAND;
        const largeCal = large.build.manifest.calibration;
        const out = await escalate(
          smallCal,
          band,
          () => fam.acquire(model.escalateTo!, env.model),
          async (idx) => {
            work.replan(plan(big, idx));
            const r = await scoreClaims(fam, big, idx, ctx);
            tokens += r.tokens;
            idx.forEach((i) => {
              largeRaw[i] = r.p[i]!;
              bestChunk[i] = r.bestChunk[i]!;
            });
            const largeKey = claimFit(large).key;
            return idx.map((i) => calibrateNoul(logit(r.p[i]!), largeCal, largeKey));
          },
        );
        final = out.final;
        escalated = out.escalated;
        raw = raw.map((p, i) => (escalated[i] ? largeRaw[i]! : p));
      }
      const answers: Record<string, NoulAnswer> = {};
      const details: Record<string, FactCheckDetail> = {};
      ids.forEach((id, i) => {
        answers[id] = { type: "noul", noul: final[i]! };
        const scores: Record<string, number> = { [model.build]: smallCal[i]! };
        if (escalated[i]) scores[model.escalateTo!] = final[i]!;
        // Only a document of several windows has cuts, and it is never escalated (read by one build).
        const evidence = small.evidence[i];
        details[id] = { raw: raw[i]!, escalated: escalated[i]!, scores, chunk: bestChunk[i]!, chunks, ...(evidence ? { evidence } : {}) };
      });
      return {
        model: env.model,
        answers,
        usage: { input_tokens: tokens, output_tokens: 0 },
        request_id: ctx.requestId,
        details,
      };
    } finally {
      work.release();
    }
  } finally {
    release();
  }
}
