/**
 * `npm run bench -- batch`: `assay batch` with and without grouping on the
 * same synthetic file (S states × R requests each, interleaved, 1–2
 * questions per request), and the engine-only time of the same grouped work
 * (one packed pass per state, pool.infer on prepared requests) as the bound
 * grouping can approach.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { loadConfig } from "../src/config/index.js";
import { EngineScorer } from "../src/batch/engine-scorer.js";
import type { OutRecord } from "../src/batch/records.js";
import { runBatch, type BatchResult } from "../src/batch/runner.js";
import { prepare } from "../src/families/general.js";
import { EnginePipeline } from "../src/pipeline/index.js";
import type { Answer, Question, RequestEnvelope } from "../src/validate/schema.js";
import { machineNote, stateOf, write } from "./common.js";
import { barChart } from "./svg.js";

export interface BatchBenchOptions {
  states: number;
  perState: number;
  stateTokens: number;
  concurrency: number;
}

function requestsFor(o: BatchBenchOptions, states: string[]): (RequestEnvelope & { id: string })[] {
  const out: (RequestEnvelope & { id: string })[] = [];
  // Interleaved (s0 r0, s1 r0, …): grouping has to find the requests of a state across the file.
  for (let r = 0; r < o.perState; r++) {
    for (let s = 0; s < o.states; s++) {
      const questions: Record<string, Question> = {
        flag: { type: "noul", instructions: `The text mentions item ${r + 1} of the list.` },
      };
      if (r % 2 === 1) {
        questions.kind = {
          type: "choice",
          instructions: `Which department is item ${r + 1} about?`,
          criteria: { sales: null, support: null, engineering: null, finance: null },
        };
      }
      out.push({ id: `s${s}-r${r}`, model: "judge-latest", state: states[s]!, questions });
    }
  }
  return out;
}

const read = (file: string) =>
  fs
    .readFileSync(file, "utf8")
    .split("\n")
    .filter(Boolean)
    .map((l) => JSON.parse(l) as OutRecord);

function maxDiff(a: Answer, b: Answer): number {
  const nums = (x: Answer): number[] =>
    x.type === "noul" ? [x.noul] : x.type === "choice" ? Object.values(x.probabilities) : [x.score, ...Object.values(x.probabilities)];
  const xa = nums(a);
  const xb = nums(b);
  return Math.max(...xa.map((v, i) => Math.abs(v - (xb[i] ?? NaN))));
}

export async function batchScenario(o: BatchBenchOptions, command: string): Promise<void> {
  const machine = machineNote();
  const config = loadConfig({ ...process.env, LOG_LEVEL: "silent" });
  const engine = await EnginePipeline.create(config);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-bench-batch-"));
  try {
    const lb = engine.build("judge-latest");
    // Distinct states of the same length: the filler shifted by a sentence each.
    const base = stateOf(lb, o.stateTokens * 2);
    const words = base.split(" ");
    const states = Array.from({ length: o.states }, (_, s) => {
      const text = words.slice(s * 7).join(" ");
      return lb.tokenizer.decode(lb.tokenizer.encode(text).slice(0, o.stateTokens));
    });
    const reqs = requestsFor(o, states);
    const inFile = path.join(dir, "requests.jsonl");
    fs.writeFileSync(inFile, reqs.map((r) => JSON.stringify(r)).join("\n") + "\n");
    const scorer = new EngineScorer(engine, config, false);

    const runs: Record<string, BatchResult> = {};
    for (const mode of ["ungrouped", "grouped"] as const) {
      console.error(`batch: ${mode}, ${reqs.length} requests, concurrency ${o.concurrency} ...`);
      runs[mode] = await runBatch(scorer, {
        inFile,
        outFile: path.join(dir, `${mode}.jsonl`),
        defaultModel: "judge-latest",
        concurrency: o.concurrency,
        group: mode === "grouped",
      });
    }
    // Engine only, the grouped work: one packed pass per state with every question of its requests.
    const model = lb.build.onnxPath;
    let engineMs = 0;
    for (let s = 0; s < o.states; s++) {
      const qs: Record<string, Question> = {};
      reqs
        .filter((r) => r.state === states[s])
        .forEach((r, k) => Object.entries(r.questions).forEach(([id, q]) => (qs[`${k}:${id}`] = q as Question)));
      const p = prepare(lb, states[s]!, qs).packed;
      const t = performance.now();
      await engine.pool.infer(model, p);
      engineMs += performance.now() - t;
    }
    const g = new Map(read(path.join(dir, "grouped.jsonl")).map((r) => [String(r.id), r]));
    let diff = 0;
    for (const r of read(path.join(dir, "ungrouped.jsonl"))) {
      const other = g.get(String(r.id));
      if (!("response" in r) || !other || !("response" in other)) throw new Error(`line ${r.id} has no answer in both runs`);
      for (const [qid, a] of Object.entries(r.response.answers)) diff = Math.max(diff, maxDiff(a, other.response.answers[qid]!));
    }
    machine.loadEnd = +os.loadavg()[0]!.toFixed(2);
    const un = runs.ungrouped!;
    const gr = runs.grouped!;
    const rate = (r: BatchResult) => r.run.records / (r.elapsedMs / 1000);
    const rows = [
      { mode: "ungrouped (one pipeline request per line)", passes: un.passes, s: un.elapsedMs / 1000, rate: rate(un), tokens: un.run.inputTokens },
      { mode: "grouped (requests sharing a state merged)", passes: gr.passes, s: gr.elapsedMs / 1000, rate: rate(gr), tokens: gr.run.inputTokens },
      { mode: "engine only, grouped work (pool.infer, sequential)", passes: o.states, s: engineMs / 1000, rate: reqs.length / (engineMs / 1000), tokens: gr.run.inputTokens },
    ];
    const md = [
      `## batch (${machine.startedAt})`,
      "",
      `Command: \`${command}\``,
      "",
      `${reqs.length} requests = ${o.states} states of ${o.stateTokens} tokens × ${o.perState} requests each (1–2 questions), interleaved; ` +
        `concurrency ${o.concurrency}; model ${lb.build.manifest.name} \`${lb.build.manifest.build_hash}\`; ${machine.cores} cores, ` +
        `load ${machine.loadStart} → ${machine.loadEnd}.`,
      "",
      "| mode | pipeline requests | seconds | lines/s | input tokens charged |",
      "|---|---|---|---|---|",
      ...rows.map((r) => `| ${r.mode} | ${r.passes} | ${r.s.toFixed(1)} | ${r.rate.toFixed(2)} | ${r.tokens.toLocaleString("en-US")} |`),
      "",
      `Grouped / ungrouped throughput: **${(rate(gr) / rate(un)).toFixed(2)}×**; grouped batch / engine-only bound: ` +
        `${(rate(gr) / rows[2]!.rate).toFixed(2)}. Largest difference between the grouped and ungrouped answers: ${diff.toExponential(2)} ` +
        `(probabilities; tolerance 0.005).`,
      "",
    ].join("\n");
    const svg = barChart(
      [
        {
          title: "Batch throughput",
          yLabel: "lines/s",
          categories: ["ungrouped", "grouped", "engine only"],
          series: [{ name: "lines/s", values: rows.map((r) => +r.rate.toFixed(3)) }],
        },
      ],
      `assay batch: ${reqs.length} requests over ${o.states} states`,
      `${machine.startedAt}; load ${machine.loadStart} → ${machine.loadEnd}`,
    );
    write("batch", { scenario: "batch", machine, options: o, rows, maxAnswerDiff: diff, runs }, md, svg);
  } finally {
    await engine.close();
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
