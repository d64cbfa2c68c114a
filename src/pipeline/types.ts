import type { RequestDeadline } from "../inference/work.js";
import type { RequestEnvelope, SystemOneResponse } from "../validate/schema.js";
import type { Timings } from "./timings.js";
import type { QuestionReading } from "../probability/confidence.js";

export interface PipelineContext {
  requestId: string;
  /** Organization the request is charged to (from the API key). */
  orgId: string;
  timings: Timings;
  /**
   * The request's one signal (deadline, hang-up, drain). Every pass the
   * request runs carries it: the inference pool finds the request's admitted
   * work, lane and organization by it.
   */
  signal?: AbortSignal;
  /**
   * The caller's deadline (the HTTP route's). With it, the pipeline's work
   * admission (`InferencePool.admit`, before `admit` below) refuses a request
   * that would not finish in time (529) and raises the deadline of one whose
   * own work needs longer than the default (up to ASSAY_REQUEST_TIMEOUT_MAX_MS).
   * Without it (CLI, batch) nothing is refused for time.
   */
  deadline?: RequestDeadline;
  /**
   * Called once the request's input tokens are known (after tokenizing) and
   * before any model work: the accounts layer places its credit hold here.
   * Throwing (e.g. a 402 AssayError) ends the request with that error.
   */
  admit?: (inputTokens: number) => Promise<void> | void;
  /**
   * Offline tools only (`assay eval`, the confidence fit): called with what the engine read for each
   * general question before its answer is made, so that a map can be fitted on the readings the
   * server answers from. The HTTP route never sets it.
   */
  onReading?: (questionId: string, reading: QuestionReading) => void;
}

export interface ModelListing {
  id: string;
  family: "general" | "factcheck" | "codesearch";
  /** Public name this one is an alias of, or null. */
  alias_of: string | null;
  deprecated: boolean;
  /** Model build (manifest build hash) it resolves to here. */
  build: string | null;
  /**
   * Whether the build answers through fitted calibration maps (a shipped fit, or `assay calibrate`'s beside
   * it) or raw readings (a site's new build until it is fitted); null before the build is read.
   */
  calibrated: boolean | null;
  ready: boolean;
}

/**
 * The one path from a validated envelope to a response: the HTTP route and
 * the batch CLI both call `run`. It validates what depends on the model
 * (question counts, types), builds prompts, tokenizes, runs the workers and
 * turns option log-probabilities into answers. Failures are `AssayError`s.
 */
export interface Pipeline {
  run(envelope: RequestEnvelope, ctx: PipelineContext): Promise<SystemOneResponse>;
  listModels(): ModelListing[];
  /** True once the default model is loaded and warm. */
  ready(): boolean;
  close(): Promise<void>;
}
