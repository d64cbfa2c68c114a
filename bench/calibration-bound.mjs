#!/usr/bin/env node
// How well can any one confidence map of these readings do? Per question type,
// for every set of `assay calibrate --readouts` files, the ECE (15 bins) of the
// answer's probability under four maps, all on the same readings:
//   own     a logistic map on FEATURES fitted on that set alone, in sample: what
//           a map would give if it knew which kind of question it was reading;
//   LODO    the same map fitted on the other sets (what `assay calibrate` judges);
//   one     one logistic map fitted on every set at once, in sample;
//   any     the best piecewise-constant map of FEATURES fitted on every set at
//           once, in sample: the readings cut into cells (quantile bins of each
//           feature, pooled), each cell stating the share right in it over
//           every set, each set weighing the same. No map that sees only these
//           features and is fitted without knowing the set can state a cell's
//           items two probabilities.
// Here every map is fitted to each set's own mix of answers (noul: of true and
// false), which is what its ECE is measured on; `assay calibrate` balances a
// noul set's two classes instead, so these `own` and `one` figures are the
// kinder ones.
// `any` is optimistic (in sample; finer cells flatter it more): where it stays
// above a target on a set at every resolution, no one map of these features
// meets that target there. Beside it, the
// ECE a calibrated model would show at that n (the floor).
//   node bench/calibration-bound.mjs READOUTS.json… [--bins 4,6,8] [--features noul=z --features choice=top,agree …]
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const fitMod = await import(path.join(ROOT, "dist", "src", "eval", "confidence-fit.js"));
const { applyConfidenceMap } = await import(path.join(ROOT, "dist", "src", "probability", "index.js"));
const { eceFloor } = await import(path.join(ROOT, "dist", "src", "eval", "calibrate.js"));
const { newtonLogistic } = await import(path.join(ROOT, "dist", "src", "eval", "fitting.js"));
const { confidenceItems, scoreConfidence } = fitMod;

const { values: flags, positionals } = parseArgs({
  options: { bins: { type: "string", default: "4,6,8" }, features: { type: "string", multiple: true, default: [] } },
  allowPositionals: true,
});
if (positionals.length === 0) {
  process.stderr.write("usage: node bench/calibration-bound.mjs READOUTS.json… [--bins 4,6,8] [--features TYPE=f1,f2]\n");
  process.exit(2);
}
// noul: z, the reading with the prior off, which is what the shipped Platt map reads. Not the prior
// itself: a kind of question asks one question text, so its prior names the set, and a map of it
// fitted in sample learns the sets by name, which carries to no new kind.
const FEATURES = { noul: ["z"], choice: ["top", "agree"], score: ["top", "agree"] };
for (const f of flags.features) {
  const [type, list] = f.split("=");
  if (!(type in FEATURES) || !list) throw new Error(`--features ${f}: give TYPE=f1,f2 with TYPE noul, choice or score`);
  FEATURES[type] = list.split(",");
}
const resolutions = flags.bins.split(",").map(Number);

const items = [];
const seen = new Set();
for (const file of positionals) {
  const saved = JSON.parse(fs.readFileSync(file, "utf8"));
  const mine = confidenceItems(saved.items);
  const sets = new Set(mine.map((it) => it.dataset));
  for (const ds of sets) if (seen.has(ds)) throw new Error(`${ds} is in two readouts files`);
  for (const ds of sets) seen.add(ds);
  items.push(...mine);
}

/** Quantile cut points of one feature over the pooled items (distinct values only). */
function cuts(xs, k) {
  const s = [...xs].sort((a, b) => a - b);
  const out = [];
  for (let j = 1; j < k; j++) {
    const c = s[Math.floor((j * s.length) / k)];
    if (out.length === 0 || c > out[out.length - 1]) out.push(c);
  }
  return out;
}
const binOf = (x, cs) => cs.filter((c) => x >= c).length;

/** Each set weighs the same in total, its items the same within it. */
function setWeights(xs) {
  const count = new Map();
  for (const it of xs) count.set(it.dataset, (count.get(it.dataset) ?? 0) + 1);
  return xs.map((it) => 1 / count.get(it.dataset));
}

/** A logistic map on `features`, fitted by the engine's own Newton solver (the fit's L2). */
function fitConfidenceMap(xs, features) {
  const w = setWeights(xs);
  const total = w.reduce((s, x) => s + x, 0);
  const beta = newtonLogistic(
    xs.map((it) => [1, ...features.map((f) => it.features[f] ?? 0)]),
    xs.map((it) => it.y),
    w.map((x) => x / total),
    { l2: 1e-2 },
  );
  return { bias: beta[0], weights: Object.fromEntries(features.map((f, j) => [f, beta[j + 1]])) };
}

/** The piecewise-constant map: each cell's weighted share of y, over every set. */
function cellMap(all, features, k) {
  const cutsOf = features.map((f) => cuts(all.map((it) => it.features[f] ?? 0), k));
  const key = (it) => features.map((f, j) => binOf(it.features[f] ?? 0, cutsOf[j])).join(",");
  const w = setWeights(all);
  const sum = new Map();
  all.forEach((it, i) => {
    const [a, b] = sum.get(key(it)) ?? [0, 0];
    sum.set(key(it), [a + w[i] * (it.y ? 1 : 0), b + w[i]]);
  });
  const cells = sum.size;
  const describe = (k) =>
    features
      .map((f, j) => {
        const b = Number(k.split(",")[j]);
        const lo = b === 0 ? "−∞" : cutsOf[j][b - 1].toFixed(2);
        const hi = b === cutsOf[j].length ? "∞" : cutsOf[j][b].toFixed(2);
        return `${f} ∈ [${lo}, ${hi})`;
      })
      .join(", ");
  return { cells, key, describe, p: (it) => { const [a, b] = sum.get(key(it)); return a / b; } };
}

/**
 * The cells where the sets differ most in how often y holds (noul: the answer is
 * true; choice/score: the chosen option is right), counting sets with at least
 * `min` items in the cell: the same reading, a different truth by kind.
 */
function disagreements(all, map, top = 3, min = 8) {
  const byCell = new Map();
  for (const it of all) {
    const k = map.key(it);
    const per = byCell.get(k) ?? new Map();
    const [y, n] = per.get(it.dataset) ?? [0, 0];
    per.set(it.dataset, [y + (it.y ? 1 : 0), n + 1]);
    byCell.set(k, per);
  }
  const rows = [];
  for (const [k, per] of byCell) {
    const shares = [...per].filter(([, [, n]]) => n >= min).map(([ds, [y, n]]) => [ds, y / n, n]);
    if (shares.length < 2) continue;
    const values = shares.map(([, x]) => x);
    rows.push({ cell: map.describe(k), gap: Math.max(...values) - Math.min(...values), shares });
  }
  return rows.sort((a, b) => b.gap - a.gap).slice(0, top);
}

const f3 = (x) => (x === null || x === undefined ? "–" : x.toFixed(3));
for (const type of ["noul", "choice", "score"]) {
  const all = items.filter((it) => it.type === type);
  const sets = [...new Set(all.map((it) => it.dataset))];
  if (sets.length < 2) continue;
  const features = FEATURES[type];
  const one = fitConfidenceMap(all, features);
  const anys = resolutions.map((b) => cellMap(all, features, features.length === 1 ? 2 * b : b));
  process.stdout.write(
    `\n${type}: features ${features.join(", ")}; ${sets.length} sets, ${all.length} items\n\n` +
      `| set | n | accuracy (own map) | ECE, own map | LODO | one map | ${anys.map((a) => `any one map, ${a.cells} cells`).join(" | ")} | floor |\n` +
      `|---|---:|---:|---:|---:|---:|${anys.map(() => "---:|").join("")}---:|\n`,
  );
  for (const ds of sets) {
    const mine = all.filter((it) => it.dataset === ds);
    const others = all.filter((it) => it.dataset !== ds);
    const score = (map) => scoreConfidence(mine, mine.map((it) => applyConfidenceMap(map, it.features)));
    const ownMap = fitConfidenceMap(mine, features);
    const own = score(ownMap);
    const lodo = score(fitConfidenceMap(others, features));
    const anyEce = anys.map((a) => `**${f3(scoreConfidence(mine, mine.map(a.p)).ece)}**`).join(" | ");
    const confidences = mine.map((it) => {
      const p = applyConfidenceMap(ownMap, it.features);
      return type === "noul" ? Math.max(p, 1 - p) : p;
    });
    process.stdout.write(
      `| ${ds} | ${mine.length} | ${f3(own.accuracy)} | ${f3(own.ece)} | ${f3(lodo.ece)} | ${f3(score(one).ece)} | ${anyEce} | ${f3(eceFloor(confidences))} |\n`,
    );
  }
  const middle = anys[Math.floor(anys.length / 2)];
  process.stdout.write(`\nwhere the sets differ most on one reading (${middle.cells} cells; ${type === "noul" ? "share of answers that are true" : "share of chosen options that are right"}, n):\n`);
  for (const r of disagreements(all, middle)) {
    process.stdout.write(`- ${r.cell}: ${r.shares.map(([ds, x, n]) => `${ds} ${f3(x)} (${n})`).join(", ")}\n`);
  }
}
