/**
 * The code search readings study: every lever of bench/codesearch-fit.ts on
 * the dev rows, leave-one-repository-out, for the model-free reading and for
 * each name whose raw scores are cached (bench/codesearch.ts --collect writes
 * them). Seconds, no model:
 *
 *   npx tsc -p tsconfig.json && node dist/bench/codesearch-study.js \
 *     --raw judge-codegrep-lite=.cache/codesearch/raw-judge-codegrep-lite.jsonl \
 *     --raw judge-codegrep-max=.cache/codesearch/raw-judge-codegrep-max.jsonl
 */
import fs from "node:fs";
import path from "node:path";
import { Command } from "commander";
import { ROOT } from "../src/config/index.js";
import { LEVERS, fitLever, heldOutNoul, setPerKind, setThresholdMode, type ThresholdMode, readRaw, readRows, summarize, type HeldOut, type Lever, type ScoredRow, type StudyRow } from "./codesearch-fit.js";

const LITE = "judge-codegrep-lite";
const BASE = "judge-codegrep";
const MAX = "judge-codegrep-max";
const SMALL = "qwen2.5-coder-0.5b";
const LARGE = "qwen2.5-coder-1.5b";
const calibrationFile = (build: string) => path.join(ROOT, "models", "calibration", `${build}.json`);

const f3 = (x: number) => x.toFixed(3);

export function leverTable(rows: readonly ScoredRow[], levers: readonly Lever[], target: number, l2: number): { md: string[]; figures: Record<string, HeldOut> } {
  const md = [
    "| reading | recall at 0.5 [95% interval] | file recall | kept at 0.5 (files / folders) | AUROC all | AUROC within | kept for 95% recall (one cut / per request) |",
    "|---|---:|---:|---:|---:|---:|---:|",
  ];
  const figures: Record<string, HeldOut> = {};
  for (const lever of levers) {
    const h = summarize(rows, heldOutNoul(rows, lever, target, l2));
    figures[lever.name] = h;
    md.push(
      `| ${lever.name} | ${f3(h.recall)} [${f3(h.recallLo)}, ${f3(h.recallHi)}] | ${f3(h.recallFiles)} | ${f3(h.kept)} (${f3(h.keptFiles)} / ${f3(h.keptFolders)}) | ${f3(h.aurocAll)} | ${f3(h.aurocWithin)} | ${f3(h.keptAt95)} / ${f3(h.keptAt95PerRequest)} |`,
    );
  }
  return { md, figures };
}

export const withRaw = (rows: readonly StudyRow[], raw: Map<string, number[]> | null): ScoredRow[] =>
  rows.flatMap((r) => {
    if (!raw) return [{ ...r, raw: r.items.map(() => 0.5) }];
    const s = raw.get(r.id);
    return s ? [{ ...r, raw: s }] : [];
  });

async function main() {
  const program = new Command()
    .option("--data <file>", "dev rows", path.join(ROOT, "..", "shared", "data", "code_search.jsonl"))
    .option("--raw <name=file...>", "cached raw scores of a name", [])
    .option("--target <x>", "recall target of the threshold", "0.95")
    .option("--l2 <x>", "L2 penalty of the maps", "1")
    .option("--levers <list>", "comma-separated lever indices (default: all)")
    .option("--threshold <mode>", "recall threshold from nested leave-one-repository-out probabilities (nested) or the maps' own (insample)", "insample")
    .option("--per-kind", "a recall threshold for files and one for folders", false)
    .option("--band <lo:hi>", "small-build raw scores that escalate, for the base name (default: the shipped band)")
    .option("--ship <name=lever...>", "fit lever (an index) on all rows for a name and write it to its build's calibration file", []);
  program.parse();
  const o = program.opts<{ data: string; raw: string[]; target: string; l2: string; levers?: string; band?: string; ship: string[]; threshold: ThresholdMode; perKind: boolean }>();
  setThresholdMode(o.threshold);
  setPerKind(o.perKind);
  const rows = readRows(o.data);
  const target = Number(o.target);
  const l2 = Number(o.l2);
  const picked = o.levers ? o.levers.split(",").map((i) => LEVERS[Number(i)]!) : LEVERS;
  const byRepo = new Map<string, number>();
  for (const r of rows) byRepo.set(r.repo, (byRepo.get(r.repo) ?? 0) + 1);
  console.log(`rows ${rows.length}; repositories ${[...byRepo].map(([k, v]) => `${k} ${v}`).join(", ")}; target ${target}, l2 ${l2}, threshold ${o.threshold}${o.perKind ? " per kind" : ""}\n`);
  console.log("### No model (raw fixed at 0.5): lexical and structural evidence alone\n");
  console.log(leverTable(withRaw(rows, null), picked.filter((l) => !l.plain && !l.file.includes("raw")), target, l2).md.join("\n"));
  const byName = new Map<string, ScoredRow[]>();
  for (const spec of o.raw) {
    const [name, file] = spec.split("=") as [string, string];
    byName.set(name, withRaw(rows, readRaw(path.resolve(file))));
  }
  const lite = byName.get(LITE);
  const max = byName.get(MAX);
  if (lite && max) {
    const calSmall = JSON.parse(fs.readFileSync(calibrationFile(SMALL), "utf8")) as { codesearch?: { band?: { lo: number; hi: number } } };
    const [lo, hi] = o.band ? o.band.split(":").map(Number) : [calSmall.codesearch?.band?.lo ?? 0.2, calSmall.codesearch?.band?.hi ?? 0.8];
    const maxBy = new Map(max.map((r) => [r.id, r.raw]));
    const base = lite.flatMap((r) => {
      const m = maxBy.get(r.id);
      return m ? [{ ...r, large: r.raw.map((x, i) => (x >= lo! && x <= hi! ? m[i]! : Number.NaN)) }] : [];
    });
    const share = base.reduce((s, r) => s + r.large!.filter(Number.isFinite).length, 0) / Math.max(1, base.length * 30);
    console.error(`${BASE}: ${base.length} rows, band [${lo}, ${hi}], ${share.toFixed(3)} of items escalated`);
    byName.set(BASE, base);
    // The same escalation with the large build's score in place of the small one's (one raw per item, as served in details.raw).
    byName.set(`${BASE} (mixed raw)`, base.map(({ large, ...r }) => ({ ...r, raw: r.raw.map((x, i) => (Number.isFinite(large![i]!) ? large![i]! : x)) })));
  }
  for (const [name, scored] of byName) {
    console.log(`\n### ${name} (${scored.length} rows with raw scores)\n`);
    console.log(leverTable(scored, picked, target, l2).md.join("\n"));
  }
  for (const spec of o.ship) {
    const [name, idx] = spec.split("=") as [string, string];
    const scored = byName.get(name);
    const lever = LEVERS[Number(idx)];
    if (!scored || !lever || lever.plain) throw new Error(`--ship ${spec}: no raw scores for ${name} or not a reading lever`);
    const { plainThreshold: _, ...reading } = fitLever(scored, lever, target, l2);
    const build = name === MAX ? LARGE : SMALL;
    const file = calibrationFile(build);
    const cal = JSON.parse(fs.readFileSync(file, "utf8")) as { codesearch?: Record<string, unknown> };
    const key = name === BASE ? "reading_escalated" : "reading";
    cal.codesearch = { ...(cal.codesearch ?? {}), [key]: { ...reading, lever: lever.name, data: `code_search.jsonl (${scored.length} rows), l2 ${l2}` } };
    fs.writeFileSync(file, JSON.stringify(cal, null, 2) + "\n");
    console.error(`wrote ${key} (${lever.name}) for ${name} to ${path.relative(ROOT, file)}: threshold ${reading.recall.threshold.toFixed(4)}`);
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}
