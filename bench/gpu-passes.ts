/**
 * The passes the device check replays (bench/gpu-check.mjs): the packed tensors the engine hands a
 * worker for three requests, recorded from the real pipeline on this machine's CPU (the 0.5B build's
 * tokenizer and prompt, prefix cache on, as a server runs them), written to bench/gpu-check-passes.json.
 * A GPU machine lent for a few minutes has neither the weights nor the TypeScript build; with these it
 * times the engine's own passes (random weights: speed, not answers). A pass that continues a cached
 * prefix records how many tokens it continues (`pastTokens`): the replay feeds that many zero keys.
 *
 *   primary   the latency matrix's primary cell: a 512-token state, 1 choice question of 4 options
 *   wide      a 512-token state, 64 choice questions of 8 options each
 *   small     a 64-token state, 1 choice question of 2 options (the concurrency bench's small request,
 *             sent 8 at once: a GPU lane runs them one after another)
 *   many      a 512-token state, 1 choice question of 255 options (the spec's most), keyed `o1` … `o255`
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { loadConfig, ROOT } from "../src/config/index.js";
import type { PackedTensors } from "../src/inference/pack.js";
import type { KvTask } from "../src/inference/protocol.js";
import { EnginePipeline } from "../src/pipeline/index.js";
import { Timings } from "../src/pipeline/timings.js";
import type { Question } from "../src/validate/schema.js";
import { choiceQuestions, stateOf } from "./common.js";

export const GPU_PASSES_FILE = path.join(ROOT, "bench", "gpu-check-passes.json");

const CELLS = {
  primary: { state: 512, questions: 1, options: 4 },
  wide: { state: 512, questions: 64, options: 8 },
  small: { state: 64, questions: 1, options: 2 },
  many: { state: 512, questions: 1, options: 255 },
};

/** One choice question of `n` options: choiceQuestions' letter keys run out at 26. */
function manyOptions(n: number): Record<string, Question> {
  const [q] = Object.values(choiceQuestions(1, 2));
  const criteria = Object.fromEntries(Array.from({ length: n }, (_, i) => [`o${i + 1}`, `the figure in row ${i + 1} of the report`]));
  return { q0: { ...q!, criteria } as Question };
}

type Json = Record<string, number | number[]>;

function plain(p: PackedTensors, kv: KvTask | undefined): Json {
  const ints = (a: BigInt64Array) => Array.from(a, Number);
  return {
    inputIds: ints(p.inputIds),
    positionIds: ints(p.positionIds),
    subtreeEnd: ints(p.subtreeEnd),
    gatherIdx: ints(p.gatherIdx),
    targetIds: ints(p.targetIds),
    rows: p.rows,
    width: p.width,
    branchSlots: ints(p.branchSlots),
    slotOf: ints(p.slotOf),
    branches: p.branches,
    branchWidth: p.branchWidth,
    pastTokens: kv?.past?.tokens ?? 0,
    keep: kv?.keep ?? 0,
  };
}

export async function gpuPasses(buildDir: string): Promise<void> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-gpu-passes-"));
  const config = path.join(dir, "models.json");
  const name = "judge";
  fs.writeFileSync(config, JSON.stringify({ default: name, builds: { b: { dir: path.resolve(buildDir) } }, models: { [name]: { family: "general", build: "b" } } }));
  const engine = await EnginePipeline.create(loadConfig({ ...process.env, LOG_LEVEL: "silent", ASSAY_MODELS_CONFIG: config, ASSAY_REQUEST_TIMEOUT_MS: "600000", ASSAY_REQUEST_TIMEOUT_MAX_MS: "600000" }));
  const passes: Record<string, Json[]> = {};
  let recording: Json[] | null = null;
  const infer = engine.pool.infer.bind(engine.pool);
  engine.pool.infer = (model, p, signal, kv) => {
    recording?.push(plain(p, kv));
    return infer(model, p, signal, kv);
  };
  try {
    const lb = engine.build(name);
    for (const [cell, c] of Object.entries(CELLS)) {
      recording = passes[cell] = [];
      await engine.run({ model: name, state: stateOf(lb, c.state), questions: c.options > 26 ? manyOptions(c.options) : choiceQuestions(c.questions, c.options) }, { requestId: cell, orgId: cell, timings: new Timings() });
    }
    const out = { cells: CELLS, build: lb.build.manifest.name, passes };
    fs.writeFileSync(GPU_PASSES_FILE, `${JSON.stringify(out)}\n`);
    for (const [cell, ps] of Object.entries(passes)) {
      console.log(`${cell}: ${ps.length} passes, ${ps.map((p) => `${(p.inputIds as number[]).length}${p.pastTokens ? `+${String(p.pastTokens)} past` : ""}`).join(", ")} tokens`);
    }
    console.log(`wrote ${path.relative(ROOT, GPU_PASSES_FILE)}`);
  } finally {
    await engine.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
