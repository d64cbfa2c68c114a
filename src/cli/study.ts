/**
 * `assay study --model NAME --data FILE... [--limit N] [--before] [--top N] [--variants a,b]`
 *
 * The readout study (src/eval/study.ts): reads every dev row many ways in
 * one pass, caches the reads under .cache/study/<build>/, and prints per set
 * and across sets of a type: accuracy, macro-F1, AUROC / MAE and ECE raw,
 * 5-fold and leave-one-dataset-out, for every variant × label mode × prior.
 */
import path from "node:path";
import { type Command } from "commander";
import cliProgress from "cli-progress";
import { loadConfig, ROOT } from "../config/index.js";
import { passLimit } from "../engine/index.js";
import { EnginePipeline } from "../pipeline/index.js";
import { readDataset } from "../eval/datasets.js";
import { collectStudy, type StudyRow } from "../eval/study.js";
import { fitMap, kfold, metrics, probs, readoutName, readouts, score, type Metrics, type Readout } from "../eval/study-report.js";
import type { CliIO } from "./keys.js";
import { stderrStream } from "./progress.js";

/** Sets read as one question family: leave-one-dataset-out fits on the others of its group. */
export function groupOf(name: string): string {
  if (name.startsWith("factcheck_") || name.startsWith("noul_")) return "noul";
  if (name.startsWith("choice_")) return "choice";
  if (name.startsWith("score_")) return "score";
  return name;
}

const f3 = (x: number | null | undefined) => (x === null || x === undefined ? "–" : x.toFixed(3));

interface Cell {
  raw: Metrics;
  kfold: Metrics;
  lodo: Metrics | null;
  tokens: number;
}

export function studyReport(sets: { name: string; rows: StudyRow[] }[], top: number): string {
  const out: string[] = [];
  const cells = new Map<string, Map<string, Cell>>();
  for (const set of sets) {
    const m = new Map<string, Cell>();
    const others = sets.filter((s) => s.name !== set.name && groupOf(s.name) === groupOf(set.name));
    for (const r of readouts(set.rows)) {
      const s = score(set.rows, r);
      if (!s) continue;
      let lodo: Metrics | null = null;
      const ordinal = groupOf(set.name) === "score";
      const train = others.map((o) => score(o.rows, r)).filter((x) => x !== null);
      if (train.length > 0 && train.length === others.length) {
        const pooled = { scores: train.flatMap((t) => t.scores), gold: train.flatMap((t) => t.gold) };
        lodo = metrics(probs(s, fitMap(pooled)), s.gold, ordinal);
      }
      m.set(readoutName(r), { raw: metrics(probs(s, null), s.gold, ordinal), kfold: metrics(kfold(s), s.gold, ordinal), lodo, tokens: 0 });
    }
    cells.set(set.name, m);
    const rows = [...m].sort(([, a], [, b]) => b.kfold.bacc - a.kfold.bacc);
    out.push(`\n### ${set.name} (${set.rows.length} rows, ${(mean(set.rows.map((r) => r.ms)) / 1000).toFixed(2)} s per row for all variants)\n`);
    out.push("| readout | bacc | acc | macro-F1 | AUROC | MAE | ECE raw | ECE 5-fold | ECE LODO | bacc LODO |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (const [name, c] of rows.slice(0, top)) {
      out.push(`| ${name} | ${f3(c.kfold.bacc)} | ${f3(c.kfold.accuracy)} | ${f3(c.kfold.macroF1)} | ${f3(c.kfold.auroc)} | ${f3(c.kfold.mae)} | ${f3(c.raw.ece)} | ${f3(c.kfold.ece)} | ${f3(c.lodo?.ece)} | ${f3(c.lodo?.bacc)} |`);
    }
  }
  // Across sets: a readout's mean 5-fold accuracy over the sets of a group that all have it.
  for (const group of [...new Set(sets.map((s) => groupOf(s.name)))]) {
    const names = sets.filter((s) => groupOf(s.name) === group).map((s) => s.name);
    const all = [...(cells.get(names[0]!)?.keys() ?? [])].filter((r) => names.every((n) => cells.get(n)?.has(r)));
    const ranked = all
      .map((r) => ({ r, acc: mean(names.map((n) => cells.get(n)!.get(r)!.kfold.bacc)), per: names.map((n) => cells.get(n)!.get(r)!) }))
      .sort((a, b) => b.acc - a.acc);
    out.push(`\n### across ${group}: ${names.join(", ")}\n`);
    out.push(`| readout | mean bacc | ${names.map((n) => `${n} bacc / ECE k-fold / ECE LODO`).join(" | ")} |`, `|---|---:|${names.map(() => "---:").join("|")}|`);
    for (const x of ranked.slice(0, top)) {
      out.push(`| ${x.r} | ${f3(x.acc)} | ${x.per.map((c) => `${f3(c.kfold.bacc)} / ${f3(c.kfold.ece)} / ${f3(c.lodo?.ece)}`).join(" | ")} |`);
    }
  }
  return `${out.join("\n")}\n`;
}

function mean(xs: readonly number[]): number {
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0;
}

export function registerStudyCommand(program: Command, io: CliIO): void {
  program
    .command("study")
    .description("readout study: many ways of asking and reading each dev question, compared (cached under .cache/study)")
    .option("--model <name>", "public model name whose build is studied", "judge-latest")
    .requiredOption("--data <files...>", "dataset files (JSONL)")
    .option("--limit <n>", "at most N rows per file, evenly spaced", (v) => Number(v))
    .option("--before", "also read the question placed before the state (one more pass per row)", false)
    .option("--report-only", "do not run the model: report what is cached", false)
    .option("--top <n>", "rows per table", (v) => Number(v), 12)
    .option("--variants <names>", "read only these variants (comma-separated, e.g. question_ctx,yn_num): a cache file of their own", (v) => v.split(",").map((x) => x.trim()).filter(Boolean))
    .action(async (o: { model: string; data: string[]; limit?: number; before: boolean; reportOnly: boolean; top: number; variants?: string[] }) => {
      const config = loadConfig(io.env);
      const datasets = o.data.map((f) => readDataset(f, o.limit));
      const pipeline = await EnginePipeline.create(config, (m) => io.stderr(`${m}\n`));
      try {
        const lb = pipeline.build(o.model);
        await pipeline.lifecycle.load(pipeline.registry.resolve(o.model).build);
        const dir = path.join(ROOT, ".cache", "study", lb.build.manifest.build_hash);
        const bar = new cliProgress.SingleBar({ stream: stderrStream(io), format: "study |{bar}| {value}/{total} rows | {duration_formatted}", noTTYOutput: true, notTTYSchedule: 15_000 }, cliProgress.Presets.shades_classic);
        bar.start(datasets.reduce((s, d) => s + d.items.length, 0), 0);
        const sets: { name: string; rows: StudyRow[] }[] = [];
        for (const ds of datasets) {
          // A subset of variants gets a file of its own: its rows must not pass for full rows on a later run.
          const subset = o.variants ? `.${[...o.variants].sort().join("+")}` : "";
          const file = path.join(dir, `${ds.name}${o.before ? "" : ".after"}${subset}.jsonl`);
          const rows = await collectStudy(ds, file, {
            lb,
            engine: pipeline.engine,
            maxTokens: passLimit(lb, config.maxPackedTokens),
            before: o.before,
            ...(o.variants ? { variants: new Set(o.variants) } : {}),
            cachedOnly: o.reportOnly,
            onRow: () => bar.increment(),
          });
          const want = new Set(ds.items.map((i) => i.id));
          sets.push({ name: ds.name, rows: o.reportOnly ? rows : rows.filter((r) => want.has(r.id)) });
        }
        bar.stop();
        io.stdout(`## Readout study: ${o.model} → build ${lb.build.manifest.build_hash}\n${studyReport(sets, o.top)}`);
      } finally {
        await pipeline.close();
      }
    });
}

export type { Readout };
