import { invalid } from "../errors/catalogue.js";
import type { ResolvedModel } from "../models/registry.js";
import type { LoadedBuild } from "../pipeline/build.js";
import type { PipelineContext } from "../pipeline/types.js";
import { calibrateNoul } from "../probability/calibration.js";
import { logit } from "../probability/recall.js";
import { factcheckClaim, factcheckPrefixParts } from "../prompt/families.js";
import { describeZodError, factCheckQuestions, type NoulAnswer, type RequestEnvelope, type SystemOneResponse } from "../validate/schema.js";
import { DEFAULT_BAND, escalate } from "./escalation.js";
import { FactCheckFit, familyFit, type FamilyEnv } from "./types.js";
import { encodeBranches, scoreYesNo } from "./yesno.js";

/**
 * Fact check: the state is a document, each question a claim; the answer is
 * the probability that the document supports the claim. A document longer
 * than one chunk is read in overlapping token windows and each claim takes
 * its best-supported window (the MiniCheck approach): nothing is cut, and a
 * claim supported anywhere in the document is found.
 */

export const FACTCHECK_CALIBRATION_KEY = "factcheck:noul";

export interface ChunkPlan {
  /** [start, end) token offsets into the document. */
  ranges: [number, number][];
}

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
  /** Index of the best-supported chunk (0 when the document is one chunk). */
  chunk: number;
  chunks: number;
}

interface Scored {
  /** Max over chunks of P(supported), per claim. */
  p: number[];
  bestChunk: number[];
  tokens: number;
}

/** Scores `which` claims over every chunk with one build; bills what the model reads. */
async function scoreClaims(
  fam: FamilyEnv,
  lb: LoadedBuild,
  document: string,
  claims: readonly string[],
  which: readonly number[],
  ctx: PipelineContext,
  chunkTokens: number,
  overlap: number,
): Promise<Scored> {
  const { head, tail } = factcheckPrefixParts(lb.style);
  const headIds = lb.tokenizer.encode(head);
  const tailIds = lb.tokenizer.encode(tail);
  const docIds = lb.tokenizer.encode(document);
  const suffixes = claims.map((c) => factcheckClaim(lb.style, c));
  const p = claims.map(() => Number.NaN);
  const bestChunk = claims.map(() => 0);
  let tokens = 0;
  const limit = fam.maxPackedTokens;
  const ranges = chunkRanges(docIds.length, chunkTokens, overlap);
  for (const [ci, [a, b]] of ranges.entries()) {
    const enc = encodeBranches(lb, [...headIds, ...docIds.slice(a, b), ...tailIds], suffixes);
    const r = await scoreYesNo(fam.pool, lb, enc, limit, ctx, which);
    tokens += enc.prefix.length + which.reduce((s, i) => s + enc.suffixTokens[i]!, 0);
    for (const i of which) {
      if (!(p[i]! >= r.p[i]!)) {
        p[i] = r.p[i]!;
        bestChunk[i] = ci;
      }
    }
  }
  return { p, bestChunk, tokens };
}

export async function runFactCheck(
  fam: FamilyEnv,
  model: ResolvedModel,
  env: RequestEnvelope,
  ctx: PipelineContext,
  chunkTokens: number,
  overlap: number,
): Promise<SystemOneResponse> {
  const qs = factCheckQuestions().safeParse(env.questions);
  if (!qs.success) throw invalid(describeZodError(qs.error).replace(/^body/, "questions"));
  if (typeof env.state !== "string") {
    throw invalid("state: a fact check state is the document, as a string");
  }
  if (env.state.trim().length === 0) throw invalid("state: the document is empty");
  const document = env.state;
  const ids = Object.keys(qs.data);
  const claims = ids.map((id) => qs.data[id]!.instructions);
  const first = fam.build(model.build);
  const large = model.escalateTo ? fam.build(model.escalateTo) : null;
  const all = claims.map((_, i) => i);
  const release = fam.acquire(model.build, env.model);
  try {
    // Every token the model reads, per build: the chunks' prefixes and each claim once per chunk.
    const t0 = performance.now();
    const readTokens = (lb: LoadedBuild) => {
      const { head, tail } = factcheckPrefixParts(lb.style);
      const fixed = lb.tokenizer.encode(head).length + lb.tokenizer.encode(tail).length;
      const chunks = chunkRanges(lb.tokenizer.encode(document).length, chunkTokens, overlap);
      const claimTokens = claims.reduce((s, c) => s + lb.tokenizer.encode(factcheckClaim(lb.style, c)).length, 0);
      return chunks.reduce((s, [a, b]) => s + fixed + (b - a) + claimTokens, 0);
    };
    const smallTokens = readTokens(first);
    ctx.timings.add("tokenize", performance.now() - t0);
    await ctx.admit?.(smallTokens + (large ? readTokens(large) : 0));

    const small = await scoreClaims(fam, first, document, claims, all, ctx, chunkTokens, overlap);
    const chunks = chunkRanges(first.tokenizer.encode(document).length, chunkTokens, overlap).length;
    const firstCal = first.build.manifest.calibration;
    const smallCal = small.p.map((p) => calibrateNoul(logit(p), firstCal, FACTCHECK_CALIBRATION_KEY));
    let final = smallCal;
    let raw = small.p;
    let escalated = claims.map(() => false);
    let bestChunk = small.bestChunk;
    let largeRaw = claims.map(() => Number.NaN);
    let tokens = small.tokens;
    if (large && model.escalateTo) {
      const band = familyFit(first, "factcheck", FactCheckFit)?.band ?? DEFAULT_BAND;
      const largeCal = large.build.manifest.calibration;
      const out = await escalate(
        smallCal,
        band,
        () => fam.acquire(model.escalateTo!, env.model),
        async (idx) => {
          const r = await scoreClaims(fam, large, document, claims, idx, ctx, chunkTokens, overlap);
          tokens += r.tokens;
          idx.forEach((i) => {
            largeRaw[i] = r.p[i]!;
            bestChunk[i] = r.bestChunk[i]!;
          });
          return idx.map((i) => calibrateNoul(logit(r.p[i]!), largeCal, FACTCHECK_CALIBRATION_KEY));
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
      details[id] = { raw: raw[i]!, escalated: escalated[i]!, scores, chunk: bestChunk[i]!, chunks };
    });
    return {
      model: env.model,
      answers,
      usage: { input_tokens: tokens, output_tokens: 0 },
      request_id: ctx.requestId,
      details,
    };
  } finally {
    release();
  }
}
