/**
 * A Pipeline that exists before the model does, so the server can listen at
 * once and answer 503 MODEL_STARTING (with Retry-After) while the default
 * model loads and warms. A request the model would refuse whatever its state
 * (an unknown name, questions or a state its family does not take) gets that
 * 422 now. main.ts attaches the real pipeline when it is ready; from then on
 * every call goes straight through.
 */
import { AssayError } from "../errors/catalogue.js";
import type { ModelListing, Pipeline, PipelineContext } from "../pipeline/types.js";
import { checkFamilyRequest, unknownModel } from "../validate/families.js";
import type { RequestEnvelope, SystemOneResponse } from "../validate/schema.js";

/** Seconds a client is told to wait while the default model loads. */
export const STARTING_RETRY_AFTER_S = 5;

export class StartingPipeline implements Pipeline {
  private inner: Pipeline | null = null;
  private failure: Error | null = null;
  readonly startedAt = performance.now();
  /** Seconds from construction to `attach`, once attached. */
  startupSeconds: number | null = null;

  /** @param listing what `/v1/models` shows before the model is loaded (names, families; ready: false). */
  constructor(private readonly listing: () => ModelListing[] = () => []) {}

  attach(pipeline: Pipeline): void {
    this.inner = pipeline;
    this.startupSeconds = (performance.now() - this.startedAt) / 1000;
  }

  /** Boot failed: requests keep getting 503 until the process exits. */
  fail(err: Error): void {
    this.failure = err;
  }

  get attached(): Pipeline | null {
    return this.inner;
  }

  async run(envelope: RequestEnvelope, ctx: PipelineContext): Promise<SystemOneResponse> {
    if (this.inner) return this.inner.run(envelope, ctx);
    // A request that would be refused once the model is up is refused now: a 503 would have the
    // caller retry it. Without a listing (a registry that did not load) only the engine can tell.
    const names = this.listing();
    if (names.length > 0) {
      const model = names.find((m) => m.id === envelope.model);
      if (!model) throw unknownModel(envelope.model, names.map((m) => m.id));
      checkFamilyRequest(model.family, envelope);
    }
    throw new AssayError(
      "MODEL_STARTING",
      this.failure
        ? "the model could not be started; the service is restarting"
        : "the model is starting: the default model is still loading; retry after the Retry-After seconds",
      STARTING_RETRY_AFTER_S,
    );
  }

  listModels(): ModelListing[] {
    return this.inner ? this.inner.listModels() : this.listing();
  }

  ready(): boolean {
    return this.inner?.ready() ?? false;
  }

  async close(): Promise<void> {
    await this.inner?.close();
  }
}
