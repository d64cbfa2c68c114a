/**
 * Report writer: the Markdown summary table, report.md with per-dataset
 * details, a hand-written SVG reliability diagram per dataset and results.json.
 */
import fs from "node:fs";
import path from "node:path";
import type { Reliability } from "./metrics.js";
import type { DatasetRun } from "./runner.js";
import type { DatasetSummary, PassStats } from "./summary.js";

export interface SkippedFile {
  file: string;
  reason: string;
}

export interface EvalReport {
  model: string;
  /** Concrete model entry and build hash the name resolved to, when known. */
  resolved: { target: string; build: string | null } | null;
  calibration: string;
  /** Option-order debiasing the answers were read under. */
  debias?: string;
  createdAt: string;
  options: { limit: number | null; split?: string | null; flip: boolean; concurrency: number; data: string[] };
  summaries: DatasetSummary[];
  runs: DatasetRun[];
  skipped: SkippedFile[];
  /** Wall time of the whole run, model load excluded. */
  elapsedMs: number;
}

const NA = "–";
const f3 = (x: number | null | undefined) => (x === null || x === undefined ? NA : x.toFixed(3));
const f0 = (x: number | null | undefined) => (x === null || x === undefined ? NA : x.toFixed(0));

/** The one-row-per-dataset Markdown table printed to stdout. */
export function summaryTable(summaries: readonly DatasetSummary[]): string {
  const head = [
    "dataset",
    "type",
    "n",
    "accuracy",
    "mean p",
    "macro-F1",
    "MAE (exp)",
    "MAE (argmax)",
    "off-by-one",
    "AUROC",
    "Brier",
    "ECE",
    "flip rate",
    "ms/request",
    "tokens",
  ];
  const rows = summaries.map((s) => [
    s.dataset,
    s.task === s.format ? s.task : `${s.task} (${s.format})`,
    s.errors > 0 ? `${s.n} (${s.errors} err)` : String(s.n),
    f3(s.accuracy),
    f3(s.meanConfidence),
    f3(s.macroF1),
    f3(s.maeExpected),
    f3(s.maeArgmax),
    f3(s.offByOne),
    f3(s.auroc),
    f3(s.brier),
    f3(s.ece),
    f3(s.flipRate),
    f0(s.main.latencyMs),
    String(s.main.inputTokens),
  ]);
  const line = (cells: readonly string[]) => `| ${cells.join(" | ")} |`;
  return [line(head), line(head.map((_, i) => (i < 2 ? "---" : "---:"))), ...rows.map(line)].join("\n") + "\n";
}

const xml = (s: string) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");

/** Reliability diagram: accuracy per confidence bin (bars, with counts) against the diagonal. */
export function reliabilitySvg(title: string, rel: Reliability): string {
  const W = 460;
  const H = 490;
  const left = 60;
  const top = 50;
  const size = 360; // plot square
  const X = (v: number) => left + v * size;
  const Y = (v: number) => top + (1 - v) * size;
  const n = rel.bins.reduce((s, b) => s + b.count, 0);
  const parts: string[] = [];
  parts.push(
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="11">`,
    `<rect width="${W}" height="${H}" fill="#ffffff"/>`,
    `<text x="${W / 2}" y="22" text-anchor="middle" font-size="14" font-weight="bold">${xml(title)}</text>`,
    `<text x="${W / 2}" y="38" text-anchor="middle" fill="#555">ECE ${f3(rel.ece)} · n = ${n} · ${rel.bins.length} equal-width bins</text>`,
  );
  // grid and ticks
  for (let i = 0; i <= 5; i++) {
    const v = i / 5;
    parts.push(
      `<line x1="${X(0)}" y1="${Y(v)}" x2="${X(1)}" y2="${Y(v)}" stroke="#eee"/>`,
      `<line x1="${X(v)}" y1="${Y(0)}" x2="${X(v)}" y2="${Y(1)}" stroke="#eee"/>`,
      `<text x="${X(v)}" y="${Y(0) + 16}" text-anchor="middle">${v.toFixed(1)}</text>`,
      `<text x="${X(0) - 6}" y="${Y(v) + 4}" text-anchor="end">${v.toFixed(1)}</text>`,
    );
  }
  // bars: accuracy per bin; a dark tick at the bin's mean confidence; the count above
  for (const b of rel.bins) {
    if (b.count === 0 || b.accuracy === null || b.confidence === null) continue;
    const x0 = X(b.lo) + 1;
    const w = X(b.hi) - X(b.lo) - 2;
    const gapTop = Y(Math.max(b.accuracy, b.confidence));
    const gapBottom = Y(Math.min(b.accuracy, b.confidence));
    parts.push(
      `<rect x="${x0.toFixed(1)}" y="${gapTop.toFixed(1)}" width="${w.toFixed(1)}" height="${(gapBottom - gapTop).toFixed(1)}" fill="#e4572e" fill-opacity="0.25"/>`,
      `<rect x="${x0.toFixed(1)}" y="${Y(b.accuracy).toFixed(1)}" width="${w.toFixed(1)}" height="${(Y(0) - Y(b.accuracy)).toFixed(1)}" fill="#2e86de" fill-opacity="0.85"><title>confidence ${b.lo.toFixed(3)}–${b.hi.toFixed(3)}: n=${b.count}, accuracy ${b.accuracy.toFixed(3)}, mean confidence ${b.confidence.toFixed(3)}</title></rect>`,
      `<line x1="${x0.toFixed(1)}" y1="${Y(b.confidence).toFixed(1)}" x2="${(x0 + w).toFixed(1)}" y2="${Y(b.confidence).toFixed(1)}" stroke="#222" stroke-width="2"/>`,
      `<text x="${(x0 + w / 2).toFixed(1)}" y="${(Math.min(Y(b.accuracy), Y(b.confidence)) - 4).toFixed(1)}" text-anchor="middle" font-size="9">${b.count}</text>`,
    );
  }
  // diagonal and frame
  parts.push(
    `<line x1="${X(0)}" y1="${Y(0)}" x2="${X(1)}" y2="${Y(1)}" stroke="#888" stroke-dasharray="5,4"/>`,
    `<rect x="${X(0)}" y="${Y(1)}" width="${size}" height="${size}" fill="none" stroke="#333"/>`,
    `<text x="${X(0.5)}" y="${Y(0) + 34}" text-anchor="middle">confidence of the predicted class</text>`,
    `<text transform="translate(${X(0) - 40},${Y(0.5)}) rotate(-90)" text-anchor="middle">accuracy</text>`,
    // legend under the axis title, out of the plot area
    `<g transform="translate(${X(0)},${Y(0) + 48})" font-size="10">`,
    `<rect width="10" height="10" fill="#2e86de"/><text x="14" y="9">accuracy (n above)</text>`,
    `<line x1="120" y1="5" x2="130" y2="5" stroke="#222" stroke-width="2"/><text x="134" y="9">mean confidence</text>`,
    `<rect x="230" width="10" height="10" fill="#e4572e" fill-opacity="0.25"/><text x="244" y="9">gap</text>`,
    `<line x1="275" y1="5" x2="290" y2="5" stroke="#888" stroke-dasharray="5,4"/><text x="294" y="9">perfect calibration</text>`,
    `</g>`,
    `</svg>`,
  );
  return parts.join("\n") + "\n";
}

function passLines(label: string, p: PassStats): string[] {
  return [
    `- ${label}: ${p.requests} requests${p.failedRequests ? ` (+${p.failedRequests} failed)` : ""}, ` +
      `${p.questionsPerRequest?.toFixed(2) ?? NA} questions/request, ${p.inputTokens} input tokens (${f0(p.tokensPerRequest)}/request)`,
    `  - latency (wall − worker wait): mean ${f0(p.latencyMs)} ms, p50 ${f0(p.p50LatencyMs)} ms, p95 ${f0(p.p95LatencyMs)} ms; ` +
      `inference ${f0(p.inferenceMs)} ms; wall with eval concurrency ${f0(p.wallMs)} ms (worker wait ${f0(p.queueMs)} ms)`,
  ];
}

function counts(c: Record<string, number>, max = 12): string {
  const e = Object.entries(c).sort((a, b) => b[1] - a[1]);
  const shown = e.slice(0, max).map(([k, v]) => `${k}: ${v}`);
  return shown.join(", ") + (e.length > max ? `, … (${e.length - max} more)` : "");
}

export function datasetDetails(s: DatasetSummary, run: DatasetRun | undefined): string {
  const out: string[] = [];
  out.push(`## ${s.dataset}`, "");
  out.push(
    `- file: \`${s.file}\` — format ${s.format}, asked as \`${s.task}\``,
    `- items: ${s.items} of ${s.totalRows} rows${s.items < s.totalRows ? " (evenly spaced over the file)" : ""}; answered ${s.n}; errors ${s.errors}`,
    `- accuracy ${f3(s.accuracy)}`,
  );
  if (s.task === "choice") out.push(`- macro-F1 ${f3(s.macroF1)} (over the classes in gold ∪ predictions)`);
  if (s.task === "score") {
    out.push(
      `- MAE of the expected level (answer \`score\`) ${f3(s.maeExpected)}; MAE of the argmax level ${f3(s.maeArgmax)}; off-by-one accuracy ${f3(s.offByOne)}`,
    );
  }
  if (s.task === "noul") out.push(`- AUROC ${f3(s.auroc)}; Brier ${f3(s.brier)}`);
  out.push(`- ECE (15 bins, confidence of the predicted class) ${f3(s.ece)}`);
  if (s.task !== "noul") {
    out.push(
      s.flipRate === null
        ? "- flip rate: not measured (--no-flip)"
        : `- flip rate (argmax changes with the options reversed) ${f3(s.flipRate)} over ${s.flipN} items${s.flipErrors ? ` (${s.flipErrors} reversed asks failed)` : ""}`,
    );
  }
  out.push(`- gold: ${counts(s.goldCounts)}`, `- predicted: ${counts(s.predCounts)}`);
  out.push(...passLines("main pass", s.main));
  if (s.flip) out.push(...passLines("reversed pass", s.flip));
  if (run) {
    const errs = new Map<string, number>();
    for (const r of run.items) {
      for (const e of [r.mainError, r.flipError]) if (e) errs.set(e, (errs.get(e) ?? 0) + 1);
    }
    if (errs.size > 0) {
      out.push("- errors:");
      for (const [e, k] of [...errs].slice(0, 5)) out.push(`  - ${k}× ${e}`);
    }
  }
  out.push("", `![reliability diagram](reliability-${s.dataset}.svg)`, "");
  out.push("| confidence bin | n | mean confidence | accuracy | gap |", "|---|---:|---:|---:|---:|");
  for (const b of s.reliability.bins) {
    if (b.count === 0) continue;
    const gap = b.accuracy !== null && b.confidence !== null ? b.accuracy - b.confidence : null;
    out.push(`| ${b.lo.toFixed(3)}–${b.hi.toFixed(3)} | ${b.count} | ${f3(b.confidence)} | ${f3(b.accuracy)} | ${f3(gap)} |`);
  }
  out.push("");
  return out.join("\n");
}

export function reportMarkdown(r: EvalReport): string {
  const out: string[] = [];
  out.push(`# assay eval — ${r.model}`, "");
  out.push(
    `- model: \`${r.model}\`${r.resolved ? ` → \`${r.resolved.target}\` (build ${r.resolved.build ?? "?"})` : ""}`,
    `- calibration: ${r.calibration}`,
    `- option-order debiasing: ${r.debias ?? "off"}`,
    `- run at ${r.createdAt}; ${(r.elapsedMs / 1000).toFixed(1)} s; concurrency ${r.options.concurrency}; ` +
      `limit ${r.options.limit ?? "none"}${r.options.split ? `; rows split ${r.options.split}` : ""}; option-order flip ${r.options.flip ? "on" : "off"}`,
    "",
  );
  out.push(summaryTable(r.summaries));
  out.push(
    "Columns: accuracy = argmax answer equals gold (noul: `noul` > 0.5); MAE (exp) uses the answer's expected level `score`; " +
      "ECE over 15 equal-width bins of the predicted class's probability; flip rate = argmax changes when the options are " +
      "presented in reverse order; ms/request = mean wall time per request minus the wait for a worker; tokens = input tokens of the main pass.",
    "",
  );
  if (r.skipped.length > 0) {
    out.push("Skipped:", "");
    for (const s of r.skipped) out.push(`- \`${s.file}\`: ${s.reason}`);
    out.push("");
  }
  for (const s of r.summaries) out.push(datasetDetails(s, r.runs.find((x) => x.dataset.name === s.dataset)));
  return out.join("\n");
}

/** results.json: options, summaries, and every item (gold, readouts) and request record. */
export function resultsJson(r: EvalReport): string {
  return (
    JSON.stringify(
      {
        model: r.model,
        resolved: r.resolved,
        calibration: r.calibration,
        debias: r.debias ?? "off",
        created_at: r.createdAt,
        elapsed_ms: r.elapsedMs,
        options: r.options,
        skipped: r.skipped,
        label_order: {
          noul: "[true, false]",
          choice: "the dataset's options, in file order",
          score: "levels low → high (the reversed pass is mapped back)",
          label_logprobs:
            "log-softmax over the labels at temperature 1, recovered from the calibrated answer and the manifest temperature; null where the probability underflowed",
        },
        datasets: r.summaries.map((s) => {
          const run = r.runs.find((x) => x.dataset.name === s.dataset);
          return { summary: s, items: run?.items ?? [], requests: run?.requests ?? [] };
        }),
      },
      null,
      1,
    ) + "\n"
  );
}

/** Write report.md, results.json and reliability-<dataset>.svg into `dir`; returns the paths written. */
export function writeReport(dir: string, r: EvalReport): string[] {
  fs.mkdirSync(dir, { recursive: true });
  const written: string[] = [];
  const write = (name: string, text: string) => {
    const p = path.join(dir, name);
    fs.writeFileSync(p, text);
    written.push(p);
  };
  write("report.md", reportMarkdown(r));
  for (const s of r.summaries) write(`reliability-${s.dataset}.svg`, reliabilitySvg(`${s.dataset} (${r.model})`, s.reliability));
  write("results.json", resultsJson(r));
  return written;
}
