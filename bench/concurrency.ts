/**
 * Many callers at once: N small requests (a one-line support ticket each,
 * every state different, one `noul` question) through the HTTP server at
 * concurrency 1, 4, 8, 16, and a mixed load of those small requests with
 * large ones (a long state with several questions) at concurrency 8.
 *
 * Sides, in the same run, alternating by round:
 *   alone    ASSAY_BATCH_MAX_TOKENS=0: every pass runs by itself (the engine before batching);
 *   batched  the defaults: waiting passes of different requests run as one (src/inference/batch.ts);
 *   llama    llama.cpp's server built natively (scripts/build-llama.mjs) with `--slots` parallel slots and
 *            continuous batching, sent the same token ids (each small request's packed pass as one
 *            prompt), timed as a client sees it, like assay's HTTP side.
 * Throughput is requests per second of wall time for the whole set; latency percentiles are per request.
 * The batched side's answers are compared with the alone side's (the same request, the same model).
 */
import fs from "node:fs";
import path from "node:path";
import { loadConfig, ROOT } from "../src/config/index.js";
import { prepare } from "../src/families/general.js";
import { EnginePipeline } from "../src/pipeline/index.js";
import type { Question, SystemOneResponse } from "../src/validate/schema.js";
import { fmtMs, machineNote, percentile, ratio, stateOf, write, type MachineNote } from "./common.js";
import { startHttp } from "./latency.js";
import { openLlama } from "./llama.js";

export interface ConcurrencyOptions {
  model: string;
  requests: number;
  levels: number[];
  /** Large requests in the mixed load (beside `requests` small ones, at concurrency 8). */
  large: number;
  largeStateTokens: number;
  rounds: number;
  llama: boolean;
  slots: number;
  llamaThreads: number;
  gguf?: string;
}

interface Run {
  concurrency: number;
  wallMs: number;
  throughput: number;
  p50: number;
  p99: number;
}

interface MixedRun {
  wallMs: number;
  smallP50: number;
  smallP99: number;
  largeP50: number;
}

interface SideResult {
  runs: Run[][];
  mixed: MixedRun[];
  answers: Record<number, number>[];
  passesPerRun?: number;
}

const SUBJECTS = ["parcel", "invoice", "jacket", "password", "subscription", "refund", "voucher", "delivery slot"];
const TROUBLES = ["never arrived", "was charged twice", "is the wrong size", "stopped working", "was cancelled without notice", "is still pending", "cannot be applied", "was missed"];

/** N different one-line tickets: a subject, a trouble and an order number. */
function tickets(n: number): string[] {
  return Array.from({ length: n }, (_, i) => `Ticket ${1000 + i}: my ${SUBJECTS[i % SUBJECTS.length]} ${TROUBLES[(i * 3) % TROUBLES.length]} (order ${70_000 + 37 * i}).`);
}

const SMALL_Q: Record<string, Question> = { refund: { type: "noul", instructions: "Is the customer asking for money back?" } };
const LARGE_Q: Record<string, Question> = {
  urgent: { type: "noul", instructions: "Is the matter urgent?" },
  topic: { type: "choice", instructions: "What is it mainly about?", criteria: { delivery: null, billing: null, product: null, account: null } },
  mood: { type: "score", instructions: "How satisfied is the writer?", criteria: ["very unhappy", "unhappy", "neutral", "happy", "very happy"] },
  reply: { type: "noul", instructions: "Does it need a reply today?" },
};

/** Runs `jobs` with `c` in flight; per-job wall ms, and the wall ms of the whole set. */
async function inFlight(jobs: (() => Promise<unknown>)[], c: number): Promise<{ times: number[]; wallMs: number }> {
  const times = new Array<number>(jobs.length);
  let next = 0;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: Math.min(c, jobs.length) }, async () => {
      for (let i = next++; i < jobs.length; i = next++) {
        const t = performance.now();
        await jobs[i]!();
        times[i] = performance.now() - t;
      }
    }),
  );
  return { times, wallMs: performance.now() - t0 };
}

const run = (c: number, r: { times: number[]; wallMs: number }): Run => ({
  concurrency: c,
  wallMs: r.wallMs,
  throughput: (r.times.length / r.wallMs) * 1000,
  p50: percentile(r.times, 50),
  p99: percentile(r.times, 99),
});

async function assaySide(o: ConcurrencyOptions, batched: boolean, smalls: string[], large: string[], log: (s: string) => void) {
  // The batched side loads its batch graph at boot (ASSAY_BATCH_PRELOAD): the bench reads steady throughput,
  // and the first batch would otherwise wait out that load (a p99 of 16 s at concurrency 4 on 2 cores).
  const env = { ...process.env, LOG_LEVEL: "silent", ...(batched ? { ASSAY_BATCH_PRELOAD: "1" } : { ASSAY_BATCH_MAX_TOKENS: "0" }) };
  const engine = await EnginePipeline.create(loadConfig(env));
  const http = await startHttp(engine);
  try {
    const post = async (state: string, questions: Record<string, Question>) => {
      const res = await fetch(http.url, {
        method: "POST",
        headers: { authorization: `Bearer ${http.key}`, "content-type": "application/json" },
        body: JSON.stringify({ model: o.model, state, questions }),
      });
      const text = await res.text();
      if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${text.slice(0, 200)}`);
      return JSON.parse(text) as SystemOneResponse;
    };
    // Warm-up: the model's first passes and the content-free prior of the question type.
    for (const s of smalls.slice(0, 2)) await post(s, SMALL_Q);
    await post(large[0]!, LARGE_Q);
    const runs: Run[] = [];
    const answers: Record<number, number> = {};
    for (const c of o.levels) {
      const jobs = smalls.map((s, i) => async () => {
        const r = await post(s, SMALL_Q);
        const a = r.answers.refund;
        if (a?.type === "noul") answers[i] = a.noul;
      });
      const r = run(c, await inFlight(jobs, c));
      runs.push(r);
      log(`  ${batched ? "batched" : "alone"} c=${c}: ${r.throughput.toFixed(2)} req/s, p50 ${fmtMs(r.p50)} ms, p99 ${fmtMs(r.p99)} ms`);
    }
    // Mixed: the large requests spread among the small ones, 8 in flight.
    const order: { large: boolean; state: string }[] = smalls.map((s) => ({ large: false, state: s }));
    large.forEach((s, i) => order.splice(Math.floor(((i + 0.5) * order.length) / large.length), 0, { large: true, state: s }));
    const times: { large: boolean; ms: number }[] = [];
    const t0 = performance.now();
    await inFlight(
      order.map((x) => async () => {
        const t = performance.now();
        await post(x.state, x.large ? LARGE_Q : SMALL_Q);
        times.push({ large: x.large, ms: performance.now() - t });
      }),
      8,
    );
    const small = times.filter((t) => !t.large).map((t) => t.ms);
    const big = times.filter((t) => t.large).map((t) => t.ms);
    const mixed = { wallMs: performance.now() - t0, smallP50: percentile(small, 50), smallP99: percentile(small, 99), largeP50: percentile(big, 50) };
    log(`  ${batched ? "batched" : "alone"} mixed: small p50 ${fmtMs(mixed.smallP50)} p99 ${fmtMs(mixed.smallP99)} ms, large p50 ${fmtMs(mixed.largeP50)} ms`);
    return { runs, mixed, answers };
  } finally {
    await http.close();
    await engine.close();
  }
}

export async function concurrencyScenario(o: ConcurrencyOptions, command: string): Promise<void> {
  const machine: MachineNote = machineNote();
  const log = (s: string) => process.stderr.write(`${s}\n`);
  // Sixteen requests in flight queue more than the default 60-s deadline on a slow CPU; the bench
  // measures throughput and latency, not admission's refusals (the server's config is read from here).
  process.env.ASSAY_REQUEST_TIMEOUT_MS ??= "600000";
  const smalls = tickets(o.requests);
  // The token ids llama.cpp is sent: each small request's packed pass, read off the same build.
  const probe = await EnginePipeline.create(loadConfig({ ...process.env, LOG_LEVEL: "silent" }));
  const lb = probe.build(o.model);
  const large = Array.from({ length: o.large }, (_, i) => `${i}. ${stateOf(lb, o.largeStateTokens)}`);
  const ids = smalls.map((s) => Array.from(prepare(lb, s, SMALL_Q).packed.inputIds, Number));
  const recipe = lb.build.manifest.source.recipe;
  // What packing could gain on this machine (engine layer, each state new to the prefix cache, medians of
  // 3): one ticket's pass against one pass of the same tokens eight requests have (a state eight tickets
  // long, eight questions), and against a state eight tickets long with one question (fewer tokens).
  const pass = async (state: string, questions: Record<string, Question>) => {
    const t = performance.now();
    await probe.engine.run(lb, prepare(lb, state, questions).packed);
    return performance.now() - t;
  };
  const eightQ = Object.fromEntries(Array.from({ length: 8 }, (_, k) => [`q${k}`, SMALL_Q.refund!]));
  await pass("warm-up ticket: the content-free prior and the preamble", SMALL_Q);
  const one: number[] = [];
  const same: number[] = [];
  const fewer: number[] = [];
  for (let i = 0; i < 3; i++) {
    one.push(await pass(`${i}: ${smalls[i]!}`, SMALL_Q));
    same.push(await pass(`${i}: ${smalls.slice(i, i + 8).join(" ")}`, eightQ));
    fewer.push(await pass(`${i + 3}: ${smalls.slice(i, i + 8).join(" ")}`, SMALL_Q));
  }
  const t1 = percentile(one, 50);
  const ceiling = { oneMs: t1, eightTokensMs: percentile(same, 50), ratio: ratio(8 * t1, percentile(same, 50)), oneQuestionMs: percentile(fewer, 50), oneQuestionRatio: ratio(8 * t1, percentile(fewer, 50)) };
  log(`ceiling: one ticket ${fmtMs(t1)} ms; eight requests' tokens in one pass ${fmtMs(ceiling.eightTokensMs)} ms (${ceiling.ratio}x); a state eight tickets long with one question ${fmtMs(ceiling.oneQuestionMs)} ms (${ceiling.oneQuestionRatio}x)`);
  await probe.close();

  const sides: Record<"alone" | "batched", SideResult> = { alone: { runs: [], mixed: [], answers: [] }, batched: { runs: [], mixed: [], answers: [] } };
  for (let round = 0; round < o.rounds; round++) {
    const order: ("alone" | "batched")[] = round % 2 === 0 ? ["alone", "batched"] : ["batched", "alone"];
    for (const side of order) {
      log(`round ${round + 1}, ${side} ...`);
      const r = await assaySide(o, side === "batched", smalls, large, log);
      sides[side].runs.push(r.runs);
      sides[side].mixed.push(r.mixed);
      sides[side].answers.push(r.answers);
    }
  }

  let llama: { description: string; runs: Run[] } | null = null;
  let llamaError: string | undefined;
  if (o.llama) {
    try {
      const gguf = o.gguf ?? path.join(ROOT, ".cache", "weights", `${String(recipe)}.gguf`);
      if (!fs.existsSync(gguf)) throw new Error(`no GGUF at ${gguf}`);
      const longest = Math.max(...ids.map((x) => x.length));
      const server = await openLlama({ gguf, threads: o.llamaThreads, contextSize: o.slots * Math.max(512, 2 * longest), slots: o.slots });
      try {
        for (const x of ids.slice(0, 2)) await server.request(x);
        const runs: Run[] = [];
        for (const c of o.levels) {
          const r = run(c, await inFlight(ids.map((x) => () => server.request(x)), c));
          runs.push(r);
          log(`  llama.cpp c=${c}: ${r.throughput.toFixed(2)} req/s, p50 ${fmtMs(r.p50)} ms, p99 ${fmtMs(r.p99)} ms`);
        }
        llama = { description: server.description, runs };
      } finally {
        await server.close();
      }
    } catch (e) {
      llamaError = e instanceof Error ? e.message : String(e);
      log(`llama.cpp baseline failed: ${llamaError}`);
    }
  }
  machine.loadEnd = +(await import("node:os")).loadavg()[0]!.toFixed(2);

  // Per level: the median over rounds of each side's throughput and percentiles.
  const med = (xs: number[]) => percentile(xs, 50);
  const level = (side: SideResult, i: number): Run => ({
    concurrency: o.levels[i]!,
    wallMs: med(side.runs.map((r) => r[i]!.wallMs)),
    throughput: med(side.runs.map((r) => r[i]!.throughput)),
    p50: med(side.runs.map((r) => r[i]!.p50)),
    p99: med(side.runs.map((r) => r[i]!.p99)),
  });
  const mixed = (side: SideResult): MixedRun => ({
    wallMs: med(side.mixed.map((m) => m.wallMs)),
    smallP50: med(side.mixed.map((m) => m.smallP50)),
    smallP99: med(side.mixed.map((m) => m.smallP99)),
    largeP50: med(side.mixed.map((m) => m.largeP50)),
  });
  const A = o.levels.map((_, i) => level(sides.alone, i));
  const B = o.levels.map((_, i) => level(sides.batched, i));
  const at = (rs: Run[], c: number) => rs.find((r) => r.concurrency === c);
  let answerDiff = 0;
  for (const b of sides.batched.answers) for (const a of sides.alone.answers) for (const [i, x] of Object.entries(b)) answerDiff = Math.max(answerDiff, Math.abs(x - (a[Number(i)] ?? x)));
  const c1 = at(B, 1);
  const c8 = at(B, 8);
  const goals = {
    batched_c8_over_c1: ratio(c8?.throughput, c1?.throughput),
    lone_latency_batched_over_alone: ratio(c1?.p50, at(A, 1)?.p50),
    mixed_small_p99_batched_over_alone: ratio(mixed(sides.batched).smallP99, mixed(sides.alone).smallP99),
    batched_c8_over_llama_c8: ratio(c8?.throughput, llama ? at(llama.runs, 8)?.throughput : null),
    alone_c8_over_llama_c8: ratio(at(A, 8)?.throughput, llama ? at(llama.runs, 8)?.throughput : null),
    max_answer_difference: +answerDiff.toExponential(2),
  };
  const result = { machine, options: o, model: o.model, build: lb.build.manifest.build_hash, small_tokens: ids.map((x) => x.length), ceiling, alone: A, batched: B, mixed: { alone: mixed(sides.alone), batched: mixed(sides.batched) }, llama, llamaError, rounds: sides, goals };

  const md: string[] = [
    `# concurrency: ${o.requests} small requests (one-line ticket, one noul question, ${Math.min(...ids.map((x) => x.length))}–${Math.max(...ids.map((x) => x.length))} packed tokens), ${o.model}`,
    "",
    `\`${command}\``,
    "",
    `${machine.cpu}, ${machine.cores} cores, Node ${machine.node}, load ${machine.loadStart} → ${machine.loadEnd}; ${o.rounds} round(s), sides alternating; medians over rounds. HTTP layer for assay.`,
    "",
    "| concurrency | alone req/s | batched req/s | batched / alone | llama.cpp req/s | batched / llama.cpp | alone p50 / p99 ms | batched p50 / p99 ms | llama.cpp p50 / p99 ms |",
    "|---|---|---|---|---|---|---|---|---|",
    ...o.levels.map((c, i) => {
      const a = A[i]!;
      const b = B[i]!;
      const l = llama ? at(llama.runs, c) : undefined;
      return `| ${c} | ${a.throughput.toFixed(2)} | ${b.throughput.toFixed(2)} | ${ratio(b.throughput, a.throughput) ?? "–"} | ${l ? l.throughput.toFixed(2) : "–"} | ${ratio(b.throughput, l?.throughput) ?? "–"} | ${fmtMs(a.p50)} / ${fmtMs(a.p99)} | ${fmtMs(b.p50)} / ${fmtMs(b.p99)} | ${l ? `${fmtMs(l.p50)} / ${fmtMs(l.p99)}` : "–"} |`;
    }),
    "",
    `Mixed load (${o.requests} small + ${o.large} large of ${o.largeStateTokens} tokens × 4 questions, 8 in flight): small p50 / p99 alone ${fmtMs(mixed(sides.alone).smallP50)} / ${fmtMs(mixed(sides.alone).smallP99)} ms, batched ${fmtMs(mixed(sides.batched).smallP50)} / ${fmtMs(mixed(sides.batched).smallP99)} ms; large p50 alone ${fmtMs(mixed(sides.alone).largeP50)}, batched ${fmtMs(mixed(sides.batched).largeP50)} ms; wall ${fmtMs(mixed(sides.alone).wallMs)} / ${fmtMs(mixed(sides.batched).wallMs)} ms.`,
    "",
    `Packing's ceiling on this machine (engine layer, medians of 3): one ticket's pass ${fmtMs(ceiling.oneMs)} ms; one pass of eight requests' tokens (a state eight tickets long, eight questions) ${fmtMs(ceiling.eightTokensMs)} ms: eight small passes cost **${ceiling.ratio}×** one pass of their tokens; a state eight tickets long with one question (fewer tokens) ${fmtMs(ceiling.oneQuestionMs)} ms, ${ceiling.oneQuestionRatio}×.`,
    "",
    `Goals: batched c8 / c1 throughput **${goals.batched_c8_over_c1}** (≥ 1.3); lone request p50 batched / alone **${goals.lone_latency_batched_over_alone}** (≤ 1.05); mixed small p99 batched / alone **${goals.mixed_small_p99_batched_over_alone}** (≤ 1); batched c8 / llama.cpp c8 **${goals.batched_c8_over_llama_c8 ?? "–"}** (≥ 3; alone ${goals.alone_c8_over_llama_c8 ?? "–"}); largest answer difference batched vs alone ${goals.max_answer_difference}.`,
    "",
    llama ? `llama.cpp: ${llama.description}` : `llama.cpp: not run${llamaError ? ` (${llamaError})` : ""}`,
  ];
  write("concurrency", result, md.join("\n") + "\n");
}
