/**
 * What the batch runner scores requests with: the engine in this process
 * (EnginePipeline.run, the HTTP route's own path) or a running server.
 */
import type { RequestEnvelope, SystemOneResponse } from "../validate/schema.js";

/** How one valid request would pack, for grouping requests that share a state. */
export interface GroupInfo {
  /** Requests with the same key (same model name, identical state) may share one pass. */
  key: string;
  questions: number;
  /** Prompt tokens of the shared prefix (system text + state): charged once per pass. */
  prefixTokens: number;
  /** Charged prompt tokens of this request's own questions (their suffixes). */
  questionTokens: number;
  /** Packed tokens of this request's question blocks (suffixes + extra label tokens). */
  blockTokens: number;
  /** Longest packed sequence one pass may have. */
  maxPackedTokens: number;
}

export interface Scorer {
  /** Human-readable: "in-process judge-latest (build …)" or "http://…". */
  readonly description: string;
  /**
   * Score one request. Failures the server would answer with a status are
   * thrown as ScoreError; anything else (the server unreachable) ends the run.
   */
  score(request: RequestEnvelope, requestId: string): Promise<SystemOneResponse>;
  /** Present when this scorer can tell how requests pack (in-process only); null: never group it. */
  groupInfo?(request: RequestEnvelope): GroupInfo | null;
  /** The model family of a public name, when known (for prices). */
  family?(model: string): "general" | "factcheck" | "codesearch" | null;
  close(): Promise<void>;
}
