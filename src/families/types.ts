import { z } from "zod";
import type { Engine, LoadedBuild } from "../engine/index.js";
import type { Debias } from "../prompt/index.js";
import { CodeSearchReading } from "../probability/codesearch-reading.js";

/** How a fact check document is read: windows of `chunkTokens`, and a longer one from each claim's evidence cut of `evidenceTokens` tokens (0: every window). */
export interface DocumentReading {
  chunkTokens: number;
  overlap: number;
  evidenceTokens: number;
}

/** What a family needs: the engine, builds, the model lifecycle and its settings. */
export interface FamilyEnv {
  engine: Engine;
  /** A loaded build (tokenizer, manifest) by its models.json build name. */
  build(name: string): LoadedBuild;
  /** Counts a request as a user of `build`; throws 503 + Retry-After while it is not loaded. */
  acquire(build: string, forModel: string): () => void;
  maxPackedTokens: number;
  /** The general family's option-order debiasing (ASSAY_DEBIAS) and shortlist size (ASSAY_SHORTLIST). */
  debias: Debias;
  shortlist: number;
  /** How a fact check document is read (ASSAY_FACTCHECK_CHUNK_TOKENS / _OVERLAP / _EVIDENCE_TOKENS). */
  factcheckReading: DocumentReading;
}

const BandFit = z.object({ lo: z.number().min(0).max(1), hi: z.number().min(0).max(1) });

/** `codesearch` section of a build's calibration file. */
export const CodeSearchFit = z.looseObject({
  recall: z.object({ target: z.number().gt(0).lt(1), threshold: z.number().gt(0).lt(1) }).optional(),
  /** Small-model scores that count as unsure and escalate (`judge-codegrep`). */
  band: BandFit.optional(),
  /** The request-level reading (src/probability/codesearch-reading.ts); `recall` above then serves string states only. */
  reading: CodeSearchReading.optional(),
  /** Small build only: the reading of the escalating name's mixed scores. */
  reading_escalated: CodeSearchReading.optional(),
});
export type CodeSearchFit = z.infer<typeof CodeSearchFit>;

/**
 * A content-free prior for the family's yes/no reading: each claim is also
 * read against `state` (a neutral document) and `weight` times that log-odds
 * is taken off, before the Platt map (fitted on the corrected score).
 */
export const FamilyPrior = z.object({ weight: z.number().min(0).max(1), state: z.string() });
export type FamilyPrior = z.infer<typeof FamilyPrior>;

/** `factcheck` section; the Platt map itself is `platt["factcheck:noul"]`. */
export const FactCheckFit = z.looseObject({ band: BandFit.optional(), prior: FamilyPrior.optional() });
export type FactCheckFit = z.infer<typeof FactCheckFit>;

/** A family section of a build's shipped calibration, or null when not fitted. */
export function familyFit<T>(lb: LoadedBuild, section: string, schema: z.ZodType<T>): T | null {
  const cal = lb.build.manifest.calibration as Record<string, unknown> | null;
  const raw = cal?.[section];
  if (raw === undefined) return null;
  const parsed = schema.safeParse(raw);
  return parsed.success ? parsed.data : null;
}
