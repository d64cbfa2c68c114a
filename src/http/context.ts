/**
 * Per-request state the HTTP layer attaches to fastify's request object.
 * Set in the global onRequest hook (timings), the auth hook (org) and the
 * scoring routes' slot hook (admitted).
 */
import type { AdmittedRequest } from "../accounts/admission.js";
import type { Org } from "../accounts/types.js";
import type { Timings } from "../pipeline/timings.js";

declare module "fastify" {
  interface FastifyRequest {
    /** One timings object per request; feeds the `x-<stage>-time` headers. */
    timings: Timings;
    /** The organization of the API key; null before auth and on routes without auth. */
    org: Org | null;
    /** Scoring requests: the model name sent and, once answered, usage.input_tokens (metrics, request log). */
    scoring: { model: string; inputTokens: number | null } | null;
    /** Scoring requests: the concurrency slot, from the preValidation hook until the handler takes it over. */
    admitted: AdmittedRequest | null;
  }
}

export {};
