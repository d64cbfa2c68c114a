/**
 * FakePipelineForHttpErrorPaths exists ONLY to test the HTTP layer's
 * plumbing and error paths (status codes, bodies, headers, auth, request
 * ids). It is never used for answers and computes no probabilities: a
 * successful run returns an empty echo `{model, answers: {}, usage: 0/0}`.
 *
 * To exercise the per-question 422s through HTTP it applies the real
 * general-family question schema from src/validate/schema.ts, the same
 * contract the real pipeline has (per-family rules → AssayError
 * INVALID_REQUEST). Tests of real answers belong with the engine.
 */
import { invalid } from "../../src/errors/catalogue.js";
import type { ModelListing, Pipeline, PipelineContext } from "../../src/pipeline/types.js";
import {
  describeZodError,
  generalQuestions,
  type RequestEnvelope,
  type SystemOneResponse,
} from "../../src/validate/schema.js";

export class FakePipelineForHttpErrorPaths implements Pipeline {
  /** What `ready()` answers. */
  isReady = true;
  /** When set, `run` throws this instead of answering. */
  failWith: Error | null = null;
  /** Every call to `run`, for assertions on the context the HTTP layer passes. */
  readonly calls: { envelope: RequestEnvelope; ctx: PipelineContext }[] = [];

  async run(envelope: RequestEnvelope, ctx: PipelineContext): Promise<SystemOneResponse> {
    this.calls.push({ envelope, ctx });
    if (this.failWith) throw this.failWith;
    const questions = generalQuestions().safeParse(envelope.questions);
    if (!questions.success) throw invalid(describeZodError(questions.error));
    return { model: envelope.model, answers: {}, usage: { input_tokens: 0, output_tokens: 0 } };
  }

  listModels(): ModelListing[] {
    return [
      { id: "judge-latest", family: "general", alias_of: "judge-v4-max", deprecated: false, build: null, ready: this.isReady },
      { id: "judge-v4-max", family: "general", alias_of: null, deprecated: false, build: null, ready: this.isReady },
    ];
  }

  ready(): boolean {
    return this.isReady;
  }

  async close(): Promise<void> {}
}

