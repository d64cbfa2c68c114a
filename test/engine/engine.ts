/**
 * The real engine for tests: the default exported model (built by
 * scripts/bootstrap.mjs, which `npm test` runs first) behind the same
 * EnginePipeline the HTTP route uses. Never a stub.
 */
import { loadConfig } from "../../src/config/index.js";
import { EnginePipeline } from "../../src/pipeline/index.js";
import { Timings } from "../../src/pipeline/timings.js";
import type { Question, RequestEnvelope, SystemOneResponse, State } from "../../src/validate/schema.js";

/**
 * The large build (code search / fact check escalation) stays unloaded unless
 * a test asks for it: the default schedule would load it on weekday
 * afternoons only, and a test must not depend on the time of day.
 */
export async function startEngine(env: Record<string, string> = {}): Promise<EnginePipeline> {
  return EnginePipeline.create(loadConfig({ ...process.env, LOG_LEVEL: "silent", ASSAY_MODEL_SCHEDULE: "never", ...env }));
}

export async function ask(
  engine: EnginePipeline,
  state: State,
  questions: Record<string, Question>,
  model = "judge-latest",
): Promise<SystemOneResponse> {
  const env: RequestEnvelope = { model, state, questions };
  return engine.run(env, { requestId: "test", orgId: "test", timings: new Timings() });
}
