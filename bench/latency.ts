/**
 * `npm run bench -- latency`: the krite-bench matrix.
 *
 *   cells     state 64 / 512 / 2,048 tokens × questions 1 / 4 / 16 / 64 × options 2 / 4 / 8
 *             (primary cell 512×1×4; `--cells` picks, default the primary cell only)
 *   burst     warm-up W, then N requests one after another (the layers taking turns): p50 / p95 / p99
 *   sustained C requests kept in flight for D seconds: throughput (completions within the
 *             window / D), latency of those, p50 per minute
 *   layers    engine  = pool.infer on an already prepared (tokenized, packed) request
 *             pipeline = EnginePipeline.run (prompt, tokenize, pack, infer, probabilities)
 *             http    = buildApp + listen on 127.0.0.1:0 + fetch, with a key from a temporary SQLite store
 *   baselines naive      = one full forward pass (state + question) per question, no shared state
 *             llama.cpp  = llama-server built from source with native CPU flags (scripts/build-llama.mjs)
 *                          on the GGUF the default model was exported from, on
 *                          exactly the same token ids: one pass per question, and the state
 *                          evaluated once with each question after it (KV prefix reuse)
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import type { AddressInfo } from "node:net";
import type { FastifyInstance } from "fastify";
import { openAccounts } from "../src/accounts/index.js";
import { buildApp } from "../src/app.js";
import { ROOT, loadConfig, type Config } from "../src/config/index.js";
import { branchCost, passLimit, type LoadedBuild } from "../src/engine/index.js";
import { prepare, readBranches, type PreparedRequest } from "../src/families/general.js";
import { EnginePipeline } from "../src/pipeline/index.js";
import { Timings } from "../src/pipeline/timings.js";
import type { RequestEnvelope } from "../src/validate/schema.js";
import { choiceQuestions, fmtMs, machineNote, median, percentile, ratio, stateOf, write, type MachineNote } from "./common.js";
import { openLlama, type LlamaBaseline } from "./llama.js";
import { barChart, type BarPanel } from "./svg.js";

export const STATES = [64, 512, 2048];
export const QUESTIONS = [1, 4, 16, 64];
export const OPTIONS = [2, 4, 8];

export interface Cell {
  state: number;
  questions: number;
  options: number;
}
export const PRIMARY: Cell = { state: 512, questions: 1, options: 4 };
export const cellName = (c: Cell) => `${c.state}x${c.questions}x${c.options}`;

/**
 * `primary`, `all`, or comma-separated `STATExQUESTIONSxOPTIONS` patterns
 * where each part is a number, `*`, or `a|b` (e.g. `512x*x4,2048x1x*`).
 * Patterns of numbers only may name cells outside the matrix.
 */
export function parseCells(spec: string): Cell[] {
  const matrix: Cell[] = [];
  for (const state of STATES) for (const questions of QUESTIONS) for (const options of OPTIONS) matrix.push({ state, questions, options });
  if (spec === "all") return matrix;
  if (spec === "primary") return [PRIMARY];
  const out: Cell[] = [];
  const has = (c: Cell) => out.some((o) => cellName(o) === cellName(c));
  for (const pat of spec.split(",").map((s) => s.trim()).filter(Boolean)) {
    const parts = pat.split("x");
    if (parts.length !== 3) throw new Error(`--cells: "${pat}" is not STATExQUESTIONSxOPTIONS`);
    const sets = parts.map((p) => (p === "*" ? null : p.split("|").map(Number)));
    for (const s of sets) if (s?.some((n) => !Number.isInteger(n) || n < 1)) throw new Error(`--cells: bad number in "${pat}"`);
    const match = (c: Cell) =>
      [c.state, c.questions, c.options].every((v, i) => sets[i] === null || sets[i]!.includes(v));
    if (sets.every((s) => s !== null)) {
      for (const state of sets[0]!) for (const questions of sets[1]!) for (const options of sets[2]!) {
        const c = { state, questions, options };
        if (c.questions > 64 || c.options > 26) throw new Error(`--cells: ${cellName(c)} is outside the spec's limits`);
        if (!has(c)) out.push(c);
      }
    } else {
      for (const c of matrix) if (match(c) && !has(c)) out.push(c);
    }
  }
  if (out.length === 0) throw new Error(`--cells "${spec}" selects no cell`);
  return out;
}

export type Layer = "engine" | "pipeline" | "http";
export type Baseline = "naive" | "llama";

export interface LatencyOptions {
  cells: Cell[];
  mode: "burst" | "sustained" | "both";
  layers: Layer[];
  warmup: number;
  requests: number;
  concurrency: number[];
  durationS: number;
  sustainedCell: Cell;
  baselines: Baseline[];
  naiveSample: number;
  /** The model name measured; llama.cpp runs the GGUF its build was exported from unless `gguf` says otherwise. */
  model: string;
  gguf?: string;
  llamaThreads: number;
  workers?: number;
  threads?: number;
  /** ASSAY_PREFIX_CACHE_MB for the run; default 0 (every request computes its state). */
  prefixCacheMb?: number;
}

interface Stats {
  n: number;
  p50: number;
  p95: number;
  p99: number;
  mean: number;
  min: number;
  max: number;
}

function stats(xs: number[]): Stats {
  const r = (v: number) => +v.toFixed(1);
  return {
    n: xs.length,
    p50: r(percentile(xs, 50)),
    p95: r(percentile(xs, 95)),
    p99: r(percentile(xs, 99)),
    mean: r(xs.reduce((s, x) => s + x, 0) / Math.max(1, xs.length)),
    min: r(Math.min(...xs)),
    max: r(Math.max(...xs)),
  };
}

interface CellResult {
  cell: string;
  state_tokens: number;
  questions: number;
  options: number;
  /** Tokens in the packed pass (prefix + question blocks) and the charged prompt tokens. */
  packed_tokens: number;
  prompt_tokens: number;
  prefix_tokens: number;
  layers: Partial<Record<Layer, Stats>>;
  /** Tokens per second of the engine layer's p50. */
  engine_tok_s: number | null;
  naive?: { measured: number; of: number; pass_ms_mean: number; request_ms_est: number; over_engine: number | null };
  llama?: {
    /** One full pass (state + question) per question; for 1 question the measured distribution. */
    per_question: { measured: number; of: number; pass_ms_mean: number; request_ms_est: number; stats?: Stats };
    /** State once, then each question with the KV prefix kept (more than one question only). */
    shared_prefix?: Stats;
    /**
     * 1 question: assay's engine pass and llama.cpp's pass of the same token ids, alternately;
     * the prefill comparison uses these.
     */
    paired?: {
      same_tokens: boolean;
      tokens: number;
      assay: Stats;
      llama: Stats;
      llama_p50_over_assay_p50: number | null;
      median_of_pair_ratios: number;
    };
    /** Prefill tokens/s of one state + question pass (p50 or mean of the measured passes). */
    tok_s: number;
    /** assay's tokens/s on the same sequences (1 question: the paired engine passes; several: assay's one-question passes). */
    assay_tok_s: number | null;
    /** assay tok/s over llama.cpp tok/s on the same tokens. */
    assay_over_llama_tok_s: number | null;
    /** llama.cpp's best request time (shared prefix when there are several questions) over assay's engine p50. */
    llama_best_over_engine: number | null;
  };
  http_over_engine: number | null;
  pipeline_over_engine: number | null;
  /** Median over the burst rounds of (layer time / engine time in the same round). */
  round_ratio_median?: Partial<Record<Layer, number>>;
  error?: string;
}

interface SustainedResult {
  layer: Layer;
  cell: string;
  concurrency: number;
  duration_s: number;
  /** Requests completed within the window (what throughput counts). */
  completed: number;
  /** Requests in flight at the end of the window, finished afterwards (not counted). */
  finished_after_window: number;
  errors: number;
  throughput_rps: number;
  throughput_tok_s: number;
  latency: Stats;
  /** p50 latency of the requests completed in each minute of the run (the last one may be partial). */
  per_minute_p50: { minute: number; n: number; p50: number }[];
  over_lowest_concurrency: number | null;
}

interface Work {
  cell: Cell;
  env: RequestEnvelope;
  body: string;
  prepared: PreparedRequest;
  /** Per question: its packed block (suffix + label tokens) alone after the prefix. */
  blocks: number[][];
  prefix: number[];
}

function work(lb: LoadedBuild, model: string, cell: Cell, states: Map<number, string>): Work {
  let state = states.get(cell.state);
  if (state === undefined) {
    state = stateOf(lb, cell.state);
    states.set(cell.state, state);
  }
  const questions = choiceQuestions(cell.questions, cell.options);
  const env: RequestEnvelope = { model, state, questions };
  const prepared = prepare(lb, state, questions);
  const p = prepared.packed;
  const prefix = Array.from(p.inputIds.subarray(0, p.prefixLength), Number);
  const blocks = Object.entries(questions).map(([id, q]) => {
    const one = prepare(lb, state, { [id]: q }).packed;
    return Array.from(one.inputIds.subarray(one.prefixLength), Number);
  });
  return { cell, env, body: JSON.stringify(env), prepared, blocks, prefix };
}

interface Harness {
  engine: EnginePipeline;
  lb: LoadedBuild;
  config: Config;
  http?: { app: FastifyInstance; url: string; key: string; close(): Promise<void> };
  llama?: LlamaBaseline;
  llamaError?: string;
}

function requester(h: Harness, layer: Layer, w: Work): () => Promise<unknown> {
  let n = 0;
  switch (layer) {
    case "engine":
      // One pass, or several over the same state where the request exceeds the pass limit (as the pipeline reads it).
      return () => readBranches(h.engine.engine, h.lb, w.prepared, passLimit(h.lb, h.config.maxPackedTokens), {});
    case "pipeline":
      return () => h.engine.run(w.env, { requestId: `bench-${n++}`, orgId: "bench", timings: new Timings() });
    case "http": {
      const http = h.http!;
      return async () => {
        const res = await fetch(http.url, {
          method: "POST",
          headers: { authorization: `Bearer ${http.key}`, "content-type": "application/json" },
          body: w.body,
        });
        const text = await res.text();
        if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${text.slice(0, 200)}`);
        return text;
      };
    }
  }
}

export async function startHttp(engine: EnginePipeline): Promise<NonNullable<Harness["http"]>> {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-bench-"));
  // A temporary store: one org with one key. The concurrency limit per
  // organization is raised so that the sustained runs measure the engine,
  // not the spec's limit of 4 requests in flight before a purchase.
  const config = loadConfig({
    ...process.env,
    LOG_LEVEL: "silent",
    ASSAY_DATA_DIR: dataDir,
    ASSAY_CONCURRENCY_BEFORE_PURCHASE: "1000",
  });
  const accounts = await openAccounts(config);
  const { key } = await accounts.createKey("bench");
  const app = buildApp({ config, pipeline: engine, accounts });
  await app.listen({ host: "127.0.0.1", port: 0 });
  const port = (app.server.address() as AddressInfo).port;
  return {
    app,
    url: `http://127.0.0.1:${port}/v1/systemone`,
    key,
    async close() {
      await app.close();
      await accounts.close();
      fs.rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

async function burstCell(h: Harness, w: Work, o: LatencyOptions, log: (s: string) => void): Promise<CellResult> {
  const p = w.prepared.packed;
  const res: CellResult = {
    cell: cellName(w.cell),
    state_tokens: w.cell.state,
    questions: w.cell.questions,
    options: w.cell.options,
    packed_tokens: p.inputIds.length,
    prompt_tokens: p.promptTokens,
    prefix_tokens: p.prefixLength,
    layers: {},
    engine_tok_s: null,
    http_over_engine: null,
    pipeline_over_engine: null,
  };
  // The layers take turns (rotating which goes first), so that a change in the
  // machine's load while the cell runs hits every layer alike.
  const fns = o.layers.map((layer) => requester(h, layer, w));
  for (const fn of fns) for (let i = 0; i < o.warmup; i++) await fn();
  const times: number[][] = fns.map(() => []);
  for (let i = 0; i < o.requests; i++) {
    for (let j = 0; j < fns.length; j++) {
      const k = (i + j) % fns.length;
      const t = performance.now();
      await fns[k]!();
      times[k]!.push(performance.now() - t);
    }
  }
  o.layers.forEach((layer, k) => {
    res.layers[layer] = stats(times[k]!);
    log(`  ${res.cell} ${layer}: p50 ${fmtMs(res.layers[layer]!.p50)} ms`);
  });
  const eng = res.layers.engine?.p50 ?? null;
  if (eng) res.engine_tok_s = Math.round((p.inputIds.length / eng) * 1000);
  res.http_over_engine = ratio(res.layers.http?.p50, eng, 3);
  res.pipeline_over_engine = ratio(res.layers.pipeline?.p50, eng, 3);
  // Each round ran every layer back to back: the median of the per-round ratios
  // is steadier than the ratio of p50s when the machine's speed drifts.
  const ei = o.layers.indexOf("engine");
  if (ei >= 0) {
    res.round_ratio_median = {};
    o.layers.forEach((layer, k) => {
      if (layer !== "engine") res.round_ratio_median![layer] = +median(times[k]!.map((x, i) => x / times[ei]![i]!)).toFixed(3);
    });
  }

  const q = w.cell.questions;
  const sample = Math.max(1, Math.min(q, o.naiveSample));
  if (o.baselines.includes("naive")) {
    // One full pass of state + question per question, nothing shared.
    const ids = Object.keys(w.env.questions).slice(0, sample);
    const singles = ids.map((id) => prepare(h.lb, w.env.state, { [id]: w.env.questions[id] as never }).packed);
    // Through the engine, as the engine layer runs: a v3 build takes past keys and values (the pinned preamble).
    await h.engine.engine.run(h.lb, singles[0]!);
    const xs: number[] = [];
    for (const s of singles) {
      const t = performance.now();
      await h.engine.engine.run(h.lb, s);
      xs.push(performance.now() - t);
    }
    const mean = xs.reduce((a, b) => a + b, 0) / xs.length;
    res.naive = { measured: xs.length, of: q, pass_ms_mean: +mean.toFixed(1), request_ms_est: Math.round(mean * q), over_engine: ratio(mean * q, eng) };
    log(`  ${res.cell} naive: ${fmtMs(mean * q)} ms (${xs.length}/${q} passes measured)`);
  }
  if (h.llama && o.baselines.includes("llama")) {
    const ll = h.llama;
    const seqs = w.blocks.slice(0, sample).map((b) => [...w.prefix, ...b]);
    await ll.evaluate(seqs[0]!);
    let perQuestion: NonNullable<CellResult["llama"]>["per_question"];
    let tokS: number;
    let paired: NonNullable<CellResult["llama"]>["paired"];
    if (q === 1) {
      // The same sequence in both engines, measured alternately (assay pass, llama.cpp pass, …)
      // so that a change in the machine's load hits both alike.
      const same = seqs[0]!.length === p.inputIds.length && seqs[0]!.every((id, i) => BigInt(id) === p.inputIds[i]);
      for (let i = 1; i < o.warmup; i++) await ll.evaluate(seqs[0]!);
      const xs: number[] = [];
      const as: number[] = [];
      for (let i = 0; i < o.requests; i++) {
        const t = performance.now();
        await h.engine.engine.run(h.lb, p);
        as.push(performance.now() - t);
        xs.push(await ll.evaluate(seqs[0]!));
      }
      const s = stats(xs);
      const a = stats(as);
      perQuestion = { measured: xs.length, of: 1, pass_ms_mean: s.mean, request_ms_est: s.p50, stats: s };
      tokS = (seqs[0]!.length / s.p50) * 1000;
      paired = {
        same_tokens: same,
        tokens: seqs[0]!.length,
        assay: a,
        llama: s,
        llama_p50_over_assay_p50: ratio(s.p50, a.p50, 3),
        median_of_pair_ratios: +median(xs.map((x, i) => x / as[i]!)).toFixed(3),
      };
    } else {
      const xs: number[] = [];
      for (const sq of seqs) xs.push(await ll.evaluate(sq));
      const mean = xs.reduce((a, b) => a + b, 0) / xs.length;
      perQuestion = { measured: xs.length, of: q, pass_ms_mean: +mean.toFixed(1), request_ms_est: Math.round(mean * q) };
      const toks = seqs.reduce((n, sq) => n + sq.length, 0);
      tokS = (toks / xs.reduce((a, b) => a + b, 0)) * 1000;
    }
    let shared: Stats | undefined;
    if (q > 1) {
      const reps = Math.max(1, Math.min(o.requests, 3));
      const xs: number[] = [];
      for (let i = 0; i < reps; i++) xs.push(await ll.sharedPrefix(w.prefix, w.blocks));
      shared = stats(xs);
    }
    // The same sequence: assay's tokens/s for 1 question is the engine pass; for
    // several, compare per-question passes (the llama.cpp rate) with assay's single-question rate.
    let assayTokS = paired ? Math.round((paired.tokens / paired.assay.p50) * 1000) : null;
    if (q > 1 && res.naive) assayTokS = Math.round((seqs.reduce((n, sq) => n + sq.length, 0) / sample / res.naive.pass_ms_mean) * 1000);
    const best = shared ? Math.min(shared.p50, perQuestion.request_ms_est) : perQuestion.request_ms_est;
    res.llama = {
      per_question: perQuestion,
      ...(shared ? { shared_prefix: shared } : {}),
      tok_s: Math.round(tokS),
      ...(paired ? { paired } : {}),
      assay_tok_s: assayTokS,
      assay_over_llama_tok_s: ratio(assayTokS, tokS, 3),
      llama_best_over_engine: ratio(best, eng, 3),
    };
    log(`  ${res.cell} llama.cpp: ${fmtMs(perQuestion.request_ms_est)} ms per request (one pass per question)` + (shared ? `, ${fmtMs(shared.p50)} ms with the state's KV reused` : ""));
  }
  return res;
}

async function sustained(h: Harness, layer: Layer, w: Work, concurrency: number, o: LatencyOptions): Promise<SustainedResult> {
  const fn = requester(h, layer, w);
  for (let i = 0; i < Math.max(1, o.warmup); i++) await fn();
  const t0 = performance.now();
  const end = t0 + o.durationS * 1000;
  const done: { at: number; ms: number }[] = [];
  let errors = 0;
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (performance.now() < end) {
        const t = performance.now();
        try {
          await fn();
          const now = performance.now();
          done.push({ at: now - t0, ms: now - t });
        } catch {
          errors++;
        }
      }
    }),
  );
  // Throughput over the fixed window only: requests still in flight at its end
  // finish (before the next run starts) but are not counted.
  const inWindow = done.filter((d) => d.at <= o.durationS * 1000);
  const tail = done.length - inWindow.length;
  const elapsed = o.durationS;
  const minutes = new Map<number, number[]>();
  for (const d of inWindow) {
    const m = Math.floor(d.at / 60_000);
    minutes.set(m, [...(minutes.get(m) ?? []), d.ms]);
  }
  return {
    layer,
    cell: cellName(w.cell),
    concurrency,
    duration_s: elapsed,
    completed: inWindow.length,
    finished_after_window: tail,
    errors,
    throughput_rps: +(inWindow.length / elapsed).toFixed(3),
    throughput_tok_s: Math.round((inWindow.length * w.prepared.packed.inputIds.length) / elapsed),
    latency: stats(inWindow.map((d) => d.ms)),
    per_minute_p50: [...minutes.entries()].sort(([a], [b]) => a - b).map(([minute, xs]) => ({ minute: minute + 1, n: xs.length, p50: +median(xs).toFixed(1) })),
    over_lowest_concurrency: null,
  };
}

export interface LatencyReport {
  scenario: "latency";
  machine: MachineNote;
  model: { name: string; build: string; onnx: string };
  engine: { workers: number; intra_op_threads: number; provider: string };
  llama: string | null;
  /** llama-bench pp512 on the same GGUF and threads: the figure llama.cpp's users quote. */
  llama_bench_pp512_tok_s: number | null;
  options: Omit<LatencyOptions, "cells" | "sustainedCell"> & { cells: string[]; sustainedCell: string };
  burst: CellResult[];
  sustained: SustainedResult[];
  goals: Record<string, { value: number | null; target: string; met: boolean | null; note: string }>;
}

export async function latency(o: LatencyOptions): Promise<LatencyReport> {
  const log = (s: string) => console.error(s);
  const machine = machineNote();
  const env: NodeJS.ProcessEnv = { ...process.env, LOG_LEVEL: "silent" };
  if (o.workers) env.ASSAY_WORKERS = String(o.workers);
  if (o.threads) env.ASSAY_INTRA_OP_THREADS = String(o.threads);
  // Every burst repeats one request: with the prefix cache on, all but the
  // first would skip their state. Off unless asked for, so that a cell
  // measures a request whose state is new (the `prefix` scenario measures hits).
  env.ASSAY_PREFIX_CACHE_MB = String(o.prefixCacheMb ?? 0);
  const config = loadConfig(env);
  const needsHttp = o.layers.includes("http");
  log(`latency: loading the engine (${config.workers} lane(s) × ${config.intraOpThreads} thread(s)) ...`);
  const engine = await EnginePipeline.create(config);
  const h: Harness = { engine, lb: engine.build(o.model), config };
  // The same weights on both sides: the GGUF this build was exported from.
  const gguf = o.gguf ?? path.join(ROOT, ".cache", "weights", `${path.basename(path.dirname(h.lb.build.onnxPath))}.gguf`);
  try {
    if (needsHttp) h.http = await startHttp(engine);
    if (o.baselines.includes("llama") && o.mode !== "sustained") {
      try {
        h.llama = await openLlama({ gguf, threads: o.llamaThreads, contextSize: 8192 });
        log(`latency: llama.cpp baseline: ${h.llama.description}`);
      } catch (e) {
        h.llamaError = e instanceof Error ? e.message : String(e);
        log(`latency: no llama.cpp baseline: ${h.llamaError}`);
      }
    }
    const states = new Map<number, string>();
    const burst: CellResult[] = [];
    if (o.mode !== "sustained") {
      for (const cell of o.cells) {
        log(`latency: burst ${cellName(cell)} (${o.warmup} warm-up + ${o.requests} measured per layer)`);
        const w = work(h.lb, o.model, cell, states);
        const limit = passLimit(h.lb, config.maxPackedTokens);
        // Refused as the pipeline refuses it: the state and one question do not fit in a pass.
        const widest = Math.max(...w.prepared.encoded.map(branchCost));
        if (w.prepared.prefix.length + widest > limit) {
          burst.push({
            cell: cellName(cell),
            state_tokens: cell.state,
            questions: cell.questions,
            options: cell.options,
            packed_tokens: w.prepared.packed.inputIds.length,
            prompt_tokens: w.prepared.packed.promptTokens,
            prefix_tokens: w.prepared.packed.prefixLength,
            layers: {},
            engine_tok_s: null,
            http_over_engine: null,
            pipeline_over_engine: null,
            error: `a ${w.prepared.prefix.length}-token state and a ${widest}-token question, over the pass limit of ${limit}`,
          });
          continue;
        }
        burst.push(await burstCell(h, w, o, log));
      }
    }
    const sus: SustainedResult[] = [];
    if (o.mode !== "burst") {
      const w = work(h.lb, o.model, o.sustainedCell, states);
      for (const layer of o.layers) {
        for (const c of o.concurrency) {
          log(`latency: sustained ${layer} concurrency ${c} for ${o.durationS} s on ${cellName(o.sustainedCell)}`);
          sus.push(await sustained(h, layer, w, c, o));
        }
        const rows = sus.filter((s) => s.layer === layer);
        const base = rows.reduce((a, b) => (b.concurrency < a.concurrency ? b : a));
        for (const r of rows) r.over_lowest_concurrency = ratio(r.throughput_rps, base.throughput_rps, 3);
      }
    }
    machine.loadEnd = +os.loadavg()[0]!.toFixed(2);
    const report: LatencyReport = {
      scenario: "latency",
      machine,
      model: { name: h.lb.build.manifest.name, build: h.lb.build.manifest.build_hash, onnx: path.relative(ROOT, h.lb.build.onnxPath) },
      engine: { workers: config.workers, intra_op_threads: config.intraOpThreads, provider: config.provider },
      llama: h.llama?.description ?? (h.llamaError ? `unavailable: ${h.llamaError}` : null),
      llama_bench_pp512_tok_s: h.llama?.pp512TokS ?? null,
      options: { ...o, gguf: path.relative(ROOT, gguf), cells: o.cells.map(cellName), sustainedCell: cellName(o.sustainedCell) },
      burst,
      sustained: sus,
      goals: goals(burst, sus),
    };
    return report;
  } finally {
    await h.llama?.close();
    await h.http?.close();
    await engine.close();
  }
}

function goals(burst: CellResult[], sus: SustainedResult[]): LatencyReport["goals"] {
  const primary = burst.find((b) => b.cell === cellName(PRIMARY));
  const g: LatencyReport["goals"] = {};
  const prefill = primary?.llama?.assay_over_llama_tok_s ?? null;
  g.prefill_vs_llama = {
    value: prefill,
    target: "≥ 1.0× llama.cpp prefill tokens/s, same weights, same tokens (primary cell)",
    met: prefill === null ? null : prefill >= 1.0,
    note: primary?.llama?.paired
      ? `assay engine ${primary.llama.assay_tok_s} tok/s vs llama.cpp ${primary.llama.tok_s} tok/s on the same ${primary.llama.paired.tokens} token ids ` +
        `(same ids: ${primary.llama.paired.same_tokens}), measured alternately, p50 of ${primary.llama.paired.assay.n} each; ` +
        `median of per-pair ratios ${primary.llama.paired.median_of_pair_ratios}`
      : "not measured (needs the primary cell with the llama baseline)",
  };
  const hoe = primary?.http_over_engine ?? null;
  g.http_over_engine = {
    value: hoe,
    target: "HTTP p50 ≤ 1.05× engine-only p50 (primary cell)",
    met: hoe === null ? null : hoe <= 1.05,
    note:
      primary?.layers.http && primary.layers.engine
        ? `HTTP ${primary.layers.http.p50} ms vs engine ${primary.layers.engine.p50} ms (p50 of ${primary.layers.engine.n}); ` +
          `median of the per-round ratios ${primary.round_ratio_median?.http ?? "–"}`
        : "not measured",
  };
  for (const layer of ["engine", "pipeline", "http"] as const) {
    const c1 = sus.find((s) => s.layer === layer && s.concurrency === 1);
    const c8 = sus.find((s) => s.layer === layer && s.concurrency === 8);
    if (!c1 || !c8) continue;
    const v = ratio(c8.throughput_rps, c1.throughput_rps, 3);
    g[`c8_over_c1_${layer}`] = {
      value: v,
      target: "throughput at concurrency 8 ≥ 1.8× concurrency 1",
      met: v === null ? null : v >= 1.8,
      note: `${layer}: ${c8.throughput_rps} vs ${c1.throughput_rps} requests/s on ${c1.cell}`,
    };
  }
  return g;
}

export function latencyMarkdown(r: LatencyReport, command: string): string {
  const L: string[] = [];
  L.push(`## latency (${r.machine.startedAt})`, "");
  L.push(`Command: \`${command}\``, "");
  L.push(
    `Model ${r.model.name}, build \`${r.model.build}\`; engine ${r.engine.workers} lane(s) × ${r.engine.intra_op_threads} thread(s) on ${r.engine.provider}; ` +
      `${r.machine.cores} cores (${r.machine.cpu}); load average ${r.machine.loadStart} at the start, ${r.machine.loadEnd ?? "?"} at the end; Node ${r.machine.node}.`,
  );
  L.push(`llama.cpp: ${r.llama ?? "not run"}.`, "");
  if (r.burst.length) {
    L.push(`### Burst: ${r.options.warmup} warm-up, then ${r.options.requests} requests one after another (ms)`, "");
    L.push(
      "| cell (state×questions×options) | packed tokens | engine p50 / p95 / p99 | pipeline p50 / p95 / p99 | HTTP p50 / p95 / p99 | HTTP / engine (p50s) | HTTP / engine (median per round) | engine tok/s |",
    );
    L.push("|---|---|---|---|---|---|---|---|");
    const trip = (s?: Stats) => (s ? `${fmtMs(s.p50)} / ${fmtMs(s.p95)} / ${fmtMs(s.p99)}` : "–");
    for (const c of r.burst) {
      if (c.error) {
        L.push(`| ${c.cell} | ${c.packed_tokens} | ${c.error} | | | | | |`);
        continue;
      }
      L.push(`| ${c.cell} | ${c.packed_tokens} | ${trip(c.layers.engine)} | ${trip(c.layers.pipeline)} | ${trip(c.layers.http)} | ${c.http_over_engine ?? "–"} | ${c.round_ratio_median?.http ?? "–"} | ${c.engine_tok_s ?? "–"} |`);
    }
    L.push("");
    if (r.burst.some((c) => c.naive || c.llama)) {
      L.push("### Baselines, same cells (ms per request)", "");
      L.push(
        "| cell | assay engine p50 | naive: one pass per question (measured/all) | naive / assay | llama.cpp: one pass per question | llama.cpp: state once, KV reused | llama.cpp best / assay | llama.cpp tok/s | assay / llama.cpp tok/s |",
      );
      L.push("|---|---|---|---|---|---|---|---|---|");
      for (const c of r.burst) {
        if (c.error) continue;
        const nv = c.naive ? `${fmtMs(c.naive.request_ms_est)} (${c.naive.measured}/${c.naive.of})` : "–";
        const lq = !c.llama
          ? "–"
          : c.llama.per_question.stats
            ? `${fmtMs(c.llama.per_question.request_ms_est)} (p50 of ${c.llama.per_question.measured})`
            : `${fmtMs(c.llama.per_question.request_ms_est)} (${c.llama.per_question.measured}/${c.llama.per_question.of})`;
        const ls = c.llama?.shared_prefix ? fmtMs(c.llama.shared_prefix.p50) : c.llama ? "= one pass" : "–";
        L.push(
          `| ${c.cell} | ${fmtMs(c.layers.engine?.p50)} | ${nv} | ${c.naive?.over_engine ?? "–"} | ${lq} | ${ls} | ${c.llama?.llama_best_over_engine ?? "–"} | ${c.llama?.tok_s ?? "–"} | ${c.llama?.assay_over_llama_tok_s ?? "–"} |`,
        );
      }
      L.push("");
    }
  }
  if (r.sustained.length) {
    L.push(`### Sustained: fixed concurrency for ${r.options.durationS} s on ${r.options.sustainedCell}`, "");
    L.push("| layer | concurrency | completed in the window (+ finished after) | errors | requests/s | tok/s | p50 / p95 / p99 ms | p50 per minute | throughput / lowest concurrency |");
    L.push("|---|---|---|---|---|---|---|---|---|");
    for (const s of r.sustained) {
      const pm = s.per_minute_p50.map((m) => `m${m.minute}: ${fmtMs(m.p50)} (${m.n})`).join(", ");
      L.push(
        `| ${s.layer} | ${s.concurrency} | ${s.completed} (+${s.finished_after_window}) | ${s.errors} | ${s.throughput_rps} | ${s.throughput_tok_s} | ${fmtMs(s.latency.p50)} / ${fmtMs(s.latency.p95)} / ${fmtMs(s.latency.p99)} | ${pm} | ${s.over_lowest_concurrency ?? "–"} |`,
      );
    }
    L.push("");
  }
  const gl = Object.entries(r.goals);
  if (gl.length) {
    L.push("### Goals", "");
    for (const [k, g] of gl) {
      if (g.met === null) L.push(`- ${k} (${g.target}): ${g.note}.`);
      else L.push(`- ${k}: **${g.value}** (${g.target}): **${g.met ? "met" : "not met"}**. ${g.note}.`);
    }
    L.push("");
  }
  return L.join("\n");
}

export function latencySvg(r: LatencyReport): string {
  const panels: BarPanel[] = [];
  const cells = r.burst.filter((c) => !c.error);
  if (cells.length) {
    const cats = cells.map((c) => c.cell);
    const pick = (f: (c: CellResult) => number | null | undefined) => cells.map((c) => f(c) ?? null);
    panels.push({
      title: "Burst latency per request, p50 (whisker: p99)",
      yLabel: "ms",
      categories: cats,
      log: true,
      series: [
        ...(["engine", "pipeline", "http"] as const)
          .filter((l) => cells.some((c) => c.layers[l]))
          .map((l) => ({ name: `assay ${l}`, values: pick((c) => c.layers[l]?.p50), high: pick((c) => c.layers[l]?.p99) })),
        ...(cells.some((c) => c.naive) ? [{ name: "naive (one pass/question)", values: pick((c) => c.naive?.request_ms_est) }] : []),
        ...(cells.some((c) => c.llama)
          ? [
              { name: "llama.cpp one pass/question", values: pick((c) => c.llama?.per_question.request_ms_est) },
              { name: "llama.cpp state KV reused", values: pick((c) => c.llama?.shared_prefix?.p50 ?? c.llama?.per_question.request_ms_est) },
            ]
          : []),
      ],
    });
    if (cells.some((c) => c.llama)) {
      panels.push({
        title: "Prefill throughput on the same token ids (state + one question per pass)",
        yLabel: "tokens/s",
        categories: cats,
        series: [
          { name: "assay engine", values: pick((c) => c.llama?.assay_tok_s) },
          { name: "llama.cpp", values: pick((c) => c.llama?.tok_s) },
        ],
      });
    }
  }
  if (r.sustained.length) {
    const conc = [...new Set(r.sustained.map((s) => s.concurrency))].sort((a, b) => a - b);
    const layers = [...new Set(r.sustained.map((s) => s.layer))];
    panels.push({
      title: `Sustained throughput on ${r.options.sustainedCell}`,
      yLabel: "requests/s",
      categories: conc.map((c) => `concurrency ${c}`),
      series: layers.map((l) => ({
        name: `assay ${l}`,
        values: conc.map((c) => r.sustained.find((s) => s.layer === l && s.concurrency === c)?.throughput_rps ?? null),
      })),
    });
  }
  return barChart(
    panels,
    `assay latency: ${r.model.name} (${r.model.build}), ${r.engine.workers}×${r.engine.intra_op_threads} threads`,
    `${r.machine.startedAt}; ${r.machine.cores} cores; load ${r.machine.loadStart} → ${r.machine.loadEnd ?? "?"}`,
  );
}

export async function latencyScenario(o: LatencyOptions, command: string): Promise<void> {
  const r = await latency(o);
  write("latency", r, latencyMarkdown(r, command), latencySvg(r));
}
