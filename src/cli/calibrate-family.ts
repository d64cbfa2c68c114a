/**
 * `assay calibrate --model judge-codegrep|judge-factcheck --data FILE…`: the
 * code search and fact check fits. Both builds of the name (the small one and
 * its escalation target) are run over the dev data through the served
 * pipeline, with their raw scores cached under .cache/fits/ (a rerun resumes);
 * then, per build, the code search recall adjustment or the fact check Platt
 * map is fitted, and the escalation band of the small build. Figures are
 * K-fold cross-validated by query / document for the three names
 * (-lite, base, -max), so no test fold shares a state with its training.
 */
import fs from "node:fs";
import path from "node:path";
import { ROOT, loadConfig } from "../config/index.js";
import { CALIBRATION_DIR, CalibrationFit, readCalibrationFile } from "../models/manifest.js";
import { EnginePipeline } from "../pipeline/index.js";
import { sigmoid } from "../probability/calibration.js";
import { NOUL_KEY, logit, noulLogit } from "../probability/calibration.js";
import { adjustForRecall, type RecallFit } from "../probability/recall.js";
import { recallAt } from "../eval/fitting.js";
import { FACTCHECK_CALIBRATION_KEY, claimFit } from "../families/factcheck.js";
import { FAMILY_PROMPT_VERSION } from "../prompt/families.js";
import {
  binaryScore,
  codeSearchRequests,
  escalatedItems,
  factCheckReadByLarge,
  factCheckRequests,
  fitFactCheckPlatt,
  fitRecall,
  foldsByGroup,
  readCodeSearch,
  readFactCheck,
  runScored,
  spreadRows,
  type ScoredItem,
} from "../eval/family-fit.js";
import { fitBand, type Band } from "../families/escalation.js";
import type { CliIO } from "./keys.js";
import { FactCheckFit, FamilyPrior, familyFit } from "../families/types.js";
import type { LoadedBuild } from "../engine/build.js";

export interface FamilyCalibrateOptions {
  model: string;
  data: string[];
  limit?: number;
  folds: number;
  write: boolean;
  /** Recall target of the code search adjustment. */
  target: number;
  /** Share of the small build's dev scores, nearest the decision point, that escalate. */
  bandFraction: number;
  /** Fact check: the content-free prior the run reads under and ships (default: each build's shipped one). */
  prior?: FamilyPrior;
  /**
   * Fact check: "family" fits the family's own Platt map per build (kept where it lowers the
   * leave-one-dataset-out ECE); "general" reads and maps claims with each build's general noul
   * map and prior (fitted by `assay calibrate` on BoolQ and both fact check sets pooled), ships
   * no family map and refits only the escalation band on those scores.
   */
  map?: "family" | "general";
}

interface NameFigures {
  name: string;
  [metric: string]: string | number | null;
}

const fmt = (x: number | null | undefined, d = 3) =>
  x === null || x === undefined || !Number.isFinite(x) ? "–" : Number.isInteger(x) ? String(x) : x.toFixed(d);

function table(rows: NameFigures[], cols: string[]): string {
  const head = `| name | ${cols.join(" | ")} |\n|---|${cols.map(() => "---:").join("|")}|\n`;
  return head + rows.map((r) => `| ${r.name} | ${cols.map((c) => (typeof r[c] === "number" ? fmt(r[c] as number) : String(r[c] ?? "–"))).join(" | ")} |`).join("\n") + "\n";
}

/** Sets sections of a build's shipped fit, keeping the rest (a fit for another build is replaced). */
function writeSection(build: string, buildHash: string, dir: string, patch: Record<string, unknown>, io: CliIO): string {
  const file = path.join(CALIBRATION_DIR, `${build}.json`);
  const existing = fs.existsSync(file) ? readCalibrationFile(file) : null;
  const same = existing && existing.build_hash === buildHash ? existing : { build_hash: buildHash, build, dir, temperatures: {} };
  const fit = CalibrationFit.parse({ ...same, ...patch, fitted_at: new Date().toISOString() });
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, JSON.stringify(fit, null, 2) + "\n");
  io.stderr(`wrote ${file} (build ${buildHash})\n`);
  return file;
}

export async function calibrateFamilyCommand(opts: FamilyCalibrateOptions, io: CliIO): Promise<string> {
  // Both builds must be loaded for the run: the schedule does not apply here.
  const config = loadConfig(io.env, { modelSchedule: "always" });
  const pipeline = await EnginePipeline.create(config, (m) => io.stderr(`${m}\n`));
  try {
    const model = pipeline.registry.resolve(opts.model);
    if (model.family === "general") throw new Error(`model "${opts.model}" is a general model`);
    const builds = [model.build, ...(model.escalateTo ? [model.escalateTo] : [])];
    const publicFor = (build: string) =>
      pipeline.registry.names().find((n) => {
        const r = pipeline.registry.resolve(n);
        return r.family === model.family && r.build === build && !r.escalateTo && r.aliasOf === null;
      }) ?? opts.model;
    const cacheDir = path.join(ROOT, ".cache", "fits");
    const scored = new Map<string, ScoredItem[]>();
    const ms = new Map<string, number[]>();
    const tokens = new Map<string, number[]>();
    // The prior is part of the reading (the raw score is taken after it), so
    // the run reads under the one it will ship, and its cache is keyed by it.
    const general = model.family === "factcheck" && opts.map === "general";
    const priorOf = (lb: LoadedBuild): FamilyPrior | null => (general ? null : (familyFit(lb, "factcheck", FactCheckFit)?.prior ?? null));
    if (general) {
      // The family's own fit is set aside for the run: claims are read under the general prior and map.
      for (const build of builds) {
        const cal = pipeline.build(publicFor(build)).build.manifest.calibration as Record<string, Record<string, unknown> | undefined> | null;
        if (!cal) continue;
        delete cal["platt"]?.[FACTCHECK_CALIBRATION_KEY];
        delete cal["temperatures"]?.[FACTCHECK_CALIBRATION_KEY];
        delete cal["factcheck"]?.["prior"];
      }
    } else if (model.family === "factcheck" && opts.prior) {
      for (const build of builds) {
        const m = pipeline.build(publicFor(build)).build.manifest;
        m.calibration ??= CalibrationFit.parse({ build_hash: m.build_hash, fitted_at: "", temperatures: {} });
        const cal = m.calibration as Record<string, unknown>;
        cal["factcheck"] = { ...((cal["factcheck"] as object | undefined) ?? {}), prior: opts.prior };
      }
    }
    for (const build of builds) {
      const name = publicFor(build);
      const hash = pipeline.build(name).build.manifest.build_hash;
      const prior = model.family === "factcheck" ? claimFit(pipeline.build(name)).prior : null;
      const priorTag = `${general ? "-general" : ""}${prior && prior.weight > 0 ? `-cf${prior.weight}~${Buffer.from(prior.state).toString("hex")}` : ""}`;
      const items: ScoredItem[] = [];
      for (const file of opts.data) {
        const requests =
          model.family === "codesearch"
            ? codeSearchRequests(spreadRows(readCodeSearch(file), opts.limit))
            : factCheckRequests(spreadRows(readFactCheck(file), opts.limit));
        const cache = path.join(cacheDir, `${model.family}-p${FAMILY_PROMPT_VERSION}-${hash}${priorTag}-${path.basename(file, ".jsonl")}.jsonl`);
        io.stderr(`running ${name} (${build}) on ${path.basename(file)}: ${requests.length} requests\n`);
        const recs = await runScored(pipeline, name, requests, cache, (d, t) => io.stderr(`\r  ${d}/${t}`));
        io.stderr("\n");
        for (const r of recs) {
          items.push(...r.items);
          ms.set(build, [...(ms.get(build) ?? []), r.ms]);
          tokens.set(build, [...(tokens.get(build) ?? []), r.inputTokens]);
        }
      }
      scored.set(build, items);
    }
    const dataNote = opts.data.map((f) => `${path.basename(f)}${opts.limit ? ` (--limit ${opts.limit})` : ""}`);
    const mean = (xs: number[] | undefined) => (xs && xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN);
    const small = scored.get(model.build)!;
    const large = model.escalateTo ? scored.get(model.escalateTo)! : null;
    let report = `## ${model.family} calibration (${opts.data.map((f) => path.basename(f)).join(", ")}${opts.limit ? `, --limit ${opts.limit}` : ""})\n\n`;
    report += `Latency per request (mean, ms): ${builds.map((b) => `${b} ${fmt(mean(ms.get(b)), 0)}`).join(", ")}; input tokens per request: ${builds.map((b) => `${b} ${fmt(mean(tokens.get(b)), 0)}`).join(", ")}\n\n`;

    if (model.family === "codesearch") {
      const fitFor = (train: ScoredItem[]) => fitRecall(train, opts.target);
      const bandFor = (train: ScoredItem[], f: RecallFit): Band => fitBand(train.filter((i) => !i.overflow).map((i) => i.raw), f.threshold, opts.bandFraction);
      // Cross-validated, pooled over the held-out folds.
      const folds = foldsByGroup(small, opts.folds);
      const groupsOf = folds.map((f) => new Set(f.map((i) => i.group)));
      const pooled: Record<string, { raw: number; needed: boolean; overflow?: boolean }[]> = { lite: [], max: [], base: [], raw_lite: [], raw_max: [] };
      let escalatedShare = 0;
      groupsOf.forEach((testGroups) => {
        const tr = (xs: ScoredItem[]) => xs.filter((i) => !testGroups.has(i.group));
        const te = (xs: ScoredItem[]) => xs.filter((i) => testGroups.has(i.group));
        const sFit = fitFor(tr(small));
        const push = (key: string, xs: ScoredItem[], fits: (i: number) => RecallFit | null) =>
          xs.forEach((it, n) => pooled[key]!.push({ raw: it.overflow ? 1 : adjustForRecall(it.raw, fits(n)), needed: it.label, ...(it.overflow ? { overflow: true } : {}) }));
        const sTest = te(small);
        push("lite", sTest, () => sFit);
        push("raw_lite", sTest, () => null);
        if (large) {
          const lFit = fitFor(tr(large));
          const lTest = te(large);
          push("max", lTest, () => lFit);
          push("raw_max", lTest, () => null);
          const band = bandFor(tr(small), sFit);
          const { items, fromLarge } = escalatedItems(sTest, lTest, band);
          escalatedShare += fromLarge.filter(Boolean).length;
          push("base", items, (n) => (fromLarge[n] ? lFit : sFit));
        }
      });
      const rows: NameFigures[] = [];
      const row = (name: string, key: string, rawKey?: string) => {
        if (pooled[key]!.length === 0) return;
        const a = recallAt(pooled[key]!, null);
        const u = rawKey ? recallAt(pooled[rawKey]!, null) : null;
        rows.push({ name, "recall (raw > 0.5)": u?.recall ?? null, "kept (raw)": u?.keptFraction ?? null, "recall (noul > 0.5)": a.recall, kept: a.keptFraction, items: a.items });
      };
      row(publicFor(model.build), "lite", "raw_lite");
      if (large) {
        row(opts.model, "base");
        row(publicFor(model.escalateTo!), "max", "raw_max");
      }
      report += `${opts.folds}-fold cross-validation by query, target recall ${opts.target}:\n\n`;
      report += table(rows, ["recall (raw > 0.5)", "kept (raw)", "recall (noul > 0.5)", "kept", "items"]);
      if (large) report += `\nEscalated (held-out): ${fmt(escalatedShare / small.length)} of items.\n`;
      // Final fits on everything.
      const sFit = fitFor(small);
      const patches: [string, Record<string, unknown>][] = [[model.build, { codesearch: { recall: sFit, ...(large ? { band: bandFor(small, sFit) } : {}) } }]];
      if (large) patches.push([model.escalateTo!, { codesearch: { recall: fitFor(large) } }]);
      report += `\nFits: ${patches.map(([b, p]) => `${b} ${JSON.stringify(p)}`).join("; ")}\n`;
      if (opts.write) {
        for (const [b, p] of patches) {
          const lb = pipeline.build(publicFor(b));
          const existing = fs.existsSync(path.join(CALIBRATION_DIR, `${b}.json`)) ? readCalibrationFile(path.join(CALIBRATION_DIR, `${b}.json`)) : null;
          const section = { ...((existing?.codesearch as object | undefined) ?? {}), ...(p.codesearch as object), data: dataNote };
          writeSection(b, lb.build.manifest.build_hash, path.basename(lb.build.dir), { codesearch: section }, io);
        }
      }
    } else {
      const IDENTITY = { a: 1, b: 0 };
      // The general noul map of a build as a Platt: the served map (noulLogit) is affine in the log-odds.
      const generalMap = (build: string) => {
        const c = pipeline.build(publicFor(build)).build.manifest.calibration;
        const b = noulLogit(0, c, NOUL_KEY);
        return { a: noulLogit(1, c, NOUL_KEY) - b, b };
      };
      const fitSmall = (xs: ScoredItem[]) => (general ? generalMap(model.build) : fitFactCheckPlatt(xs));
      const fitLarge = (xs: ScoredItem[]) => (general ? generalMap(model.escalateTo!) : fitFactCheckPlatt(xs));
      const folds = foldsByGroup(small, opts.folds);
      const groupsOf = folds.map((f) => new Set(f.map((i) => i.group)));
      const key = (i: ScoredItem) => `${i.group}/${i.id}`;
      const cal = (pl: { a: number; b: number }, raw: number) => sigmoid(pl.a * logit(raw) + pl.b);
      // The band decides only for one-window documents: the served path sends longer ones to the large build.
      const oneWindow = (xs: ScoredItem[]) => xs.filter((i) => (i.windows ?? 1) === 1);
      // Held-out figures with or without Platt per build; run twice: to decide, then with the decision.
      const crossValidate = (useSmall: boolean, useLarge: boolean) => {
        const pooled: Record<string, { p: number[]; y: boolean[] }> = {};
        const add = (k: string, p: number, y: boolean) => {
          pooled[k] ??= { p: [], y: [] };
          pooled[k]!.p.push(p);
          pooled[k]!.y.push(y);
        };
        let escalated = 0;
        groupsOf.forEach((testGroups) => {
          const tr = (xs: ScoredItem[]) => xs.filter((i) => !testGroups.has(i.group));
          const te = (xs: ScoredItem[]) => xs.filter((i) => testGroups.has(i.group));
          const sP = useSmall ? fitSmall(tr(small)) : IDENTITY;
          const band = fitBand(oneWindow(tr(small)).map((i) => cal(sP, i.raw)), 0.5, opts.bandFraction);
          const lP = large ? (useLarge ? fitLarge(tr(large)) : IDENTITY) : null;
          const lMap = new Map((large ? te(large) : []).map((i) => [key(i), i]));
          for (const it of te(small)) {
            const c = cal(sP, it.raw);
            add("lite raw", it.raw, it.label);
            add("lite", c, it.label);
            const l = lMap.get(key(it));
            if (l && lP) {
              add("max raw", l.raw, l.label);
              add("max", cal(lP, l.raw), l.label);
              const esc = factCheckReadByLarge(it, c, band);
              if (esc) escalated++;
              add("base", esc ? cal(lP, l.raw) : c, it.label);
            }
          }
        });
        return { pooled, escalated };
      };
      const ece = (x: { p: number[]; y: boolean[] } | undefined) => (x ? binaryScore(x.p, x.y).ece : Infinity);
      // Leave-one-dataset-out (the set is the claim id's prefix: summedits-…, wice-…): each set
      // scored with a Platt map fitted on the others only. k-fold by document shares the set's
      // source and label balance and overstated what unseen rows showed (issue 18).
      const setOf = (i: ScoredItem) => i.id.split("-")[0]!;
      const lodo = (xs: ScoredItem[], fit: (train: ScoredItem[]) => { a: number; b: number }) => {
        const sets = [...new Set(xs.map(setOf))];
        const out = { raw: { p: [] as number[], y: [] as boolean[] }, map: { p: [] as number[], y: [] as boolean[] }, rows: [] as NameFigures[] };
        if (sets.length < 2) return null;
        for (const d of sets) {
          const te = xs.filter((i) => setOf(i) === d);
          const pl = fit(xs.filter((i) => setOf(i) !== d));
          const p = te.map((i) => cal(pl, i.raw));
          const y = te.map((i) => i.label);
          out.raw.p.push(...te.map((i) => i.raw));
          out.raw.y.push(...y);
          out.map.p.push(...p);
          out.map.y.push(...y);
          const a = binaryScore(p, y);
          const b = binaryScore(te.map((i) => i.raw), y);
          out.rows.push({ name: d, n: a.n, "bal. acc": a.balancedAccuracy, "ECE before": b.ece, "ECE after": a.ece, AUROC: a.auroc });
        }
        return out;
      };
      const probe = crossValidate(true, true);
      const lodoSmall = lodo(small, fitSmall);
      const lodoLarge = large ? lodo(large, fitLarge) : null;
      // A map ships only where it lowers the held-out ECE: leave-one-dataset-out where the data
      // holds several sets, k-fold by document otherwise. Else the build keeps identity. The
      // general map is not the family's to gate: `assay calibrate` gated it on the pooled sets.
      const useSmall = general || (lodoSmall ? ece(lodoSmall.map) < ece(lodoSmall.raw) : ece(probe.pooled["lite"]) < ece(probe.pooled["lite raw"]));
      const useLarge = large !== null && (general || (lodoLarge ? ece(lodoLarge.map) < ece(lodoLarge.raw) : ece(probe.pooled["max"]) < ece(probe.pooled["max raw"])));
      const mapNote = general
        ? "the build's general noul map, fitted by `assay calibrate` on BoolQ and both fact check sets (these rows were in its fit: see its own leave-one-dataset-out figures)"
        : "Platt fitted on the other set";
      for (const [b, l] of [[model.build, lodoSmall], [model.escalateTo, lodoLarge]] as const) {
        if (!b || !l) continue;
        report += `Per set, ${b} (${mapNote}; "before" = raw):\n\n${table(l.rows, ["n", "bal. acc", "ECE before", "ECE after", "AUROC"])}\n`;
      }
      const { pooled, escalated } = crossValidate(useSmall, useLarge);
      const rows: NameFigures[] = [];
      const row = (name: string, k: string, rawK?: string) => {
        const s = pooled[k];
        if (!s) return;
        const a = binaryScore(s.p, s.y);
        const b = rawK && pooled[rawK] ? binaryScore(pooled[rawK]!.p, pooled[rawK]!.y) : null;
        rows.push({ name, n: a.n, "bal. acc": a.balancedAccuracy, "ECE before": b?.ece ?? null, "ECE after": a.ece, AUROC: a.auroc });
      };
      row(publicFor(model.build), "lite", "lite raw");
      if (large) {
        row(opts.model, "base");
        row(publicFor(model.escalateTo!), "max", "max raw");
      }
      report += `${opts.folds}-fold cross-validation by document (15-bin ECE; "after" = the map shipped, identity where Platt did not lower the held-out ECE):\n\n`;
      report += table(rows, ["n", "bal. acc", "ECE before", "ECE after", "AUROC"]);
      report += general
        ? "\nMap: each build's general noul map and prior (no family map).\n"
        : `\nPlatt kept: ${model.build} ${useSmall ? "yes" : "no (identity)"}${large ? `, ${model.escalateTo} ${useLarge ? "yes" : "no (identity)"}` : ""}.\n`;
      if (large) report += `Escalated (held-out): ${fmt(escalated / small.length)} of claims.\n`;
      const sP = useSmall ? fitSmall(small) : IDENTITY;
      // With the general map the family ships no map of its own (claimFit then falls back to the general one).
      const own = (pl: { a: number; b: number }) => (general ? {} : { [FACTCHECK_CALIBRATION_KEY]: pl });
      const patches: [string, Record<string, unknown>, Band | null][] = [
        [model.build, own(sP), large ? fitBand(oneWindow(small).map((i) => cal(sP, i.raw)), 0.5, opts.bandFraction) : null],
      ];
      if (large) patches.push([model.escalateTo!, own(useLarge ? fitLarge(large) : IDENTITY), null]);
      report += `\nFits: ${patches.map(([b, p, band]) => `${b} ${JSON.stringify(p)}${band ? ` band ${JSON.stringify(band)}` : ""}`).join("; ")}\n`;
      if (opts.write) {
        for (const [b, platt, band] of patches) {
          const lb = pipeline.build(publicFor(b));
          const file = path.join(CALIBRATION_DIR, `${b}.json`);
          const existing = fs.existsSync(file) ? readCalibrationFile(file) : null;
          const kept = { ...((existing?.build_hash === lb.build.manifest.build_hash ? existing?.platt : undefined) ?? {}) };
          if (general) delete kept[FACTCHECK_CALIBRATION_KEY];
          const { prior: _dropped, ...section } = (existing?.factcheck as Record<string, unknown> | undefined) ?? {};
          writeSection(
            b,
            lb.build.manifest.build_hash,
            path.basename(lb.build.dir),
            {
              platt: { ...kept, ...platt },
              factcheck: {
                ...(general ? section : ((existing?.factcheck as object | undefined) ?? {})),
                ...(band ? { band } : {}),
                ...(priorOf(lb) ? { prior: priorOf(lb) } : {}),
                data: dataNote,
              },
            },
            io,
          );
        }
      }
    }
    io.stdout(report);
    return report;
  } finally {
    await pipeline.close();
  }
}
