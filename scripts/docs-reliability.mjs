#!/usr/bin/env node
// Draws the README's reliability diagrams: `assay eval` (the real pipeline,
// the shipped calibration) on the question sets no calibration map was
// fitted on (bench/data/README.md, the held-out kinds), and copies its
// diagrams and table into docs/reliability/. Run by `npm run docs:reliability`
// after the bootstrap; `--model NAME` and `--data FILE…` override the defaults,
// `--from DIR` takes an `assay eval --out DIR` run of those instead of running one.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const OUT = path.join(ROOT, "docs", "reliability");
export const HELD_OUT = ["bench/data/choice_reviews_aspect.jsonl", "bench/data/noul_reviews_recommend.jsonl", "bench/data/score_deliveries_damage.jsonl", "bench/data/score_habits_exercise.jsonl", "bench/data/choice_trips_transport.jsonl", "bench/data/noul_messages_apology.jsonl"];

const { values } = parseArgs({
  options: { model: { type: "string", default: "judge-latest" }, data: { type: "string", multiple: true }, from: { type: "string" } },
});
const data = values.data ?? HELD_OUT;
const tmp = values.from ? path.resolve(values.from) : fs.mkdtempSync(path.join(os.tmpdir(), "assay-reliability-"));
try {
  if (!values.from) {
    execFileSync(process.execPath, [path.join(ROOT, "bin", "assay.js"), "eval", "--model", values.model, "--data", ...data, "--no-flip", "--out", tmp], {
      cwd: ROOT,
      stdio: ["ignore", "inherit", "inherit"],
    });
  }
  fs.mkdirSync(OUT, { recursive: true });
  const written = [];
  for (const f of fs.readdirSync(tmp).filter((f) => f.endsWith(".svg"))) {
    fs.copyFileSync(path.join(tmp, f), path.join(OUT, f));
    written.push(f);
  }
  // The table, without the run's paths and timings (they change every run).
  const report = fs.readFileSync(path.join(tmp, "report.md"), "utf8");
  const table = report
    .split("\n")
    .filter((l) => l.startsWith("|"))
    .slice(0, 2 + data.length)
    .map((l) => l.split("|").slice(0, -3).concat([""]).join("|"));
  const head = `# Reliability on question kinds no map was fitted on\n\nWritten by \`npm run docs:reliability\` (\`assay eval --model ${values.model} --data ${data.join(" ")} --no-flip\`). ` +
    "Each diagram: the share of right answers per band of the probability given to the answer (bars, with the band's count), the band's mean probability (tick), and the diagonal a calibrated answer sits on.\n";
  fs.writeFileSync(path.join(OUT, "README.md"), `${head}\n${table.join("\n")}\n\n${written.map((f) => `![${f}](${f})`).join("\n")}\n`);
  process.stderr.write(`docs:reliability: wrote ${written.length} diagrams and README.md in ${path.relative(ROOT, OUT)}\n`);
} finally {
  if (!values.from) fs.rmSync(tmp, { recursive: true, force: true });
}
