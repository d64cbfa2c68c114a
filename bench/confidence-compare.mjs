#!/usr/bin/env node
// Two calibration files on the same readings: for every item of an
// `assay eval` results.json (which records what the engine read for each
// question), or of an `assay calibrate --readouts` file, the answer under
// each file's maps, and per dataset, for each file, the accuracy (a noul map
// moves the 0.5 line; a choice map never changes the choice), the mean
// probability of the answer and the ECE (15 bins), and for a score set the
// mean absolute error of the answer's `score` (the expected level, which a
// score map moves), and below, per score set, the log-loss of the gold level
// and the mean ordinal `confidence` (which a score map's spread moves). One model run, both
// sides: the figure is the maps' difference, not the machine's.
// With --time, also what answering costs under each file (the probability
// stage: a confidence map computes its features per question), rounds
// alternating between the two files.
//   node bench/confidence-compare.mjs RESULTS.json|READOUTS.json BASELINE.json [CANDIDATE.json] [--time]
// (CANDIDATE defaults to the build's shipped file in models/calibration/.)
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const { answer } = await import(path.join(ROOT, "dist", "src", "probability", "index.js"));
const { reliability } = await import(path.join(ROOT, "dist", "src", "eval", "metrics.js"));

const { values: flags, positionals } = parseArgs({ options: { time: { type: "boolean", default: false } }, allowPositionals: true });
const [resultsFile, baselineFile, candidateArg] = positionals;
if (!resultsFile || !baselineFile) {
  process.stderr.write("usage: node bench/confidence-compare.mjs RESULTS.json BASELINE.json [CANDIDATE.json]\n");
  process.exit(2);
}
const results = JSON.parse(fs.readFileSync(resultsFile, "utf8"));
const read = (f) => JSON.parse(fs.readFileSync(f, "utf8"));
const baseline = read(baselineFile);
const candidateFile = candidateArg ?? path.join(ROOT, "models", "calibration", `${baseline.build}.json`);
const candidate = read(candidateFile);
if (baseline.build_hash !== candidate.build_hash) throw new Error("the two files are fitted on different builds");

/**
 * [probability of the answer given, whether it is right, and for score: |expected level − gold|,
 * −log p(gold level), the answer's `confidence`] under a file's maps.
 */
function scored(item, type, fit) {
  const r = item.main.reading;
  const keys = r.lp.map((_, i) => String(i));
  const a = answer({ type, keys }, r, fit);
  if (a.type === "noul") return [Math.max(a.noul, 1 - a.noul), a.noul > 0.5 === item.gold];
  const p = keys.map((k) => a.probabilities[k]);
  const m = p.indexOf(Math.max(...p));
  // The reading is in the dataset's option order; the readout's pred names the chosen option.
  if (a.type !== "score") return [p[m], item.main.pred === item.gold];
  return [p[m], item.main.pred === item.gold, Math.abs(a.score - item.gold), -Math.log(Math.max(1e-12, p[item.gold])), a.confidence];
}

const f3 = (x) => x.toFixed(3);
const scoreRows = [];
const rows = [
  `| dataset | type | n | accuracy, ${path.basename(baselineFile)} | mean p | ECE | score MAE | accuracy, ${path.basename(candidateFile)} | mean p | ECE | score MAE |`,
  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
];
// A readouts file holds fit items (dataset, type, gold index, reading); noul's option 0 is "true".
const argmax = (xs) => xs.indexOf(Math.max(...xs));
const sets = results.datasets
  ? results.datasets.map((d) => ({ name: d.summary.dataset, type: d.summary.task, items: d.items }))
  : [...new Set(results.items.map((it) => it.dataset))].map((name) => {
      const mine = results.items.filter((it) => it.dataset === name && it.reading && !it.reading.shortlisted);
      const type = mine[0]?.type;
      const items = mine.map((it) => ({
        gold: type === "noul" ? it.gold === 0 : it.gold,
        main: { reading: it.reading, pred: type === "noul" ? null : argmax(it.reading.lp) },
      }));
      return { name, type, items };
    });
for (const d of sets) {
  const items = d.items.filter((it) => it.main?.reading);
  if (items.length === 0) continue;
  const type = d.type;
  const side = (fit) => {
    const s = items.map((it) => scored(it, type, fit));
    const conf = s.map(([c]) => c);
    const right = s.map(([, y]) => y);
    const avg = (j) => f3(s.reduce((a, x) => a + x[j], 0) / s.length);
    const mae = type === "score" ? avg(2) : "–";
    return { acc: right.filter(Boolean).length / s.length, mean: conf.reduce((a, b) => a + b, 0) / s.length, ece: reliability(conf, right).ece, mae, logLoss: type === "score" ? avg(3) : null, ordinal: type === "score" ? avg(4) : null };
  };
  const b = side(baseline);
  const c = side(candidate);
  rows.push(`| ${d.name} | ${type} | ${items.length} | ${f3(b.acc)} | ${f3(b.mean)} | ${f3(b.ece)} | ${b.mae} | ${f3(c.acc)} | ${f3(c.mean)} | ${f3(c.ece)} | ${c.mae} |`);
  if (type === "score") scoreRows.push(`| ${d.name} | ${items.length} | ${b.logLoss} | ${b.ordinal} | ${c.logLoss} | ${c.ordinal} |`);
}
process.stdout.write(rows.join("\n") + "\n");
if (scoreRows.length > 0) {
  const head = `| score set | n | log-loss of the gold level, ${path.basename(baselineFile)} | mean confidence | log-loss, ${path.basename(candidateFile)} | mean confidence |`;
  process.stdout.write(["", head, "|---|---:|---:|---:|---:|---:|", ...scoreRows].join("\n") + "\n");
}

if (flags.time) {
  const all = sets.flatMap((d) => d.items.filter((it) => it.main?.reading).map((it) => ({ it, type: d.type })));
  const pass = (fit) => {
    const t = performance.now();
    for (const { it, type } of all) scored(it, type, fit);
    return performance.now() - t;
  };
  for (let i = 0; i < 5; i++) (pass(baseline), pass(candidate));
  const rounds = 40;
  let b = 0;
  let c = 0;
  for (let i = 0; i < rounds; i++) {
    b += pass(baseline);
    c += pass(candidate);
  }
  const us = (ms) => ((ms * 1000) / (rounds * all.length)).toFixed(2);
  process.stdout.write(
    `\nanswering ${all.length} questions × ${rounds} rounds: ${us(b)} µs a question under ${path.basename(baselineFile)}, ` +
      `${us(c)} µs under ${path.basename(candidateFile)} (ratio ${(c / b).toFixed(2)})\n`,
  );
}
