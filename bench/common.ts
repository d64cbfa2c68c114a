/**
 * Helpers shared by the bench scenarios: timing, percentiles, synthetic
 * states and questions of a given size, machine notes, and writing results
 * (JSON + Markdown + SVG) under bench/out/.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { ROOT } from "../src/config/index.js";
import type { LoadedBuild } from "../src/engine/index.js";
import type { Question } from "../src/validate/schema.js";

export const OUT = path.join(ROOT, "bench", "out");

export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

/** Percentile by linear interpolation between closest ranks (p in [0, 100]). */
export function percentile(xs: readonly number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const rank = (p / 100) * (s.length - 1);
  const lo = Math.floor(rank);
  const hi = Math.ceil(rank);
  return s[lo]! + (s[hi]! - s[lo]!) * (rank - lo);
}

export async function timeIt(fn: () => Promise<unknown>, reps: number): Promise<number> {
  return median(await timeAll(fn, reps));
}

/** Every repetition's milliseconds, sequentially. */
export async function timeAll(fn: () => Promise<unknown>, reps: number): Promise<number[]> {
  const xs: number[] = [];
  for (let i = 0; i < reps; i++) {
    const t = performance.now();
    await fn();
    xs.push(performance.now() - t);
  }
  return xs;
}

const SENTENCES = [
  "The quarterly report shows revenue grew in every region except the north, where a supplier dispute delayed shipments.",
  "Customer support resolved most tickets within a day, although billing questions took longer than planned.",
  "The engineering team replaced the legacy queue with a managed service and cut incident counts by half.",
  "Marketing spent less than budgeted because two trade shows were cancelled and moved online.",
  "A new office opened in Lisbon with forty staff, mostly in sales and customer success.",
  "Auditors found no material weaknesses, but asked for clearer approval records on vendor payments.",
];

/** Deterministic English-like filler of exactly `tokens` tokens for this tokenizer (decoded back to text). */
export function stateOf(lb: LoadedBuild, tokens: number): string {
  let text = "";
  let i = 0;
  while (lb.tokenizer.encode(text).length < tokens) text += (text ? " " : "") + SENTENCES[i++ % SENTENCES.length];
  const ids = lb.tokenizer.encode(text).slice(0, tokens);
  return lb.tokenizer.decode(ids);
}

const SUBJECTS = ["revenue", "support", "engineering", "marketing", "the Lisbon office", "the audit", "shipments", "billing"];

/** The state-sharing scenario's questions: noul and 3-option choice, alternating. */
export function questionsOf(n: number): Record<string, Question> {
  const qs: Record<string, Question> = {};
  for (let i = 0; i < n; i++) {
    const s = SUBJECTS[i % SUBJECTS.length]!;
    qs[`q${i}`] =
      i % 2 === 0
        ? { type: "noul", instructions: `The report says ${s} improved during quarter ${1 + (i % 4)}.` }
        : { type: "choice", instructions: `How does the report describe ${s}?`, criteria: { good: null, mixed: null, bad: null } };
  }
  return qs;
}

const OPTION_TEXTS = ["improved", "got worse", "stayed the same", "is not mentioned", "was delayed", "was cancelled", "doubled", "halved"];

/**
 * `n` choice questions of `options` options each, keyed A, B, C… (one token
 * each, so every option is read in the question's own pass, no extra tokens).
 */
export function choiceQuestions(n: number, options: number): Record<string, Question> {
  const qs: Record<string, Question> = {};
  for (let i = 0; i < n; i++) {
    const criteria: Record<string, string> = {};
    for (let o = 0; o < options; o++) criteria[String.fromCharCode(65 + o)] = OPTION_TEXTS[(o + i) % OPTION_TEXTS.length]!;
    qs[`q${i}`] = {
      type: "choice",
      instructions: `What does the report say about ${SUBJECTS[i % SUBJECTS.length]} in part ${1 + Math.floor(i / SUBJECTS.length)}?`,
      criteria,
    };
  }
  return qs;
}

export interface MachineNote {
  cpu: string;
  cores: number;
  /** 1-minute load average at the start and the end of the run. */
  loadStart: number;
  loadEnd?: number;
  node: string;
  startedAt: string;
}

export function machineNote(): MachineNote {
  return {
    cpu: os.cpus()[0]?.model ?? "unknown",
    cores: os.availableParallelism(),
    loadStart: +os.loadavg()[0]!.toFixed(2),
    node: process.version,
    startedAt: new Date().toISOString(),
  };
}

export function stamp(): string {
  return new Date().toISOString().replace(/[:.]/g, "-");
}

/** Write `<name>-<stamp>.json` and `.md` (and `.svg` when given) under bench/out/; print the Markdown. */
export function write(name: string, result: unknown, md: string, svg?: string): string {
  fs.mkdirSync(OUT, { recursive: true });
  const base = path.join(OUT, `${name}-${stamp()}`);
  fs.writeFileSync(`${base}.json`, JSON.stringify(result, null, 2));
  fs.writeFileSync(`${base}.md`, md);
  if (svg) fs.writeFileSync(`${base}.svg`, svg);
  console.log(md);
  console.log(`\nwritten to ${base}.{json,md${svg ? ",svg" : ""}}`);
  return base;
}

/** Round for tables: ms to whole numbers below 10 s, one decimal of s above. */
export function fmtMs(ms: number | null | undefined): string {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return "–";
  return ms < 100 ? ms.toFixed(1) : Math.round(ms).toLocaleString("en-US");
}

export function ratio(a: number | null | undefined, b: number | null | undefined, digits = 2): number | null {
  if (a === null || a === undefined || b === null || b === undefined || !Number.isFinite(a) || !Number.isFinite(b) || b === 0) return null;
  return +(a / b).toFixed(digits);
}
