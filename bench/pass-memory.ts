/**
 * `npm run bench -- pass-memory`: the pair bound on a pass's attention
 * (ASSAY_PASS_ATTENTION_MB) against the same server without it (the setting at
 * 0, what shipped before: passes bounded by ASSAY_MAX_PACKED_TOKENS alone), on
 * requests whose passes build the largest score tensors the API accepts.
 *
 * onnxruntime's arena keeps the largest buffers a worker has built, so the
 * two sides cannot share a process: each case runs once per side in a child
 * process of its own (`pass-memory-side`), which loads the pipeline, samples
 * its resident memory while the one request runs, and prints its answers.
 * Figures: wall time, peak resident memory above the loaded pipeline's, the
 * largest pass in query–key pairs, and the answers' largest difference.
 */
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { loadConfig, ROOT } from "../src/config/index.js";
import { EnginePipeline } from "../src/pipeline/index.js";
import { Timings } from "../src/pipeline/timings.js";
import type { PackedTensors } from "../src/inference/pack.js";
import type { KvTask } from "../src/inference/protocol.js";
import type { RequestEnvelope } from "../src/validate/schema.js";
import { choiceQuestions, fmtMs, machineNote, ratio, stateOf, write } from "./common.js";

export interface PassMemoryOptions {
  cases: string[];
  /** ASSAY_PASS_ATTENTION_MB of the bounded side. */
  mb: number;
}

interface Case {
  what: string;
  envelope(pipeline: EnginePipeline): RequestEnvelope;
}

/** The largest dev code search row (by preview text), its items as noul questions; `grow`: its first file's preview repeated to that many characters. */
function codeSearch(model: string, grow?: number): (p: EnginePipeline) => RequestEnvelope {
  return () => {
    const rows = fs
      .readFileSync(path.join(ROOT, "..", "shared", "data", "code_search.jsonl"), "utf8")
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as { query: string; items: { id: string; kind: string; filePreview?: { text: string } }[] });
    const size = (r: (typeof rows)[number]) => r.items.reduce((s, i) => s + (i.filePreview?.text.length ?? 0), 0);
    const row = rows.reduce((a, b) => (size(b) > size(a) ? b : a));
    const items = row.items.map((i) => ({ ...i }));
    if (grow) {
      const file = items.find((i) => i.filePreview)!;
      let text = "";
      while (text.length < grow) text += file.filePreview!.text + "\n";
      file.filePreview = { text: text.slice(0, grow) };
    }
    const questions = Object.fromEntries(items.map((i) => [`q${i.id.slice(1)}`, { type: "noul" as const }]));
    return { model, state: { query: row.query, items }, questions } as RequestEnvelope;
  };
}

export const PASS_MEMORY_CASES: Record<string, Case> = {
  "general-4k": {
    what: "`judge-latest` (1.5B): a 4,000-token state, 12 choice questions of 8 options (one pass: the state with every block)",
    envelope: (p) => ({ model: "judge-latest", state: stateOf(p.build("judge-latest"), 4000), questions: choiceQuestions(12, 8) }) as RequestEnvelope,
  },
  "long-6k": {
    what: "`vendor/judge-9B` (0.5B): a 6,000-token state, 16 choice questions of 8 options (a long state: chunks, then branch passes against it)",
    envelope: (p) => ({ model: "vendor/judge-9B", state: stateOf(p.build("vendor/judge-9B"), 6000), questions: choiceQuestions(16, 8) }) as RequestEnvelope,
  },
  "many-512": {
    what: "`vendor/judge-9B` (0.5B): issue 16's large request, 64 choice questions of 8 options on a 512-token state (over the pass limit: the blocks in several passes against the cached state)",
    envelope: (p) => ({ model: "vendor/judge-9B", state: stateOf(p.build("vendor/judge-9B"), 512), questions: choiceQuestions(64, 8) }) as RequestEnvelope,
  },
  "codesearch-dev": {
    what: "`judge-codegrep-lite` (0.5B): the largest dev code search row, 30 items",
    envelope: codeSearch("judge-codegrep-lite"),
  },
  "codesearch-wide": {
    what: "`judge-codegrep-lite` (0.5B): that row with one file's preview at 24,000 characters (one block wider than the bound)",
    envelope: codeSearch("judge-codegrep-lite", 24_000),
  },
};

interface SideResult {
  ms: number;
  baseMb: number;
  peakMb: number;
  passes: number;
  maxPairs: number;
  inputTokens: number;
  /** Per question: the answer's probabilities (noul: [p]; choice: by key). */
  answers: Record<string, number[]>;
}

/** One case on one side, in this process (the child): see the file's comment. */
export async function passMemorySide(name: string): Promise<void> {
  const c = PASS_MEMORY_CASES[name];
  if (!c) throw new Error(`unknown case ${name}`);
  const pipeline = await EnginePipeline.create(loadConfig({ ...process.env, LOG_LEVEL: "silent" }));
  let passes = 0;
  let maxPairs = 0;
  const infer = pipeline.pool.infer.bind(pipeline.pool);
  // Counts what each pass holds: the state's scores and the padded blocks' against every key.
  pipeline.pool.infer = (model: string, p: PackedTensors, signal?: AbortSignal, kv?: KvTask) => {
    const keys = (kv?.past?.tokens ?? 0) + p.inputIds.length - p.slotOf.length;
    const state = p.inputIds.length - p.slotOf.length;
    maxPairs = Math.max(maxPairs, state * keys, p.branches * p.branchWidth * (keys + p.branchWidth));
    passes++;
    return infer(model, p, signal, kv);
  };
  try {
    const env = c.envelope(pipeline);
    const rss = () => process.memoryUsage().rss / 2 ** 20;
    const baseMb = rss();
    let peakMb = baseMb;
    const timer = setInterval(() => (peakMb = Math.max(peakMb, rss())), 20);
    const t = performance.now();
    const res = await pipeline.run(env, { requestId: "pass-memory", orgId: "bench", timings: new Timings() });
    const ms = performance.now() - t;
    clearInterval(timer);
    peakMb = Math.max(peakMb, rss());
    const answers = Object.fromEntries(
      Object.entries(res.answers).map(([k, a]) => [k, a.type === "noul" ? [a.noul] : "probabilities" in a ? Object.values(a.probabilities as Record<string, number>) : []]),
    );
    const out: SideResult = { ms, baseMb, peakMb, passes, maxPairs, inputTokens: res.usage.input_tokens, answers };
    console.log(JSON.stringify(out));
  } finally {
    await pipeline.close();
  }
}

function runSide(name: string, mb: number): Promise<SideResult> {
  const cli = path.join(path.dirname(fileURLToPath(import.meta.url)), "cli.js");
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [cli, "pass-memory-side", name], { env: { ...process.env, ASSAY_PASS_ATTENTION_MB: String(mb) }, stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    child.on("error", reject);
    child.on("exit", (code, signal) => {
      const line = out.trim().split("\n").at(-1) ?? "";
      if (code === 0 && line.startsWith("{")) resolve(JSON.parse(line) as SideResult);
      else reject(new Error(`case ${name} at ${mb} MB: the child ended with ${signal ?? code} (a kill by the OOM killer shows as SIGKILL)`));
    });
  });
}

export async function passMemoryScenario(o: PassMemoryOptions, command: string): Promise<void> {
  const machine = machineNote();
  const rows: { name: string; baseline: SideResult; bounded: SideResult; maxAbsDp: number }[] = [];
  for (const [n, name] of o.cases.entries()) {
    // Alternate which side goes first: a machine that slows over the run weighs on both.
    const order = n % 2 === 0 ? [0, o.mb] : [o.mb, 0];
    const got = new Map<number, SideResult>();
    for (const mb of order) {
      console.error(`  ${name}: ASSAY_PASS_ATTENTION_MB=${mb} ...`);
      got.set(mb, await runSide(name, mb));
    }
    const baseline = got.get(0)!;
    const bounded = got.get(o.mb)!;
    let maxAbsDp = 0;
    for (const [k, ps] of Object.entries(baseline.answers)) ps.forEach((x, i) => (maxAbsDp = Math.max(maxAbsDp, Math.abs(x - bounded.answers[k]![i]!))));
    rows.push({ name, baseline, bounded, maxAbsDp });
    console.error(`  ${name}: ${fmtMs(baseline.ms)} / ${fmtMs(bounded.ms)} ms, +${Math.round(baseline.peakMb - baseline.baseMb)} / +${Math.round(bounded.peakMb - bounded.baseMb)} MB`);
  }
  const mb = (s: SideResult) => Math.round(s.peakMb - s.baseMb).toLocaleString("en-US");
  const pairs = (s: SideResult) => `${(s.maxPairs / 1e6).toFixed(1)}M`;
  const md = [
    `## pass-memory (${new Date().toISOString()})`,
    "",
    `\`${command}\`; bounded side ASSAY_PASS_ATTENTION_MB=${o.mb}, baseline 0 (passes bounded by ASSAY_MAX_PACKED_TOKENS alone); each side one request in a fresh process; ${machine.cpu}, ${os.totalmem() >> 30} GB; load ${machine.loadStart} at the start, ${os.loadavg()[0]!.toFixed(2)} at the end`,
    "",
    "| case | passes (baseline / bounded) | largest pass, pairs | ms (baseline / bounded) | baseline / bounded | peak memory above the loaded pipeline, MB | max \\|Δp\\| |",
    "|---|---:|---:|---:|---:|---:|---:|",
    ...rows.map(
      (r) =>
        `| ${r.name} | ${r.baseline.passes} / ${r.bounded.passes} | ${pairs(r.baseline)} / ${pairs(r.bounded)} | ${fmtMs(r.baseline.ms)} / ${fmtMs(r.bounded.ms)} | ${ratio(r.baseline.ms, r.bounded.ms)} | ${mb(r.baseline)} / ${mb(r.bounded)} | ${r.maxAbsDp.toExponential(1)} |`,
    ),
    "",
    ...rows.map((r) => `- ${r.name}: ${PASS_MEMORY_CASES[r.name]!.what}; ${r.bounded.inputTokens.toLocaleString("en-US")} input tokens`),
    "",
  ].join("\n");
  write("pass-memory", { machine, options: o, rows }, md);
}
