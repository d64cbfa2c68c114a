/**
 * `npm run bench -- long-state`: a long state read in chunks apart from its
 * questions (ASSAY_STATE_CHUNK_TOKENS) against the same engine reading it in
 * one pass with them (the setting at 0), in the same run, rounds alternating.
 * Each request is one new state (so neither side hits a cache) with one
 * 4-option question, read at the engine layer; its label log-probabilities
 * from both sides are compared.
 */
import os from "node:os";
import { Engine, passLimit, PrefixCache } from "../src/engine/index.js";
import { loadConfig } from "../src/config/index.js";
import { prepare, readBranches } from "../src/families/general.js";
import { EnginePipeline } from "../src/pipeline/index.js";
import { choiceQuestions, fmtMs, machineNote, median, ratio, stateOf, write } from "./common.js";

export interface LongStateOptions {
  model: string;
  stateTokens: number[];
  rounds: number;
  chunk: number;
}

export async function longStateScenario(o: LongStateOptions, command: string): Promise<void> {
  const log = (s: string) => console.error(s);
  const machine = machineNote();
  const config = loadConfig({ ...process.env, LOG_LEVEL: "silent" });
  const pipeline = await EnginePipeline.create(config);
  const lb = pipeline.build(o.model);
  const limit = passLimit(lb, config.maxPackedTokens);
  // No prefix cache on either side: every round reads its state from scratch, as a first request does.
  const onePass = new Engine(pipeline.pool, new PrefixCache(0, "organization"), true, { stateChunk: 0 });
  const chunked = new Engine(pipeline.pool, new PrefixCache(0, "organization"), true, { stateChunk: o.chunk });
  const rows: { state_tokens: number; one_pass_ms: number; chunked_ms: number; one_over_chunked: number | null; max_abs_dlp: number }[] = [];
  try {
    for (const tokens of o.stateTokens) {
      const a: number[] = [];
      const b: number[] = [];
      let maxDlp = 0;
      for (let r = 0; r < o.rounds; r++) {
        const prepared = prepare(lb, `Round ${r}. ${stateOf(lb, tokens - 6)}`, choiceQuestions(1, 4));
        // Alternate which side goes first: a machine that slows over the run weighs on both.
        const sides: [number[], Engine][] = r % 2 === 0 ? [[a, onePass], [b, chunked]] : [[b, chunked], [a, onePass]];
        const lps = new Map<Engine, number[][]>();
        for (const [times, engine] of sides) {
          const t = performance.now();
          lps.set(engine, await readBranches(engine, lb, prepared, limit, {}));
          times.push(performance.now() - t);
        }
        lps.get(onePass)!.forEach((row, i) => row.forEach((x, j) => (maxDlp = Math.max(maxDlp, Math.abs(x - lps.get(chunked)![i]![j]!)))));
        log(`  ${prepared.prefix.length} state tokens, round ${r}: one pass ${fmtMs(a.at(-1))} ms, chunked ${fmtMs(b.at(-1))} ms`);
      }
      rows.push({ state_tokens: tokens, one_pass_ms: Math.round(median(a)), chunked_ms: Math.round(median(b)), one_over_chunked: ratio(median(a), median(b)), max_abs_dlp: maxDlp });
    }
  } finally {
    await pipeline.close();
  }
  const md = [
    `## long-state (${new Date().toISOString()})`,
    "",
    `\`${command}\`; model ${o.model} → build ${lb.build.manifest.build_hash}; pass limit ${limit}; chunk ${o.chunk}; ${machine.cpu}; load ${machine.loadStart} at the start, ${os.loadavg()[0]!.toFixed(2)} at the end`,
    "",
    `| state tokens | one pass with the question, ms (baseline) | in chunks of ${o.chunk}, then the question, ms | one pass / chunked | max abs Δ log-prob |`,
    "|---:|---:|---:|---:|---:|",
    ...rows.map((r) => `| ${r.state_tokens.toLocaleString("en-US")} | ${fmtMs(r.one_pass_ms)} | ${fmtMs(r.chunked_ms)} | ${r.one_over_chunked} | ${r.max_abs_dlp.toExponential(1)} |`),
    "",
  ].join("\n");
  write("long-state", { machine, model: o.model, build: lb.build.manifest.build_hash, options: o, rows }, md);
}
