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
export function scheduledLargeConfig(small = SMALL_BUILD, large = "qwen2.5-coder-1.5b", opts: { generalOnLarge?: string } = {}): string {
  return shippedConfigWith((file) => {
    file.builds[large]!.availability = "scheduled";
    for (const m of Object.values(file.models)) if (m.family === "general" && m.build === large) m.build = small;
    // A general name left on the scheduled build: how a deployment that loads its large judge on demand looks.
    if (opts.generalOnLarge) file.models[opts.generalOnLarge] = { family: "general", build: large };
  });
}

/**
 * A deployment whose every name reads with the small build (the shipped models/models.json with the large
 * build left out): for the tests of what surrounds the model (test/README.md lists them), where a pass's
 * length only sets how long they take. Each server or engine of such a test loads one build (the shipped
 * config loads both, and the large one twice in a server: main and express worker) and runs its passes
 * about three times faster on 2 cores.
 */
export function smallDeployment(): Record<string, string> {
  return {
    ASSAY_MODELS_CONFIG: shippedConfigWith((file) => {
      file.builds = { [SMALL_BUILD]: file.builds[SMALL_BUILD]! };
      for (const m of Object.values(file.models)) {
        if (m.build) m.build = SMALL_BUILD;
        delete m.escalate_to;
      }
    }),
  };
}

const SMALL_BUILD = "qwen2.5-coder-0.5b";

/** A models config of one build folder alone, as `model` (and the default), written to a temp file: its path. */
export function oneBuildConfig(buildDir: string, model: string): string {
  const out = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "assay-models-")), "models.json");
  fs.writeFileSync(out, JSON.stringify({ default: model, builds: { b: { dir: buildDir } }, models: { [model]: { family: "general", build: "b" } } }));
  return out;
}

interface ModelsFile {
  builds: Record<string, { availability?: string }>;
  models: Record<string, { family?: string; build?: string; escalate_to?: string }>;
}

/** The shipped models/models.json as `edit` leaves it, written to a temp file: its path. */
function shippedConfigWith(edit: (file: ModelsFile) => void): string {
  const file = JSON.parse(fs.readFileSync(path.join(ROOT, "models", "models.json"), "utf8")) as ModelsFile;
  edit(file);
  const out = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "assay-models-")), "models.json");
  fs.writeFileSync(out, JSON.stringify(file, null, 2));
  return out;
}
