/**
 * `assay batch --in requests.jsonl --out answers.jsonl [--model NAME] [--concurrency N]
 *              [--url URL [--key KEY]] [--no-group]`
 *
 * Scores a JSONL file of spec request bodies: in this process through the
 * same EnginePipeline.run the HTTP route uses (no server), or against a
 * running server with `--url`. One output line per input line (formats in
 * src/batch/records.ts), resumable, with a progress bar on stderr and a
 * summary on stdout. See src/batch/README.md.
 */
import fs from "node:fs";
import path from "node:path";
import { CommanderError, type Command } from "commander";
import cliProgress from "cli-progress";
import { loadConfig } from "../config/index.js";
import { ModelRegistry } from "../models/registry.js";
import { EngineScorer } from "../batch/engine-scorer.js";
import { HttpScorer } from "../batch/http-scorer.js";
import { formatUsd } from "../accounts/money.js";
import { loadPricing, type Pricing } from "../batch/pricing.js";
import { runBatch, type BatchResult } from "../batch/runner.js";
import type { Scorer } from "../batch/scorer.js";
import type { CliIO } from "./keys.js";
import { positiveInt } from "./options.js";
import { stderrStream } from "./progress.js";

export interface BatchCliOptions {
  in: string;
  out: string;
  model: string;
  concurrency: number;
  group: boolean;
  maxQuestions: number;
  url?: string;
  key?: string;
  /** Draw the progress bar (default true). */
  progress?: boolean;
  signal?: AbortSignal;
}

function progressBar(io: CliIO, total: number): { tick(done: number): void; stop(): void } {
  const stream = stderrStream(io);
  const bar = new cliProgress.SingleBar(
    {
      stream,
      format: "batch |{bar}| {value}/{total} lines | {rate} lines/s | {duration_formatted} elapsed, ETA {eta_formatted}",
      hideCursor: true,
      noTTYOutput: true,
      notTTYSchedule: 10_000,
      etaBuffer: 50,
    },
    cliProgress.Presets.shades_classic,
  );
  const t0 = performance.now();
  bar.start(total, 0, { rate: "0.00" });
  return {
    tick: (done) => bar.update(done, { rate: (done / Math.max(1e-3, (performance.now() - t0) / 1000)).toFixed(2) }),
    stop: () => bar.stop(),
  };
}

function resolveKey(opts: BatchCliOptions, io: CliIO, dataDir: string): string {
  if (opts.key) return opts.key;
  if (io.env.ASSAY_API_KEY) return io.env.ASSAY_API_KEY;
  const file = path.join(dataDir, "local-api-key");
  if (fs.existsSync(file)) return fs.readFileSync(file, "utf8").trim();
  throw new Error("--url needs a key: --key KEY, ASSAY_API_KEY, or the local key file of the data dir");
}

const n = (x: number) => x.toLocaleString("en-US");

/** The summary printed at the end (stdout). */
export function summaryText(
  r: BatchResult,
  opts: Pick<BatchCliOptions, "out" | "url">,
  priceNote: string | null,
): string {
  const out = path.basename(opts.out);
  const statuses = (s: Record<string, number>) =>
    Object.entries(s)
      .sort(([a], [b]) => Number(a) - Number(b))
      .map(([k, v]) => `${k} × ${n(v)}`)
      .join(", ") || "none";
  const secs = r.elapsedMs / 1000;
  const lines = [
    `batch: ${n(r.lines)} input lines; ${n(r.skipped)} already in ${out} (skipped); ` +
      `${n(r.run.records)} written in ${secs.toFixed(1)} s (${(r.run.records / Math.max(secs, 1e-3)).toFixed(2)} lines/s)` +
      (r.interrupted ? "; INTERRUPTED: run the same command again to resume" : ""),
    `requests: ${n(r.passes)} ${opts.url ? "HTTP" : "pipeline"} requests; ${n(r.groupedLines)} lines shared a pass with others`,
    `status (this run): ${statuses(r.run.byStatus)}`,
    `status (${out}): ${statuses(r.file.byStatus)}`,
    `input tokens: ${n(r.run.inputTokens)} this run; ${n(r.file.inputTokens)} in ${out}; output tokens: 0`,
  ];
  if (priceNote === null) lines.push("cost: no price list in this checkout; tokens only");
  else if (r.run.costMicro === null || r.file.costMicro === null) lines.push(`cost: a model has no price in ${priceNote}; tokens only`);
  else lines.push(`cost: ${formatUsd(r.run.costMicro)} this run; ${formatUsd(r.file.costMicro)} in ${out} (${priceNote})`);
  if (r.truncatedBytes > 0) lines.push(`note: removed a cut last line (${r.truncatedBytes} bytes) from ${out}; it ran again`);
  if (r.invalidLines > 0) lines.push(`note: ${r.invalidLines} line(s) of ${out} are not records; ignored`);
  return `${lines.join("\n")}\n`;
}

export async function batchCommand(opts: BatchCliOptions, io: CliIO): Promise<BatchResult> {
  if (!fs.existsSync(opts.in)) throw new Error(`input file ${opts.in} does not exist`);
  if (path.resolve(opts.in) === path.resolve(opts.out)) throw new Error("--in and --out must be different files");
  const config = loadConfig(io.env);
  let scorer: Scorer;
  if (opts.url) {
    let registry: ModelRegistry | null = null;
    try {
      registry = ModelRegistry.load(config.modelsConfig, config.modelsDir);
    } catch {
      registry = null;
    }
    scorer = new HttpScorer({
      url: opts.url,
      key: resolveKey(opts, io, config.dataDir),
      family: (m) => (registry?.has(m) ? registry.resolve(m).family : null),
    });
  } else {
    scorer = await EngineScorer.create(config, (m) => io.stderr(`${m}\n`));
  }
  try {
    let pricing: Pricing | null = null;
    try {
      pricing = loadPricing(io.env, (m) => scorer.family?.(m) ?? null);
    } catch (e) {
      io.stderr(`assay batch: prices not used: ${e instanceof Error ? e.message : String(e)}\n`);
    }
    let bar: { tick(done: number): void; stop(): void } | null = null;
    const result = await (async () => {
      try {
        return await runBatch(scorer, {
          inFile: opts.in,
          outFile: opts.out,
          defaultModel: opts.model,
          concurrency: opts.concurrency,
          group: opts.group,
          maxQuestions: opts.maxQuestions,
          ...(opts.signal ? { signal: opts.signal } : {}),
          ...(pricing ? { charge: pricing.charge } : {}),
          onStart: (s) => {
            io.stderr(
              `assay batch: ${scorer.description}; ${s.lines} lines, ${s.skipped} already in ${opts.out}, ${s.todo} to do` +
                `${opts.group && !opts.url ? " (grouping requests that share a state)" : ""}\n`,
            );
            if (opts.progress !== false && s.todo > 0) bar = progressBar(io, s.todo);
          },
          onProgress: (done) => bar?.tick(done),
        });
      } finally {
        (bar as { stop(): void } | null)?.stop();
      }
    })();
    const priceNote = pricing ? `list prices from ${pricing.source}, each request rounded up to $0.000001` : null;
    io.stdout(summaryText(result, opts, priceNote));
    return result;
  } finally {
    await scorer.close();
  }
}

export function registerBatchCommand(program: Command, io: CliIO): void {
  program
    .command("batch")
    .description("score a JSONL file of requests (in-process, or against a server with --url); resumable")
    .requiredOption("--in <file>", "requests, one JSON body per line, optionally with an `id`")
    .requiredOption("--out <file>", "answers, one JSON line per input line; appended to, ids already there are skipped")
    .option("--model <name>", "model for lines without a `model`", "judge-latest")
    .option("--concurrency <n>", "requests in flight at once (default 8 in-process, where their short passes run batched; 4 with --url, the spec's limit before a purchase)", positiveInt("--concurrency"))
    .option("--no-group", "do not merge requests that share a state into one pipeline request")
    .option("--max-questions <n>", "questions per merged request at most (≤ 64)", positiveInt("--max-questions"), 64)
    .option("--url <url>", "score against a running server (e.g. http://127.0.0.1:8000) instead of in-process")
    .option("--key <key>", "API key for --url (default: ASSAY_API_KEY, then the data dir's local-api-key)")
    .action(
      async (o: { in: string; out: string; model: string; concurrency?: number; group: boolean; maxQuestions: number; url?: string; key?: string }) => {
        // First Ctrl-C: finish what is in flight, write it, print the summary. Second: stop now.
        const abort = new AbortController();
        const onSigint = () => {
          if (abort.signal.aborted) process.exit(130);
          io.stderr("\nassay batch: stopping after the requests in flight (Ctrl-C again to stop at once)\n");
          abort.abort();
        };
        process.on("SIGINT", onSigint);
        let result: BatchResult;
        try {
          result = await batchCommand(
            {
              in: o.in,
              out: o.out,
              model: o.model,
              concurrency: o.concurrency ?? (o.url !== undefined ? 4 : 8),
              group: o.group,
              maxQuestions: Math.min(64, o.maxQuestions),
              signal: abort.signal,
              ...(o.url !== undefined ? { url: o.url } : {}),
              ...(o.key !== undefined ? { key: o.key } : {}),
            },
            io,
          );
        } finally {
          process.off("SIGINT", onSigint);
        }
        if (result.interrupted) throw new CommanderError(130, "assay.batch.interrupted", "interrupted");
      },
    );
}
