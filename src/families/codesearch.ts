import type { ResolvedModel } from "../models/registry.js";
import type { PipelineContext } from "../pipeline/types.js";
import { adjustForRecall } from "../probability/recall.js";
import { readRequest, readingNoul, type CodeSearchReading } from "../probability/codesearch-reading.js";
import { requestEvidence, type RequestEvidence } from "../prompt/codesearch-features.js";
import { codesearchItem, codesearchPrefix, codesearchWholeState, type CodeItem } from "../prompt/families.js";
import { codeSearchRequest } from "../validate/families.js";
import type { NoulAnswer, RequestEnvelope, SystemOneResponse } from "../validate/schema.js";
import { DEFAULT_BAND, escalate } from "./escalation.js";
import { CodeSearchFit, familyFit, type FamilyEnv } from "./types.js";
import { likelyEscalated } from "../engine/index.js";
import { encodeBranches, plannedPasses, scoreYesNo, type EncodedBranches } from "./yesno.js";

/**
 * Code search: one query, many items; the probability that an agent needs
 * each. The query is the shared prefix, every item a branch. `-lite` scores
 * with the small build, `-max` with the large one, the base name escalates
 * the items the small build is unsure about. `noul` is the build's reading of
 * the whole request (src/probability/codesearch-reading.ts: the model's score
 * with what the issue names of each item, files against each other, folders
 * from the files beneath them), recall-adjusted so that noul > 0.5 keeps about
 * 95% of the needed items; `details.raw` is the model's own probability. A
 * string state, or a build without a fitted reading, gets the plain recall
 * shift of the raw score (src/probability/recall.ts).
 */

/**
 * Characters of a file preview the model reads. The lexical evidence reads
 * the whole preview; the model's share of the reading is small beside it, and
 * a 300-character preview (the module's docstring and imports) costs a 30-item
 * request about 3,500 tokens instead of 11,000, attention growing with the
 * square of an item's length. Held out, the reading keeps as few items at the
 * same recall as with 600 characters or the whole preview
 * (docs/experiments/codesearch-readings.md).
 */
export const PREVIEW_CHARS = 300;

/** Prompt tokens above which an item is not scored (spec: overflow). */
export const ITEM_TOKEN_LIMIT = 8192;
const PASS_TOKENS = 4096;

export interface CodeSearchDetail {
  raw: number;
  overflow: boolean;
  escalated: boolean;
  scores: Record<string, number>;
}

interface Parsed {
  prefixText: string;
  ids: string[];
  suffixTexts: string[];
  /** Null for a string state: nothing to read the items against. */
  evidence: RequestEvidence | null;
}

const cutPreview = (item: CodeItem): CodeItem =>
  item.filePreview && item.filePreview.text.length > PREVIEW_CHARS ? { ...item, filePreview: { text: item.filePreview.text.slice(0, PREVIEW_CHARS) } } : item;

function parse(env: RequestEnvelope, lbStyle: Parameters<typeof codesearchPrefix>[0]): Parsed {
  const req = codeSearchRequest(env);
  const suffixTexts = req.items
    ? req.items.map((item, i) => codesearchItem(lbStyle, cutPreview(item as CodeItem), req.instructions[i]))
    : req.instructions.map((text) => codesearchWholeState(lbStyle, text));
  const evidence = req.items ? requestEvidence(req.query, req.items as CodeItem[]) : null;
  return { prefixText: codesearchPrefix(lbStyle, req.query), ids: req.ids, suffixTexts, evidence };
}

export async function runCodeSearch(
  fam: FamilyEnv,
  model: ResolvedModel,
  env: RequestEnvelope,
  ctx: PipelineContext,
): Promise<SystemOneResponse> {
  const first = fam.build(model.build);
  const t0 = performance.now();
  const parsed = parse(env, first.style);
  const t1 = performance.now();
  ctx.timings.add("prompt", t1 - t0);
  // Nothing is tokenized, held or charged while the build that scores first is not running.
  const release = fam.acquire(model.build, env.model);
  try {
    const enc = encodeBranches(first, parsed.prefixText, parsed.suffixTexts);
    const large = model.escalateTo ? fam.build(model.escalateTo) : null;
    const encLarge = large ? encodeBranches(large, parsed.prefixText, parsed.suffixTexts) : null;
    ctx.timings.add("tokenize", performance.now() - t1);

    const overflow = enc.suffixTokens.map((n) => enc.prefix.length + n > ITEM_TOKEN_LIMIT);
    const scored = overflow.flatMap((o, i) => (o ? [] : [i]));
    const billed = (e: EncodedBranches, which: readonly number[]) =>
      which.length === 0 ? 0 : e.prefix.length + which.reduce((s, i) => s + e.suffixTokens[i]!, 0);
    // Passes of at most PASS_TOKENS padded tokens: attention work per token is
    // the same in smaller passes, and peak memory (heads × branches × longest ×
    // (prefix + longest) scores) stays near 1 GB. An item longer than that
    // (up to the 8,192-token item limit) gets a pass of its own.
    const limit = Math.min(fam.maxPackedTokens, PASS_TOKENS);
    // Admission by estimated work before the hold (529 / 422 hold nothing): the
    // small build's passes, and the large build's for the share of items that
    // may escalate (replanned with the actual ones once they are known).
    const escalating = large && encLarge ? plannedPasses(fam.engine, large, encLarge, limit, ctx.orgId, likelyEscalated(scored, (i) => encLarge.suffixTokens[i]!)) : [];
    const work = fam.engine.admit([...plannedPasses(fam.engine, first, enc, limit, ctx.orgId, scored), ...escalating], ctx);
    try {
      // The hold covers the worst case: every scored item re-sent to the large build.
      await ctx.admit?.(billed(enc, scored) + (encLarge ? billed(encLarge, scored) : 0));

      const small = scored.length ? await scoreYesNo(fam.engine, first, enc, limit, ctx, scored) : { p: enc.suffixTokens.map(() => NaN), passes: 0 };
      let raw = small.p;
      let largeP: number[] = raw.map(() => NaN);
      let escalated = raw.map(() => false);
      let inputTokens = billed(enc, scored);
      const firstFit = familyFit(first, "codesearch", CodeSearchFit);
      if (large && encLarge && model.escalateTo) {
        const band = firstFit?.band ?? DEFAULT_BAND;
        const out = await escalate(
          raw,
          band,
          () => fam.acquire(model.escalateTo!, env.model),
          async (idx) => {
            work.replan(plannedPasses(fam.engine, large, encLarge, limit, ctx.orgId, idx));
            const r = await scoreYesNo(fam.engine, large, encLarge, limit, ctx, idx);
            inputTokens += billed(encLarge, idx);
            return idx.map((i) => r.p[i]!);
          },
        );
        raw = out.final;
        largeP = out.large;
        escalated = out.escalated;
      }

      const t2 = performance.now();
      const largeFit = large ? familyFit(large, "codesearch", CodeSearchFit) : null;
      // The base name reads its mixed scores with the reading fitted for them; without one, as the small build.
      const reading: CodeSearchReading | undefined = large ? (firstFit?.reading_escalated ?? firstFit?.reading) : firstFit?.reading;
      const read =
        parsed.evidence && reading
          ? readRequest(parsed.evidence, raw.map((r, i) => (overflow[i] ? Number.NaN : r)), reading, large ? { small: small.p, large: largeP } : undefined).p
          : null;
      const answers: Record<string, NoulAnswer> = {};
      const details: Record<string, CodeSearchDetail> = {};
      parsed.ids.forEach((id, i) => {
        if (overflow[i]) {
          answers[id] = { type: "noul", noul: 1 };
          details[id] = { raw: 1, overflow: true, escalated: false, scores: {} };
          return;
        }
        const fit = escalated[i] ? largeFit : firstFit;
        const scores: Record<string, number> = { [model.build]: small.p[i]! };
        if (escalated[i]) scores[model.escalateTo!] = largeP[i]!;
        const noul = read && reading ? readingNoul(read[i]!, reading, parsed.evidence!.folder[i] !== null) : adjustForRecall(raw[i]!, fit?.recall);
        answers[id] = { type: "noul", noul };
        details[id] = { raw: raw[i]!, overflow: false, escalated: escalated[i]!, scores };
      });
      ctx.timings.add("probability", performance.now() - t2);
      return {
        model: env.model,
        answers,
        usage: { input_tokens: inputTokens, output_tokens: 0 },
        request_id: ctx.requestId,
        effort: model.effort ?? "medium",
        details,
        escalation_skipped: false,
      };
    } finally {
      work.release();
    }
  } finally {
    release();
  }
}
