/**
 * The real engine for tests: the default exported model (built by
 * scripts/bootstrap.mjs, which `npm test` runs first) behind the same
 * EnginePipeline the HTTP route uses. Never a stub.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { loadConfig, ROOT } from "../../src/config/index.js";
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

/**
 * A models config for testing the large build's on-demand lifecycle: the
 * shipped models.json with the large build `scheduled` and the general names
 * on the small build (a deployment that keeps only the families' large
 * names on a schedule). The shipped config keeps the large build loaded,
 * since `judge-latest` reads with it.
 */
export function scheduledLargeConfig(small = "qwen2.5-coder-0.5b", large = "qwen2.5-coder-1.5b", opts: { generalOnLarge?: string } = {}): string {
  const file = JSON.parse(fs.readFileSync(path.join(ROOT, "models", "models.json"), "utf8")) as {
    builds: Record<string, { availability?: string }>;
    models: Record<string, { family?: string; build?: string }>;
  };
  file.builds[large]!.availability = "scheduled";
  for (const m of Object.values(file.models)) if (m.family === "general" && m.build === large) m.build = small;
  // A general name left on the scheduled build: how a deployment that loads its large judge on demand looks.
  if (opts.generalOnLarge) file.models[opts.generalOnLarge] = { family: "general", build: large };
  const out = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "assay-models-")), "models.json");
  fs.writeFileSync(out, JSON.stringify(file, null, 2));
  return out;
}
