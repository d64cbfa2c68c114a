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
import { AssayError, invalid } from "../../src/errors/catalogue.js";
import type { ModelListing, Pipeline, PipelineContext } from "../../src/pipeline/types.js";
import {
  zodIssues,
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
    if (!questions.success) throw new AssayError("INVALID_REQUEST", zodIssues(questions.error, ["questions"]));
    return { model: envelope.model, answers: {}, usage: { input_tokens: 0, output_tokens: 0 } };
  }

  listModels(): ModelListing[] {
    return [
      { id: "judge-latest", family: "general", alias_of: "judge-v4-max", deprecated: false, build: null, calibrated: null, ready: this.isReady },
      { id: "judge-v4-max", family: "general", alias_of: null, deprecated: false, build: null, calibrated: null, ready: this.isReady },
    ];
  }

  ready(): boolean {
    return this.isReady;
  }

  async close(): Promise<void> {}
}


/**
 * FakeTokenCountPipelineForBilling exists ONLY for the HTTP billing paths
 * (holds, 402, 429, settle, no charge on errors), where the model is
 * irrelevant. It stands in for the real pipeline's token count: like the
 * real pipeline it calls `ctx.admit(inputTokens)` once "tokenizing" is done
 * and before any "model work", then reports the same count as
 * `usage.input_tokens`. The count is `inputTokensFor(envelope)` — a fixed
 * number by default. It computes no answers (`answers` is empty).
 *
 * Test controls: `pause()` keeps admitted requests in flight until the
 * returned function is called (a request whose caller hangs up meanwhile
 * ends with 504 TIMEOUT, as the real worker pool does);
 * `failAfterAdmitWith` throws after the hold.
 */
export class FakeTokenCountPipelineForBilling extends FakePipelineForHttpErrorPaths {
  /** The token count this fake reports (through `admit` and in usage). */
  inputTokensFor: (envelope: RequestEnvelope) => number = () => 1000;
  /** When set, `run` throws this after `admit` succeeded (the hold is in place). */
  failAfterAdmitWith: Error | ((envelope: RequestEnvelope) => Error | null) | null = null;
  /** Requests that got past `admit` and are now in the "model". */
  inModel = 0;
  private gate: Promise<void> | null = null;
  private waiters: { n: number; resolve: () => void }[] = [];

  /** Hold every admitted request in flight until the returned function is called. */
  pause(): () => void {
    let open!: () => void;
    this.gate = new Promise<void>((r) => (open = r));
    return () => {
      this.gate = null;
      open();
    };
  }

  /** Resolves once `n` requests are in the "model" at the same time. */
  untilInModel(n: number): Promise<void> {
    if (this.inModel >= n) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push({ n, resolve }));
  }

  override async run(envelope: RequestEnvelope, ctx: PipelineContext): Promise<SystemOneResponse> {
    this.calls.push({ envelope, ctx });
    if (this.failWith) throw this.failWith;
    const questions = generalQuestions().safeParse(envelope.questions);
    if (!questions.success) throw new AssayError("INVALID_REQUEST", zodIssues(questions.error, ["questions"]));
    const tokens = this.inputTokensFor(envelope);
    await ctx.admit?.(tokens);
    this.inModel++;
    try {
      for (const w of this.waiters.filter((w) => this.inModel >= w.n)) w.resolve();
      this.waiters = this.waiters.filter((w) => this.inModel < w.n);
      if (this.gate) await untilOpenOrAborted(this.gate, ctx.signal);
      const f = typeof this.failAfterAdmitWith === "function" ? this.failAfterAdmitWith(envelope) : this.failAfterAdmitWith;
      if (f) throw f;
      return { model: envelope.model, answers: {}, usage: { input_tokens: tokens, output_tokens: 0 } };
    } finally {
      this.inModel--;
    }
  }
}

function untilOpenOrAborted(gate: Promise<void>, signal: AbortSignal | undefined): Promise<void> {
  if (!signal) return gate;
  return new Promise<void>((resolve, reject) => {
    const onAbort = () => reject(new AssayError("TIMEOUT", "the request was cancelled before inference finished"));
    if (signal.aborted) return onAbort();
    signal.addEventListener("abort", onAbort, { once: true });
    void gate.then(() => {
      signal.removeEventListener("abort", onAbort);
      resolve();
    });
  });
}
