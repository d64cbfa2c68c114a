/**
 * `npm run bench -- cost`: how well admission's cost model predicts the
 * passes it admits. A fixed set of requests runs on each general build (and
 * `judge-codegrep-lite`): short and long states, 1 to 64 questions, a state
 * over one pass, a second request on a cached state, a code search dev row.
 * Every pass that teaches the live estimate is recorded (its shape and run
 * time), then replayed in order through two fresh cost models with the
 * build's prior: one sees each pass as it ran, with the keys and values it
 * continues (a cached state, the pinned preamble, a long state's chunks);
 * the baseline sees the same pass without them, as admission did before it
 * counted them. Each model predicts each pass before it learns from it, which
 * is the error admission lives with.
 */
import path from "node:path";
import { ROOT, loadConfig } from "../src/config/index.js";
import { codeSearchRequests, readCodeSearch, spreadRows } from "../src/eval/family-fit.js";
import { CostModel, withPast, type PassShape } from "../src/inference/cost.js";
import { EnginePipeline } from "../src/pipeline/index.js";
import { Timings } from "../src/pipeline/timings.js";
import type { Question, RequestEnvelope } from "../src/validate/schema.js";
import { choiceQuestions, machineNote, median, questionsOf, stateOf, write } from "./common.js";

export interface CostOptions {
  models: string[];
  rounds: number;
  /** Passes shorter than this (ms measured) are left out of the error figures, as the live model leaves them out of its overrun. */
  minMs: number;
  /** ASSAY_PREFIX_CACHE_MB for the run: on, so that hits and passes continuing a cached state are among the passes. */
  cacheMb: number;
}

interface Pass {
  model: string;
  shape: PassShape;
  ms: number;
}

interface Row {
  build: string;
  form: string;
  subset: string;
  passes: number;
  "median |err|": number;
  "rms err": number;
  "worst est/measured": number;
  "p80 measured/est": number;
}

/** Estimated / measured for each pass, each predicted before the model learns from it. */
function replay(prior: CostModel["prior"], passes: readonly Pass[], view: (s: PassShape) => PassShape): number[] {
  const m = new CostModel(prior);
  return passes.map((p) => {
    const s = view(p.shape);
    const r = m.estimate(s) / p.ms;
    m.observe(s, p.ms);
    return r;
  });
}

/** Passes continuing at least this many keys read against a state or a query, not just the pinned preamble. */
const STATE_KEYS = 256;


export async function costScenario(o: CostOptions, command: string): Promise<void> {
  const engine = await EnginePipeline.create(loadConfig({ ...process.env, LOG_LEVEL: "silent", ASSAY_MODEL_SCHEDULE: "always", ASSAY_PREFIX_CACHE_MB: String(o.cacheMb) }));
  const passes: Pass[] = [];
  engine.pool.onPassTimed = (model, shape, ms) => passes.push({ model, shape, ms });
  let org = 0;
  const run = (model: string, state: unknown, questions: Record<string, Question>, orgId = `cost-${org++}`) =>
    engine.run({ model, state, questions } as RequestEnvelope, { requestId: "bench", orgId, timings: new Timings() });
  try {
    const code = codeSearchRequests(spreadRows(readCodeSearch(path.join(ROOT, "..", "shared", "data", "code_search.jsonl")), 1))[0]!;
    const builds = new Map<string, string>();
    for (let round = 0; round < o.rounds; round++) {
      for (const model of o.models) {
        const lb = engine.build(model);
        builds.set(lb.build.onnxPath, lb.build.manifest.build_hash);
        const cells: [number, Record<string, Question>][] = [
          [40, questionsOf(1)],
          [512, choiceQuestions(1, 4)],
          [512, questionsOf(8)],
          [200, questionsOf(16)],
          [512, choiceQuestions(16, 4)],
          [1500, questionsOf(64)],
          [3000, questionsOf(4)],
        ];
        for (const [tokens, questions] of cells) {
          await run(model, `Note ${round}-${org}. ${stateOf(lb, tokens)}`, questions);
          console.error(`${model}: ${tokens}-token state, ${Object.keys(questions).length} questions`);
        }
        // A second request on a cached state: the pass continues 2,000 held tokens.
        const state = `Report ${round}-${org}. ${stateOf(lb, 2000)}`;
        const orgId = `cost-${org++}`;
        await run(model, state, choiceQuestions(1, 4), orgId);
        await run(model, state, { again: questionsOf(1).q0! }, orgId);
        console.error(`${model}: 2,000-token state, then a second request on it`);
      }
      const lite = await run("judge-codegrep-lite", code.state, code.questions as Record<string, Question>);
      console.error(`judge-codegrep-lite: a dev row, ${lite.usage.input_tokens} input tokens`);
    }
    const rows: Row[] = [];
    for (const [file, build] of builds) {
      const mine = passes.filter((p) => p.model === file);
      const prior = engine.pool.costModel(file).prior;
      for (const [form, view] of [
        ["keys continued counted (shipped)", (s: PassShape) => s],
        ["keys continued not counted (before)", (s: PassShape) => withPast(s, 0)],
      ] as const) {
        const all = replay(prior, mine, view);
        for (const [subset, keep] of [
          ["every pass", (p: Pass) => p.ms >= o.minMs],
          [`continuing a state (≥ ${STATE_KEYS} keys)`, (p: Pass) => p.ms >= o.minMs && (p.shape.past ?? 0) >= STATE_KEYS],
        ] as const) {
          const ratios = all.filter((_, i) => keep(mine[i]!));
          if (ratios.length === 0) continue;
          const err = ratios.map((r) => Math.abs(r - 1));
          const over = ratios.map((r) => 1 / r).sort((a, b) => a - b);
          rows.push({
            build,
            form,
            subset,
            passes: ratios.length,
            "median |err|": median(err),
            "rms err": Math.sqrt(err.reduce((s, e) => s + e * e, 0) / err.length),
            "worst est/measured": Math.min(...ratios),
            "p80 measured/est": over[Math.min(over.length - 1, Math.floor(0.8 * over.length))]!,
          });
        }
      }
    }
    const f = (x: number) => x.toFixed(2);
    const md =
      `# cost (${new Date().toISOString()})\n\n\`${command}\`\n\n${JSON.stringify(machineNote())}\n\n` +
      `Passes of at least ${o.minMs} ms, each predicted before the model learned from it (errors relative to the measured time).\n\n` +
      "| build | shape | passes | n | median abs. error | RMS error | worst est./measured | p80 measured/est. |\n|---|---|---|---:|---:|---:|---:|---:|\n" +
      rows.map((r) => `| ${r.build} | ${r.form} | ${r.subset} | ${r.passes} | ${f(r["median |err|"])} | ${f(r["rms err"])} | ${f(r["worst est/measured"])} | ${f(r["p80 measured/est"])} |`).join("\n") +
      "\n";
    write("cost", { command, rows, passes }, md);
  } finally {
    await engine.close();
  }
}
