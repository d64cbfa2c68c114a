/**
 * Benchmarks. `npm run bench -- <scenario>`; each scenario measures assay and
 * its named baseline in the same run and reports ratios (machines are noisy;
 * absolute times are for orientation only). Results: bench/out/<scenario>-<time>.{json,md}
 * (and .svg for latency and batch). Scenarios: state-sharing, latency (the krite-bench matrix in
 * layers, with the naive and llama.cpp baselines), batch (assay batch grouped vs ungrouped),
 * families (code search and fact check names vs one request per item), codesearch (what each code
 * search name keeps at noul > 0.5 on the dev rows), half-precision (each build's model.gpu16.onnx against
 * its model.gpu.onnx, answers compared).
 */
import { Command } from "commander";
import { loadConfig } from "../src/config/index.js";
import { prepare } from "../src/families/general.js";
import { EnginePipeline } from "../src/pipeline/index.js";
import type { PackedRequest } from "../src/inference/pack.js";
import { pack } from "../src/inference/pack.js";
import { InvalidArgumentError } from "commander";
import { batchScenario } from "./batch.js";
import { longStateScenario } from "./long-state.js";
import { PASS_MEMORY_CASES, passMemoryScenario, passMemorySide } from "./pass-memory.js";
import { prefixScenario, type PrefixOptions } from "./prefix.js";
import { costScenario } from "./cost.js";
import { familiesScenario } from "./families.js";
import { gpuPasses } from "./gpu-passes.js";
import { halfPrecisionScenario } from "./half-precision.js";
import { codesearchScenario } from "./codesearch.js";
import { concurrencyScenario } from "./concurrency.js";
import { questionsOf, stateOf, timeIt, write } from "./common.js";
import { latencyScenario, parseCells, PRIMARY, type Baseline, type Layer } from "./latency.js";

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

// The scenarios but `prefix` repeat requests on one state, which the prefix
// cache would answer from the second time on: off unless the environment says.
process.env.ASSAY_PREFIX_CACHE_MB ??= "0";

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

const int = (name: string, min = 1) => (v: string) => {
  const n = Number(v);
  if (!Number.isInteger(n) || n < min) throw new InvalidArgumentError(`${name} must be an integer ≥ ${min}`);
  return n;
};
const list = <T extends string>(name: string, allowed: readonly T[]) => (v: string) => {
  const xs = v.split(",").map((s) => s.trim()).filter(Boolean);
  for (const x of xs) if (!allowed.includes(x as T)) throw new InvalidArgumentError(`${name}: "${x}" is not one of ${allowed.join(", ")}`);
  return xs as T[];
};
const command = () => `npm run bench -- ${process.argv.slice(2).join(" ")}`;

program
  .command("latency")
  .description("krite-bench matrix: burst and sustained latency in layers (engine, pipeline, HTTP) against the naive and llama.cpp baselines")
  .option("--cells <spec>", "primary | all | STATExQUESTIONSxOPTIONS patterns with * and a|b, comma-separated (e.g. 512x*x4,2048x1x*)", "primary")
  .option("--mode <mode>", "burst | sustained | both", "burst")
  .option("--layers <list>", "engine,pipeline,http", list("--layers", ["engine", "pipeline", "http"] as const), ["engine", "pipeline", "http"])
  .option("--warmup <n>", "burst: warm-up requests per layer (not measured)", int("--warmup", 0), 2)
  .option("--requests <n>", "burst: measured requests per layer", int("--requests"), 10)
  .option("--concurrency <list>", "sustained: concurrency levels", "1,8")
  .option("--duration <s>", "sustained: seconds per layer and concurrency (the window counted)", int("--duration"), 30)
  .option("--sustained-cell <cell>", "sustained: the cell", "512x1x4")
  .option("--baselines <list>", "naive,llama (or none)", "naive,llama")
  .option("--naive-sample <n>", "passes actually run per cell for the per-question baselines (the rest extrapolated)", int("--naive-sample"), 4)
  .option("--model <name>", "the model name to measure (its build is what assay runs)", "judge-latest")
  .option("--gguf <file>", "GGUF for llama.cpp (default: the one the model's build was exported from, .cache/weights/<build>.gguf)")
  .option("--llama-threads <n>", "llama.cpp threads", int("--llama-threads"), 2)
  .option("--workers <n>", "assay inference lanes (ASSAY_WORKERS)", int("--workers"))
  .option("--threads <n>", "onnxruntime threads per lane (ASSAY_INTRA_OP_THREADS)", int("--threads"))
  .option("--prefix-cache-mb <n>", "ASSAY_PREFIX_CACHE_MB for the run: 0 (the default) computes every request's state, as a request whose state is new", int("--prefix-cache-mb", 0), 0)
  .action(
    async (o: {
      cells: string;
      mode: string;
      layers: Layer[];
      warmup: number;
      requests: number;
      concurrency: string;
      duration: number;
      sustainedCell: string;
      baselines: string;
      naiveSample: number;
      model: string;
      gguf?: string;
      llamaThreads: number;
      workers?: number;
      threads?: number;
      prefixCacheMb: number;
    }) => {
      if (!["burst", "sustained", "both"].includes(o.mode)) throw new InvalidArgumentError(`--mode must be burst, sustained or both`);
      const baselines = o.baselines === "none" ? [] : list("--baselines", ["naive", "llama"] as const)(o.baselines);
      const concurrency = o.concurrency.split(",").map((s) => int("--concurrency")(s.trim()));
      const sustainedCell = parseCells(o.sustainedCell);
      if (sustainedCell.length !== 1) throw new InvalidArgumentError("--sustained-cell must name one cell");
      await latencyScenario(
        {
          cells: parseCells(o.cells),
          mode: o.mode as "burst" | "sustained" | "both",
          layers: o.layers,
          warmup: o.warmup,
          requests: o.requests,
          concurrency,
          durationS: o.duration,
          sustainedCell: sustainedCell[0] ?? PRIMARY,
          baselines: baselines as Baseline[],
          naiveSample: o.naiveSample,
          model: o.model,
          ...(o.gguf ? { gguf: o.gguf } : {}),
          llamaThreads: o.llamaThreads,
          ...(o.workers ? { workers: o.workers } : {}),
          ...(o.threads ? { threads: o.threads } : {}),
          prefixCacheMb: o.prefixCacheMb,
        },
        command(),
      );
    },
  );

program
  .command("batch")
  .description("assay batch grouped vs ungrouped on a synthetic file, and the engine-only bound")
  .option("--states <n>", "distinct states", int("--states"), 4)
  .option("--per-state <n>", "requests per state", int("--per-state"), 8)
  .option("--state-tokens <n>", "tokens per state", int("--state-tokens"), 256)
  .option("--concurrency <n>", "batch concurrency", int("--concurrency"), 2)
  .action(async (o: { states: number; perState: number; stateTokens: number; concurrency: number }) => {
    await batchScenario(o, command());
  });

program
  .command("concurrency")
  .description("many small requests at once (and a mixed load), batching across requests on and off, beside llama.cpp's server with parallel slots")
  .option("--model <name>", "model name", "judge-latest")
  .option("--requests <n>", "small requests per level", int("--requests"), 24)
  .option("--levels <list>", "concurrency levels", "1,4,8,16")
  .option("--large <n>", "large requests in the mixed load", int("--large"), 2)
  .option("--large-state-tokens <n>", "tokens of a large request's state", int("--large-state-tokens"), 1000)
  .option("--rounds <n>", "rounds, the sides alternating", int("--rounds"), 1)
  .option("--no-llama", "skip the llama.cpp baseline")
  .option("--slots <n>", "llama-server parallel slots", int("--slots"), 8)
  .option("--llama-threads <n>", "llama.cpp threads", int("--llama-threads"), 2)
  .option("--gguf <file>", "GGUF for llama.cpp (default: the build's own, under .cache/weights)")
  .action(async (o: { model: string; requests: number; levels: string; large: number; largeStateTokens: number; rounds: number; llama: boolean; slots: number; llamaThreads: number; gguf?: string }) => {
    const levels = o.levels.split(",").map((x) => int("--levels")(x.trim()));
    await concurrencyScenario({ ...o, levels, ...(o.gguf ? { gguf: o.gguf } : {}) }, command());
  });

program
  .command("families")
  .description("code search and fact check names: latency per request vs one request per item (naive)")
  .option("--code-rows <n>", "code search dev rows (30 items each)", int("--code-rows"), 3)
  .option("--fact-rows <n>", "fact check requests (a document with its claims)", int("--fact-rows"), 4)
  .option("--naive-sample <n>", "items per request timed alone for the naive baseline", int("--naive-sample"), 4)
  .action(async (o: { codeRows: number; factRows: number; naiveSample: number }) => {
    await familiesScenario(o, command());
  });

program
  .command("codesearch")
  .description("code search names on the dev rows: recall and kept share at noul > 0.5, AUROC, kept share for 95% recall, seconds per request")
  .option("--names <list>", "code search names", "judge-codegrep-lite,judge-codegrep,judge-codegrep-max")
  .option("--rows <n>", "dev rows, spread evenly over the file (default: all 57)", int("--rows"))
  .option("--slice <from:to>", "only these of the rows chosen (end excluded)")
  .option("--save-raw", "append raw scores to .cache/codesearch/raw-<name>.jsonl and skip rows already saved", false)
  .option("--stride <n>", "then every n-th row", int("--stride"))
  .option("--preview-chars <n>", "cut file previews to this many characters before sending (a study lever)", int("--preview-chars"))
  .action(async (o: { names: string; rows?: number; slice?: string; stride?: number; saveRaw: boolean; previewChars?: number }) => {
    const names = o.names.split(",").map((x) => x.trim());
    await codesearchScenario(
      { names, saveRaw: o.saveRaw, ...(o.rows ? { rows: o.rows } : {}), ...(o.slice ? { slice: o.slice } : {}), ...(o.stride ? { stride: o.stride } : {}), ...(o.previewChars ? { previewChars: o.previewChars } : {}) },
      command(),
    );
  });

program
  .command("cost")
  .description("admission's cost model: each pass predicted before it is learnt from, with and without the keys a pass continues")
  .option("--models <list>", "general names whose builds run the requests", "vendor/judge-9B,judge-latest")
  .option("--rounds <n>", "times the request set runs", int("--rounds"), 1)
  .option("--min-ms <n>", "shortest pass counted in the errors", int("--min-ms"), 200)
  .option("--cache-mb <n>", "ASSAY_PREFIX_CACHE_MB for the run (the server's default)", int("--cache-mb"), 1024)
  .action(async (o: { models: string; rounds: number; minMs: number; cacheMb: number }) => {
    await costScenario({ models: o.models.split(",").map((x) => x.trim()), rounds: o.rounds, minMs: o.minMs, cacheMb: o.cacheMb }, command());
  });

program
  .command("prefix")
  .description("the prefix cache: a second request on a state read before, what a miss costs, a request over the pass limit")
  .option("--model <name>", "model name", "judge-latest")
  .option("--state-tokens <n>", "state length for the second-request figure", int("--state-tokens"), 2000)
  .option("--rounds <n>", "second-request rounds (each on a new state)", int("--rounds"), 3)
  .option("--cold-requests <n>", "primary-cell rounds, cache missing vs no cache", int("--cold-requests"), 10)
  .option("--big-questions <n>", "questions of the large request", int("--big-questions"), 64)
  .option("--big-options <n>", "options per question of the large request (and of the carry request)", int("--big-options"), 8)
  .option("--carry-questions <n>", "questions of the carry request (on a --state-tokens state)", int("--carry-questions"), 12)
  .option("--cache-mb <n>", "ASSAY_PREFIX_CACHE_MB for the run", int("--cache-mb"), 1024)
  .option("--parts <list>", "second,cold,large,answers (answers: the large request against each question alone); carry (opt-in: a split request with the cache off)", "second,cold,large,answers")
  .action(async (o: Omit<PrefixOptions, "parts"> & { parts: string }) => {
    await prefixScenario({ ...o, parts: o.parts.split(",").map((x) => x.trim()) });
  });

program
  .command("long-state")
  .description("a long state read in chunks apart from its question (ASSAY_STATE_CHUNK_TOKENS) against one pass with it, same run")
  .option("--model <name>", "model name", "judge-latest")
  .option("--state-tokens <list>", "state lengths in tokens (8,000 and up: the one-pass side may need over 20 GB)", "3072,4096,6000")
  .option("--rounds <n>", "rounds per length (each a new state), sides alternating", int("--rounds"), 2)
  .option("--chunk <n>", "the state chunk (ASSAY_STATE_CHUNK_TOKENS) of the chunked side", int("--chunk"), 2048)
  .action(async (o: { model: string; stateTokens: string; rounds: number; chunk: number }) => {
    await longStateScenario({ ...o, stateTokens: o.stateTokens.split(",").map(Number) }, command());
  });

program
  .command("pass-memory")
  .description("the pair bound on a pass's attention (ASSAY_PASS_ATTENTION_MB) against none, each side in its own process: time, peak memory, answers")
  .option("--cases <list>", `cases: ${Object.keys(PASS_MEMORY_CASES).join(",")}`, Object.keys(PASS_MEMORY_CASES).join(","))
  .option("--mb <n>", "ASSAY_PASS_ATTENTION_MB of the bounded side", int("--mb"), 256)
  .action(async (o: { cases: string; mb: number }) => {
    await passMemoryScenario({ cases: o.cases.split(",").map((x) => x.trim()), mb: o.mb }, command());
  });

program
  .command("gpu-passes")
  .description("write bench/gpu-check-passes.json: the packed passes the device check (bench/gpu-check.sh) replays on a GPU")
  .option("--build <dir>", "build folder whose tokenizer packs them", "models/cache/qwen2.5-coder-0.5b-instruct")
  .action(async (o: { build: string }) => {
    await gpuPasses(o.build);
  });

program
  .command("half-precision")
  .description("each build's half-precision GPU graph (model.gpu16.onnx) against its float32 one, answers compared on the CPU provider")
  .option("--builds <list>", "build folders under models/cache", "qwen2.5-coder-0.5b-instruct,qwen2.5-coder-1.5b-instruct")
  .option("--dev <n>", "dev requests besides the README's", int("--dev"), 25)
  .option("--graph <file>", "the half graph's file in each build folder", "model.gpu16.onnx")
  .action(async (o: { builds: string; dev: number; graph: string }) => {
    await halfPrecisionScenario({ builds: o.builds.split(",").map((x) => x.trim()), dev: o.dev, graph: o.graph }, command());
  });

program
  .command("pass-memory-side", { hidden: true })
  .argument("<case>")
  .action(async (name: string) => {
    await passMemorySide(name);
  });

await program.parseAsync(process.argv);
