/**
 * Benchmarks. `npm run bench -- <scenario>`; each scenario measures assay and
 * its named baseline in the same run and reports ratios (machines are noisy;
 * absolute times are for orientation only). Results: bench/out/<scenario>-<time>.{json,md}.
 */
import fs from "node:fs";
import path from "node:path";
import { Command } from "commander";
import { ROOT, loadConfig } from "../src/config/index.js";
import { EnginePipeline, prepare, type LoadedBuild } from "../src/pipeline/index.js";
import type { PackedRequest } from "../src/inference/pack.js";
import { pack } from "../src/inference/pack.js";
import type { Question } from "../src/validate/schema.js";

const OUT = path.join(ROOT, "bench", "out");

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

async function timeIt(fn: () => Promise<unknown>, reps: number): Promise<number> {
  const xs: number[] = [];
  for (let i = 0; i < reps; i++) {
    const t = performance.now();
    await fn();
    xs.push(performance.now() - t);
  }
  return median(xs);
}

/** Deterministic English-like filler of about `tokens` tokens for this tokenizer. */
function stateOf(lb: LoadedBuild, tokens: number): string {
  const sentences = [
    "The quarterly report shows revenue grew in every region except the north, where a supplier dispute delayed shipments.",
    "Customer support resolved most tickets within a day, although billing questions took longer than planned.",
    "The engineering team replaced the legacy queue with a managed service and cut incident counts by half.",
    "Marketing spent less than budgeted because two trade shows were cancelled and moved online.",
    "A new office opened in Lisbon with forty staff, mostly in sales and customer success.",
    "Auditors found no material weaknesses, but asked for clearer approval records on vendor payments.",
  ];
  let text = "";
  let i = 0;
  while (lb.tokenizer.encode(text).length < tokens) text += (text ? " " : "") + sentences[i++ % sentences.length];
  const ids = lb.tokenizer.encode(text).slice(0, tokens);
  return lb.tokenizer.decode(ids);
}

function questionsOf(n: number): Record<string, Question> {
  const subjects = ["revenue", "support", "engineering", "marketing", "the Lisbon office", "the audit", "shipments", "billing"];
  const qs: Record<string, Question> = {};
  for (let i = 0; i < n; i++) {
    const s = subjects[i % subjects.length]!;
    qs[`q${i}`] =
      i % 2 === 0
        ? { type: "noul", instructions: `The report says ${s} improved during quarter ${1 + (i % 4)}.` }
        : { type: "choice", instructions: `How does the report describe ${s}?`, criteria: { good: null, mixed: null, bad: null } };
  }
  return qs;
}

function write(name: string, result: unknown, md: string): void {
  fs.mkdirSync(OUT, { recursive: true });
  const stamp = new Date().toISOString().replace(/[:.]/g, "-");
  fs.writeFileSync(path.join(OUT, `${name}-${stamp}.json`), JSON.stringify(result, null, 2));
  fs.writeFileSync(path.join(OUT, `${name}-${stamp}.md`), md);
  console.log(md);
  console.log(`\nwritten to ${path.join(OUT, `${name}-${stamp}.{json,md}`)}`);
}

async function stateSharing(opts: { stateTokens: number; questions: number[]; reps: number; naiveSample: number }) {
  const engine = await EnginePipeline.create(loadConfig({ ...process.env, LOG_LEVEL: "silent" }));
  try {
    const lb = engine.build("judge-latest");
    const model = lb.build.onnxPath;
    const infer = (p: PackedRequest) => engine.pool.infer(model, p);
    const state = stateOf(lb, opts.stateTokens);

    // Plain prefill: the whole prompt as one causal chain, one read-out.
    const plain = (tokens: number[]) =>
      pack(tokens.slice(0, -1), [{ suffix: tokens.slice(-1), labels: [[16]], terminator: lb.terminator }]);
    const basePrefix = prepare(lb, state, questionsOf(1)).packed;
    const prefillTokens = Array.from(basePrefix.inputIds.slice(0, basePrefix.prefixLength), Number);
    await infer(plain(prefillTokens));
    const prefillMs = await timeIt(() => infer(plain(prefillTokens)), opts.reps);
    const prefillTps = (prefillTokens.length / prefillMs) * 1000;

    const rows: Record<string, number | string>[] = [];
    for (const n of opts.questions) {
      const qs = questionsOf(n);
      const prepared = prepare(lb, state, qs).packed;
      const T = prepared.inputIds.length;
      await infer(prepared);
      const packedMs = await timeIt(() => infer(prepared), opts.reps);
      // The same T tokens pushed through once, at the plain prefill rate.
      const onceMs = (T / prefillTps) * 1000;
      // And measured: the packed sequence's tokens as one plain causal chain.
      const chain = plain(Array.from(prepared.inputIds, Number));
      const chainMs = await timeIt(() => infer(chain), opts.reps);

      // Naive baseline: one full forward pass (state + question) per question.
      const ids = Object.keys(qs);
      const sample = ids.slice(0, Math.min(n, opts.naiveSample));
      let naiveSampleMs = 0;
      for (const id of sample) {
        const single = prepare(lb, state, { [id]: qs[id]! }).packed;
        const t = performance.now();
        await infer(single);
        naiveSampleMs += performance.now() - t;
      }
      const naiveMs = (naiveSampleMs / sample.length) * n;
      rows.push({
        questions: n,
        tokens: T,
        packed_ms: Math.round(packedMs),
        packed_tok_s: Math.round((T / packedMs) * 1000),
        once_at_prefill_rate_ms: Math.round(onceMs),
        packed_over_once: +(packedMs / onceMs).toFixed(3),
        plain_chain_ms: Math.round(chainMs),
        packed_over_chain: +(packedMs / chainMs).toFixed(3),
        naive_ms: Math.round(naiveMs),
        naive_measured: `${sample.length}/${n}`,
        naive_over_packed: +(naiveMs / packedMs).toFixed(2),
      });
    }
    const md = [
      `## state-sharing (${new Date().toISOString()})`,
      "",
      `model ${lb.build.manifest.name} build ${lb.build.manifest.build_hash}; state ${prefillTokens.length} prompt tokens; ` +
        `plain prefill ${Math.round(prefillMs)} ms = ${Math.round(prefillTps)} tok/s; median of ${opts.reps}`,
      "",
      "| questions | tokens | packed ms | packed tok/s | same tokens at the state's prefill rate, ms | packed / that | same tokens as one plain causal pass, ms | packed / that | naive ms | naive measured | naive / packed |",
      "|---|---|---|---|---|---|---|---|---|---|---|",
      ...rows.map(
        (r) =>
          `| ${r.questions} | ${r.tokens} | ${r.packed_ms} | ${r.packed_tok_s} | ${r.once_at_prefill_rate_ms} | ${r.packed_over_once} | ${r.plain_chain_ms} | ${r.packed_over_chain} | ${r.naive_ms} | ${r.naive_measured} | ${r.naive_over_packed} |`,
      ),
    ].join("\n");
    write("state-sharing", { prefillTokens: prefillTokens.length, prefillMs, prefillTps, rows }, md);
  } finally {
    await engine.close();
  }
}

const program = new Command("bench").description("assay benchmarks (ratios against a baseline in the same run)");
program
  .command("state-sharing")
  .description("one request with a long state and 1/8/64 questions vs plain prefill and the naive per-question baseline")
  .option("--state-tokens <n>", "state length in tokens", "1000")
  .option("--questions <list>", "question counts", "1,8,64")
  .option("--reps <n>", "measured repetitions (median)", "3")
  .option("--naive-sample <n>", "naive passes actually run per cell (the rest extrapolated from their mean)", "64")
  .action(async (o: { stateTokens: string; questions: string; reps: string; naiveSample: string }) => {
    await stateSharing({
      stateTokens: Number(o.stateTokens),
      questions: o.questions.split(",").map(Number),
      reps: Number(o.reps),
      naiveSample: Number(o.naiveSample),
    });
  });

await program.parseAsync(process.argv);
