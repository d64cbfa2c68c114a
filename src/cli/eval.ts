/**
 * `assay eval --model NAME --data FILE... [--limit N] [--out DIR] [--no-flip]`
 *
 * Runs labelled dev sets through the engine in-process (the same
 * EnginePipeline the HTTP route uses), prints a Markdown table of metrics on
 * stdout and writes report.md, results.json and reliability diagrams to the
 * output folder. Progress and notes go to stderr. See src/eval/README.md.
 */
import path from "node:path";
import type { Command } from "commander";
import { loadConfig, ROOT } from "../config/index.js";
import { EnginePipeline } from "../pipeline/index.js";
import { parseSplit, readDataset, UnsupportedDataset, type Dataset, type Split } from "../eval/datasets.js";
import { checkCalibration, readCalibrationFile, type Manifest } from "../models/manifest.js";
import { calibrationForMode } from "../probability/index.js";
import { debiasCostTable, measureDebiasCost, type DebiasCost } from "../eval/cost.js";
import type { Debias } from "../prompt/index.js";
import { runDatasets } from "../eval/runner.js";
import { summarize } from "../eval/summary.js";
import { summaryTable, writeReport, type EvalReport, type SkippedFile } from "../eval/report.js";
import type { CliIO } from "./keys.js";
import { defined, positiveInt } from "./options.js";
import { progressBar } from "./progress.js";

export interface EvalCliOptions {
  model: string;
  data: string[];
  limit?: number;
  split?: Split;
  out?: string;
  flip: boolean;
  concurrency: number;
  /** Override ASSAY_DEBIAS / ASSAY_DEBIAS_MAX_SHIFTS for this run. */
  debias?: "off" | "cyclic";
  shifts?: number;
  /** "none" for identity, or a calibration file (refused unless fitted on this build); default: what the build loads. */
  calibration?: string;
}

/** `bench/out/eval/<model>-<UTC timestamp>` under the repository root. */
export function defaultOutDir(model: string, now = new Date()): string {
  const stamp = now.toISOString().replace(/[-:]/g, "").replace(/\.\d+Z$/, "Z");
  return path.join(ROOT, "bench", "out", "eval", `${model.replace(/[^A-Za-z0-9._-]+/g, "_")}-${stamp}`);
}

export async function evalCommand(opts: EvalCliOptions, io: CliIO): Promise<EvalReport> {
  // Read every file first: a bad file fails before the model loads.
  const datasets: Dataset[] = [];
  const skipped: SkippedFile[] = [];
  for (const file of opts.data) {
    try {
      const ds = readDataset(file, opts.limit, opts.split);
      let name = ds.name;
      for (let i = 2; datasets.some((d) => d.name === name); i++) name = `${ds.name}-${i}`;
      datasets.push({ ...ds, name });
    } catch (e) {
      if (!(e instanceof UnsupportedDataset)) throw e;
      skipped.push({ file, reason: e.message.slice(file.length + 2) });
      io.stderr(`assay eval: skipping ${e.message}\n`);
    }
  }
  if (datasets.length === 0) throw new Error("no dataset to evaluate");

  const config = loadConfig(io.env, {
    ...(opts.debias !== undefined ? { debias: opts.debias } : {}),
    ...(opts.shifts !== undefined ? { debiasMaxShifts: opts.shifts } : {}),
  });
  // `--calibration`: the build is loaded raw or under that file instead of its shipped fit.
  const file = opts.calibration;
  const fit =
    file === undefined ? undefined : (_: unknown, manifest: Manifest) => (file === "none" ? null : checkCalibration(readCalibrationFile(file), manifest, file));
  const pipeline = await EnginePipeline.create(config, (m) => io.stderr(`${m}\n`), fit ? { calibration: { model: opts.model, fit } } : {});
  try {
    if (!pipeline.registry.has(opts.model)) {
      throw new Error(`unknown model "${opts.model}"; available models: ${pipeline.registry.names().join(", ")}`);
    }
    const resolved = pipeline.registry.resolve(opts.model);
    if (resolved.family !== "general") {
      throw new Error(`model "${opts.model}" is a ${resolved.family} model; eval asks noul/choice/score questions of a general model`);
    }
    const lb = pipeline.build(opts.model);
    // What the pipeline applies under this run's debias mode.
    const calibration = calibrationForMode(lb.build.manifest.calibration, config.debias);
    const t0 = performance.now();
    const createdAt = new Date();
    const runs = await runDatasets(datasets, {
      pipeline,
      model: opts.model,
      calibration,
      concurrency: opts.concurrency,
      flip: opts.flip,
      progress: progressBar(io, "eval"),
    });
    const elapsedMs = performance.now() - t0;
    const summaries = runs.map((r) => summarize(r));
    const report: EvalReport = {
      model: opts.model,
      resolved: { target: resolved.target, build: lb.build.manifest.build_hash },
      calibration: calibration
        ? `temperatures ${JSON.stringify(calibration.temperatures)}, Platt ${JSON.stringify(calibration.platt ?? {})}, ` +
          `top-label ${JSON.stringify(calibration.top_label ?? {})} ` +
          `(fitted ${calibration.fitted_at} under debias ${calibration.debias ?? "unrecorded"})`
        : "none (identity)",
      debias: config.debias === "off" ? "off" : `cyclic, at most ${config.debiasMaxShifts} presentations per choice question (score: 2)`,
      createdAt: createdAt.toISOString(),
      options: {
        limit: opts.limit ?? null,
        split: opts.split ? `${opts.split.part}/${opts.split.of}` : null,
        flip: opts.flip,
        concurrency: opts.concurrency,
        data: opts.data,
      },
      summaries,
      runs,
      skipped,
      elapsedMs,
    };
    for (const s of summaries) {
      if (s.errors > 0) io.stderr(`assay eval: ${s.dataset}: ${s.errors} of ${s.items} items got no answer (see report.md)\n`);
    }
    io.stdout(summaryTable(summaries));
    const dir = opts.out ?? defaultOutDir(opts.model, createdAt);
    writeReport(dir, report);
    io.stderr(`wrote ${path.join(dir, "report.md")}, results.json and ${summaries.length} reliability diagram(s)\n`);
    return report;
  } finally {
    await pipeline.close();
  }
}

/** `--debias-cost N`: engine time and tokens with and without debiasing, on N requests per file. */
export async function debiasCostCommand(opts: EvalCliOptions & { requests: number }, io: CliIO): Promise<DebiasCost[]> {
  const datasets = opts.data.map((f) => readDataset(f, opts.limit, opts.split));
  const config = loadConfig(io.env);
  const pipeline = await EnginePipeline.create(config, (m) => io.stderr(`${m}\n`));
  try {
    const lb = pipeline.build(opts.model);
    const debias: Debias = { mode: "cyclic", maxShifts: opts.shifts ?? config.debiasMaxShifts };
    const rows = await measureDebiasCost(pipeline, lb, datasets, debias, opts.requests);
    io.stdout(debiasCostTable(rows, debias));
    return rows;
  } finally {
    await pipeline.close();
  }
}

export function registerEvalCommand(program: Command, io: CliIO): void {
  program
    .command("eval")
    .description("evaluate a model on labelled JSONL dev sets (noul, choice, score, fact check)")
    .option("--model <name>", "public model name", "judge-latest")
    .requiredOption("--data <files...>", "dataset files (JSONL); the format is detected from the row fields")
    .option("--limit <n>", "at most N rows per file, evenly spaced over the file", positiveInt("--limit"))
    .option("--split <part/parts>", "only rows i with i mod PARTS = PART, before --limit (e.g. 1/2 for the rows `calibrate --split 0/2` left out)", parseSplit)
    .option("--debias <mode>", "off | cyclic (default: ASSAY_DEBIAS)")
    .option("--shifts <n>", "presentations per choice question at most (default: ASSAY_DEBIAS_MAX_SHIFTS)", positiveInt("--shifts"))
    .option("--calibration <file|none>", "calibration to apply: none (the raw reading: no maps, no content-free prior, no worked examples), or a fit file for this build (default: what the build loads)")
    .option("--debias-cost <n>", "instead of evaluating: time N requests per file with and without debiasing, alternately", positiveInt("--debias-cost"))
    .option("--out <dir>", "output folder (default bench/out/eval/<model>-<timestamp>/)")
    .option("--no-flip", "skip the reversed-option-order pass (flip rate) for choice and score")
    .option("--concurrency <n>", "requests in flight at once", positiveInt("--concurrency"), 2)
    .action(async (o: {
      model: string;
      data: string[];
      limit?: number;
      split?: Split;
      out?: string;
      flip: boolean;
      concurrency: number;
      debias?: string;
      shifts?: number;
      calibration?: string;
      debiasCost?: number;
    }) => {
      if (o.debiasCost !== undefined) {
        await debiasCostCommand(
          {
            model: o.model,
            data: o.data,
            flip: false,
            concurrency: 1,
            requests: o.debiasCost,
            ...defined({ limit: o.limit, split: o.split, shifts: o.shifts }),
          },
          io,
        );
        return;
      }
      if (o.debias !== undefined && o.debias !== "off" && o.debias !== "cyclic") throw new Error(`--debias must be off or cyclic, got "${o.debias}"`);
      await evalCommand(
        {
          model: o.model,
          data: o.data,
          flip: o.flip,
          concurrency: o.concurrency,
          ...defined({ limit: o.limit, split: o.split, out: o.out, debias: o.debias, shifts: o.shifts, calibration: o.calibration }),
        },
        io,
      );
    });
}
