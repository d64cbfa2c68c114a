/**
 * `assay calibrate --model NAME --data FILE... [--limit N] [--split P/N] [--folds K] [--out FILE]`
 *
 * Runs labelled dev sets through the engine in-process with identity
 * calibration (the same EnginePipeline and eval runner as `assay eval`,
 * under the configured option-order debiasing), fits a map per question type
 * and option count (src/eval/calibrate.ts), prints K-fold cross-validated
 * ECE before and after, and writes the fit with the model's build hash to
 * models/calibration/<build>.json, which the loader applies to that build
 * only. Sections of an existing file that this command does not fit (other
 * families' keys and maps) are kept.
 */
import fs from "node:fs";
import path from "node:path";
import { InvalidArgumentError, type Command } from "commander";
import { loadConfig } from "../config/index.js";
import { EnginePipeline } from "../pipeline/index.js";
import { CALIBRATION_DIR, CalibrationFit, readBuild, readCalibrationFile } from "../models/manifest.js";
import { ModelRegistry } from "../models/registry.js";
import { parseSplit, readDataset, UnsupportedDataset, type Dataset, type Split } from "../eval/datasets.js";
import { runDatasets } from "../eval/runner.js";
import { confidenceTable, fitConfidence } from "../eval/confidence-fit.js";
import { fitQuestionMaps, questionFitTable } from "../eval/question-fit.js";
import { calibrationForMode } from "../probability/index.js";
import {
  crossValidate,
  crossValidationTable,
  leaveOneDatasetOut,
  fitItems,
  fitItemsFromResults,
  fitShippedMaps,
  MANY_KEY,
  regimeKey,
  regimeOfKey,
  type CrossValidation,
  type FitItem,
} from "../eval/calibrate.js";
import type { CliIO } from "./keys.js";
import { defined, positiveInt } from "./options.js";
import { progressBar } from "./progress.js";
import { calibrateFamilyCommand } from "./calibrate-family.js";

export interface CalibrateCliOptions {
  model: string;
  data: string[];
  limit?: number;
  split?: Split;
  folds: number;
  out?: string;
  write: boolean;
  debias?: "off" | "cyclic";
  shifts?: number;
  concurrency: number;
  /** Also write the fit items (label log-probabilities, gold) here. */
  readouts?: string;
  /** Fit on the main pass of `assay eval … --calibration none` results.json files instead of running the model. */
  fromResults?: string[];
  /** Refit from `--readouts` files of earlier runs (one set each, or several) instead of running the model. */
  fromReadouts?: string[];
  /** Content-free prior weight per question type for the run (default: the shipped file's). */
  prior?: Record<string, number>;
  /** The neutral state each type's prior is read against (default: the shipped file's, else "N/A"). */
  priorState?: Record<string, string>;
  /** Whether the prompt shows the worked examples for the run (default: the shipped file's). */
  demonstrations?: boolean;
  /** "choice": score files' rows read as choice questions over their level names. */
  readAs?: "choice";
  /** Write the confidence maps alone: the file's temperatures, Platt and top-label maps stay as they are. */
  confidenceOnly?: boolean;
  /** Fit and write maps for single questions alone (src/eval/question-fit.ts): the file's other maps stay as they are. */
  perQuestion?: boolean;
}

/** `--read-as`: only "choice" (score rows as choice questions). */
export function parseReadAs(text: string): "choice" {
  if (text !== "choice") throw new InvalidArgumentError(`--read-as takes "choice" (score rows as choice questions over their level names), got "${text}"`);
  return "choice";
}

/** "score=,noul=N/A" → the neutral state per question type (empty allowed). */
export function parsePriorState(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const part of text.split(",")) {
    const m = /^\s*(noul|choice|score)=(.*)$/.exec(part);
    if (!m) throw new InvalidArgumentError(`--prior-state takes TYPE=TEXT pairs (e.g. score=,noul=N/A), got "${part}"`);
    out[m[1]!] = m[2]!;
  }
  return out;
}

export function parseOnOff(text: string): boolean {
  if (text === "on") return true;
  if (text === "off") return false;
  throw new InvalidArgumentError(`takes on or off, got "${text}"`);
}

/** "noul=1,choice=1,score=0" → weights per question type, each in [0, 1]. */
export function parsePrior(text: string): Record<string, number> {
  const out: Record<string, number> = {};
  for (const part of text.split(",").map((p) => p.trim()).filter(Boolean)) {
    const m = /^(noul|choice|score)=([0-9.]+)$/.exec(part);
    const w = Number(m?.[2]);
    if (!m || !(w >= 0 && w <= 1)) throw new InvalidArgumentError(`--prior takes TYPE=W pairs with W in [0, 1] (e.g. noul=1,choice=1,score=0), got "${part}"`);
    out[m[1]!] = w;
  }
  return out;
}

export interface CalibrateResult {
  fit: CalibrationFit;
  file: string | null;
  crossValidation: CrossValidation[];
  items: FitItem[];
}

const GENERAL_KEY = /^(noul|choice|score):/;

/**
 * The new fit merged into an existing file for the same build: the general
 * keys (noul/choice/score) and the prior of the types the new fit was run on
 * (`fitted`, every type when not given) are the new fit's alone; the other
 * types' keys, prior and figures, and the other families' sections, are
 * kept. A file for another build is replaced whole.
 */
export function mergeFit(existing: CalibrationFit | null, fit: CalibrationFit, fitted?: ReadonlySet<string>): CalibrationFit {
  if (!existing || existing.build_hash !== fit.build_hash) return fit;
  const { prior: oldPrior, prior_state: oldState, demonstrations: oldDemonstrations, ...rest } = existing;
  // The worked examples change every type's readings: maps kept from the file must have been read the same way.
  const keepsGeneral = [existing.temperatures, existing.platt, existing.top_label].some((m) =>
    Object.keys(m ?? {}).some((k) => GENERAL_KEY.test(k) && fitted !== undefined && !fitted.has(k.split(":")[0]!)),
  );
  if (keepsGeneral && (oldDemonstrations ?? false) !== (fit.demonstrations ?? false)) {
    throw new Error("the file's maps for the other question types were read " + (oldDemonstrations ? "with" : "without") + " the worked examples: refit every type (--data with every set) under one setting");
  }
  // Keys kept from the existing file: the families', and the general types this fit did not run on.
  const typeOf = (key: string) => key.split(":")[0]!;
  const kept = <T>(section: Record<string, T> | undefined): Record<string, T> =>
    Object.fromEntries(Object.entries(section ?? {}).filter(([k]) => !GENERAL_KEY.test(k) || (fitted !== undefined && !fitted.has(typeOf(k)))));
  const others = <T>(m: Record<string, T> | undefined) => (fitted ? Object.fromEntries(Object.entries(m ?? {}).filter(([t]) => !fitted.has(t))) : {});
  const prior = { ...others(oldPrior), ...(fit.prior ?? {}) };
  const priorState = { ...(fit.prior ? others(oldState) : {}), ...(fit.prior_state ?? {}) };
  const keptList = (xs: readonly string[] | undefined) => (fitted ? (xs ?? []).filter((t) => !fitted.has(t.split(":")[0]!)) : []);
  const list = (f: CalibrationFit, k: string) => ((f as Record<string, unknown>)[k] as string[] | undefined) ?? [];
  const cv = (f: CalibrationFit) => ((f as Record<string, unknown>)["cross_validation"] as { key: string }[] | undefined) ?? [];
  return {
    ...rest,
    ...fit,
    // A refit decides every key of its types afresh (a key it dropped, say a
    // per-set `choice:4`, must not survive); the families' keys are kept.
    temperatures: { ...kept(existing.temperatures), ...fit.temperatures },
    platt: { ...kept(existing.platt), ...(fit.platt ?? {}) },
    // Top-label maps too: one the refit left out must not survive from the old file.
    top_label: { ...kept(existing.top_label), ...(fit.top_label ?? {}) },
    // Confidence maps: those of the types this fit ran on are decided afresh, the others kept.
    ...(fit.confidence || existing.confidence
      ? { confidence: { ...Object.fromEntries(Object.entries(existing.confidence ?? {}).filter(([t]) => fitted !== undefined && !fitted.has(t))), ...(fit.confidence ?? {}) } }
      : {}),
    ...(Object.keys(prior).length > 0 ? { prior } : {}),
    ...(Object.keys(prior).length > 0 && Object.keys(priorState).length > 0 ? { prior_state: priorState } : {}),
    ...(fitted
      ? {
          identity_kept: [...keptList(list(existing, "identity_kept")), ...list(fit, "identity_kept")],
          top_label_left_out: [...keptList(list(existing, "top_label_left_out")), ...list(fit, "top_label_left_out")],
          cross_validation: [...cv(existing).filter((r) => !fitted.has(typeOf(r.key))), ...cv(fit)],
          // A file read again replaces its note; the other types' files stay listed.
          data: [...existing.data.filter((d) => !fit.data.some((n) => n.split(" ")[0] === d.split(" ")[0])), ...fit.data],
        }
      : { data: [...new Set([...fit.data])] }),
  } as CalibrationFit;
}

export async function calibrateCommand(opts: CalibrateCliOptions, io: CliIO): Promise<CalibrateResult> {
  if (opts.fromResults) return calibrateFromResults(opts, opts.fromResults, io);
  if (opts.fromReadouts) return calibrateFromReadouts(opts, opts.fromReadouts, io);
  const datasets: Dataset[] = [];
  for (const file of opts.data) {
    try {
      datasets.push(readDataset(file, opts.limit, opts.split, opts.readAs));
    } catch (e) {
      if (!(e instanceof UnsupportedDataset)) throw e;
      io.stderr(`assay calibrate: skipping ${e.message}\n`);
    }
  }
  if (datasets.length === 0) throw new Error("no dataset to fit on");

  const config = loadConfig(io.env, {
    ...(opts.debias !== undefined ? { debias: opts.debias } : {}),
    ...(opts.shifts !== undefined ? { debiasMaxShifts: opts.shifts } : {}),
  });
  // Fit on the model's own readings: the build is loaded without its fit,
  // all but the content-free prior, which is part of the reading.
  let prior: Record<string, number> | undefined;
  let priorState: Record<string, string> | undefined;
  let demonstrations = false;
  const readingFit = (shipped: CalibrationFit | null, manifest: { build_hash: string }): CalibrationFit | null => {
    prior = opts.prior ?? shipped?.prior;
    priorState = opts.priorState ?? shipped?.prior_state;
    demonstrations = opts.demonstrations ?? shipped?.demonstrations ?? false;
    if (!prior && !demonstrations) return null;
    return {
      build_hash: manifest.build_hash,
      fitted_at: "",
      temperatures: {},
      ...(prior ? { prior } : {}),
      ...(prior && priorState ? { prior_state: priorState } : {}),
      ...(demonstrations ? { demonstrations } : {}),
      data: [],
    };
  };
  const pipeline = await EnginePipeline.create(config, (m) => io.stderr(`${m}\n`), { calibration: { model: opts.model, fit: readingFit } });
  try {
    if (!pipeline.registry.has(opts.model)) {
      throw new Error(`unknown model "${opts.model}"; available models: ${pipeline.registry.names().join(", ")}`);
    }
    const resolved = pipeline.registry.resolve(opts.model);
    if (resolved.family !== "general") throw new Error(`model "${opts.model}" is a ${resolved.family} model; calibrate fits general models`);
    const lb = pipeline.build(opts.model);
    const manifest = lb.build.manifest;
    const runs = await runDatasets(datasets, { pipeline, model: opts.model, calibration: null, concurrency: opts.concurrency, flip: false, progress: progressBar(io, "calibrate") });
    const items = fitItems(runs);
    const failed = runs.reduce((n, r) => n + r.items.filter((i) => i.main === null).length, 0);
    if (failed > 0) io.stderr(`assay calibrate: ${failed} items got no answer and are left out\n`);
    const limitNote = `${opts.limit !== undefined ? ` --limit ${opts.limit}` : ""}${opts.split ? ` --split ${opts.split.part}/${opts.split.of}` : ""}`;
    const header: FitHeader = {
      ...(prior ? { prior } : {}),
      ...(prior && priorState ? { prior_state: priorState } : {}),
      ...(demonstrations ? { demonstrations } : {}),
      build_hash: manifest.build_hash,
      build: resolved.build,
      dir: path.basename(lb.build.dir),
      debias: config.debias,
      debias_max_shifts: config.debiasMaxShifts,
      data: datasets.map((d) => `${path.basename(d.file)}${d.name.endsWith("@choice") ? "@choice" : ""} (${d.items.length} of ${d.totalRows} rows${limitNote})`),
    };
    if (opts.readouts) {
      fs.mkdirSync(path.dirname(path.resolve(opts.readouts)), { recursive: true });
      const saved: ReadoutsFile = { build_hash: manifest.build_hash, header, items };
      fs.writeFileSync(opts.readouts, JSON.stringify(saved));
    }
    // A site's own build (no recipe: `assay build --from`) keeps its fit beside its manifest, where the loader
    // reads it (models/manifest.ts, findCalibration); the shipped builds' fits live in models/calibration/.
    const site = pipeline.registry.file.builds[resolved.build]?.recipe === undefined;
    return finish(site && !opts.out ? { ...opts, out: path.join(lb.build.dir, "calibration.json") } : opts, io, items, header);
  } finally {
    await pipeline.close();
  }
}

interface FitHeader {
  /** Content-free prior weights the readings were taken under (shipped with the maps fitted on them). */
  prior?: Record<string, number>;
  prior_state?: Record<string, string>;
  /** The prompt showed the worked examples (shipped with the maps fitted on its readings). */
  demonstrations?: boolean;
  build_hash: string;
  build: string;
  dir: string;
  debias: string;
  debias_max_shifts: number;
  data: string[];
}

/**
 * Refit from `--readouts` files of earlier runs (the label log-probabilities
 * they read, under the prior they read them with): the gate and the maps
 * again, without running the model. Several files merge, so a long refit can
 * be read one set at a time; they must come from this build and agree on
 * everything that shapes a reading (prior, neutral states, debias).
 */
async function calibrateFromReadouts(opts: CalibrateCliOptions, files: readonly string[], io: CliIO): Promise<CalibrateResult> {
  const config = loadConfig(io.env);
  const registry = ModelRegistry.load(config.modelsConfig, config.modelsDir);
  if (!registry.has(opts.model)) throw new Error(`unknown model "${opts.model}"; available models: ${registry.names().join(", ")}`);
  const resolved = registry.resolve(opts.model);
  const manifest = readBuild(resolved.buildDir).manifest;
  const items: FitItem[] = [];
  let header: FitHeader | null = null;
  for (const file of files) {
    const saved = JSON.parse(fs.readFileSync(file, "utf8")) as ReadoutsFile | FitItem[];
    if (Array.isArray(saved)) throw new Error(`${file} holds no header (build, prior): write it again with this version's --readouts`);
    if (saved.build_hash !== manifest.build_hash) throw new Error(`${file} was read on build ${saved.build_hash}, not on ${manifest.build_hash} (${opts.model})`);
    if (header === null) {
      header = { ...saved.header, data: [...saved.header.data] };
    } else {
      const shape = (h: FitHeader) => JSON.stringify([h.prior ?? null, h.prior_state ?? null, h.debias, h.debias_max_shifts, h.demonstrations ?? false]);
      if (shape(saved.header) !== shape(header)) {
        throw new Error(`${file} was read under another prior, neutral state, debias setting or prompt than ${files[0]}: ${shape(saved.header)} vs ${shape(header)}`);
      }
      const seen = new Set(items.map((it) => it.dataset));
      const again = [...new Set(saved.items.map((it) => it.dataset))].filter((d) => seen.has(d));
      if (again.length > 0) throw new Error(`${file} reads ${again.join(", ")} again: give each set once`);
      header.data.push(...saved.header.data);
    }
    items.push(...saved.items);
  }
  if (header === null) throw new Error("give at least one --from-readouts file");
  return finish(opts, io, items, header);
}

type ConfidenceRecord = { dataset: string; type: string };

/**
 * `--confidence-only`: the confidence sections of `fit` for the types it
 * read, those of `existing` for the others (their maps, validation rows,
 * feature choices and the data they were judged on), so that a refit of one
 * type does not drop the record of another.
 */
function mergeConfidence(existing: CalibrationFit, fit: CalibrationFit, covered: ReadonlySet<string>, data: readonly string[]): CalibrationFit {
  const old = existing as Record<string, unknown>;
  const fresh = fit as Record<string, unknown>;
  const keepMaps = Object.fromEntries(Object.entries(existing.confidence ?? {}).filter(([type]) => !covered.has(type)));
  const oldRows = ((old["confidence_validation"] as ConfidenceRecord[] | undefined) ?? []).filter((r) => !covered.has(r.type));
  const keptSets = new Set(oldRows.map((r) => r.dataset));
  const oldFeatures = Object.fromEntries(Object.entries((old["confidence_features"] as Record<string, unknown> | undefined) ?? {}).filter(([type]) => !covered.has(type)));
  // A data entry reads "choice_agnews.jsonl (120 of 300 rows …)" or "score_sst5.jsonl@choice (…)",
  // its set "choice_agnews" or "score_sst5@choice": kept where its set's rows are.
  const oldData = ((old["confidence_data"] as string[] | undefined) ?? []).filter((d) => keptSets.has(d.split(" ")[0]!.replace(".jsonl", "")));
  return {
    ...existing,
    confidence: { ...keepMaps, ...fit.confidence },
    confidence_validation: [...oldRows, ...((fresh["confidence_validation"] as ConfidenceRecord[] | undefined) ?? [])],
    confidence_features: { ...oldFeatures, ...((fresh["confidence_features"] as Record<string, unknown> | undefined) ?? {}) },
    confidence_data: [...oldData, ...data],
    confidence_fitted_at: fit.fitted_at,
  } as CalibrationFit;
}

/** What `--readouts` writes: the fit items and the header of the run that read them. */
interface ReadoutsFile {
  build_hash: string;
  header: FitHeader;
  items: FitItem[];
}

async function calibrateFromResults(opts: CalibrateCliOptions, files: string[], io: CliIO): Promise<CalibrateResult> {
  const config = loadConfig(io.env);
  const registry = ModelRegistry.load(config.modelsConfig, config.modelsDir);
  if (!registry.has(opts.model)) throw new Error(`unknown model "${opts.model}"; available models: ${registry.names().join(", ")}`);
  const resolved = registry.resolve(opts.model);
  const manifest = readBuild(resolved.buildDir).manifest;
  const items: FitItem[] = [];
  const data: string[] = [];
  let debias: string | null = null;
  let shifts = config.debiasMaxShifts;
  for (const file of files) {
    const r = JSON.parse(fs.readFileSync(file, "utf8")) as Parameters<typeof fitItemsFromResults>[0] & {
      resolved: { build: string | null } | null;
      debias?: string;
      options: { limit: number | null; split?: string | null };
    };
    if (r.resolved?.build !== manifest.build_hash) {
      throw new Error(`${file} was taken on build ${r.resolved?.build ?? "unknown"}, not on ${manifest.build_hash} (${opts.model})`);
    }
    const mode = (r.debias ?? "off").startsWith("cyclic") ? "cyclic" : "off";
    if (debias !== null && debias !== mode) throw new Error(`${file}: debias ${mode}, but the other results are ${debias}`);
    debias = mode;
    const m = /at most (\d+)/.exec(r.debias ?? "");
    if (m) shifts = Number(m[1]);
    items.push(...fitItemsFromResults(r));
    for (const d of r.datasets) {
      data.push(
        `${path.basename(d.summary.file)} (${d.items.filter((i) => i.main).length} rows${r.options.limit !== null ? ` --limit ${r.options.limit}` : ""}` +
          `${r.options.split ? ` --split ${r.options.split}` : ""}; from ${path.basename(path.dirname(file))}/results.json)`,
      );
    }
  }
  return finish(opts, io, items, {
    build_hash: manifest.build_hash,
    build: resolved.build,
    dir: path.basename(resolved.buildDir),
    debias: debias ?? "off",
    debias_max_shifts: shifts,
    data,
  });
}

/** n-weighted mean of a metric over rows (Infinity where one is missing). */
function pooled(rows: readonly CrossValidation[], pick: (r: CrossValidation) => number | null): number {
  const n = rows.reduce((s, r) => s + r.before.n, 0);
  return rows.reduce((s, r) => s + r.before.n * (pick(r) ?? Infinity), 0) / Math.max(1, n);
}

/** How a file's questions are read: what its maps, a question's own included, were fitted under. */
const readUnder = (f: Pick<CalibrationFit, "prior" | "prior_state" | "demonstrations" | "debias">) =>
  JSON.stringify([f.prior ?? {}, f.prior_state ?? {}, f.demonstrations ?? false, f.debias ?? null]);

/**
 * `--per-question`: a map for every question asked of enough labelled states,
 * judged against what the build's file serves for it now, written into that
 * file's `questions` (every other section as it was). A question refitted
 * here is decided afresh: its old map goes whether or not a new one ships.
 */
async function finishPerQuestion(opts: CalibrateCliOptions, io: CliIO, items: FitItem[], header: FitHeader): Promise<CalibrateResult> {
  const file = opts.out ?? path.join(CALIBRATION_DIR, `${header.build}.json`);
  const existing = fs.existsSync(file) ? readCalibrationFile(file) : null;
  if (!existing || existing.build_hash !== header.build_hash) {
    throw new Error(`--per-question fits maps on top of the build's own: ${file} holds no fit for build ${header.build_hash}; fit the build first (assay calibrate)`);
  }
  if (readUnder(existing) !== readUnder(header)) {
    throw new Error(`--per-question: these readings were taken another way (prior, neutral states, worked examples or debias) than ${file}'s maps were fitted on`);
  }
  if (!items.some((it) => it.question && it.reading)) {
    throw new Error("--per-question needs readings that name their question: a run (--data), or --readouts files written by this version");
  }
  const serving = calibrationForMode(existing, header.debias);
  const fitted = fitQuestionMaps(items, serving, opts.folds);
  io.stdout(`maps for single questions (${opts.folds}-fold within each question, against the build's maps):\n${questionFitTable(fitted, opts.folds)}`);
  if (opts.write) {
    const decided = new Set(fitted.rows.filter((r) => r.after !== null).map((r) => r.key));
    const kept = Object.fromEntries(Object.entries(existing.questions ?? {}).filter(([key]) => !decided.has(key)));
    const old = existing as Record<string, unknown>;
    const rows = ((old["questions_validation"] as { key: string }[] | undefined) ?? []).filter((r) => !decided.has(r.key));
    const merged = {
      ...existing,
      questions: { ...kept, ...fitted.maps },
      questions_validation: [...rows, ...fitted.rows.filter((r) => r.after !== null).map((r) => ({ ...r, validation: `${opts.folds}-fold` }))],
      questions_fitted_at: new Date().toISOString(),
    };
    fs.writeFileSync(file, JSON.stringify(merged, null, 2) + "\n");
    io.stderr(`wrote ${file}: ${Object.keys(fitted.maps).length} question map(s) fitted, ${Object.keys(merged.questions).length} in the file\n`);
  }
  return { fit: existing, file: opts.write ? file : null, crossValidation: [], items };
}

async function finish(opts: CalibrateCliOptions, io: CliIO, items: FitItem[], header: FitHeader): Promise<CalibrateResult> {
  if (opts.perQuestion) return finishPerQuestion(opts, io, items, header);
  const cv = crossValidate(items, opts.folds);
  const lodo = leaveOneDatasetOut(items);
  const maps = fitShippedMaps(items);
  // A map ships only where it lowers the leave-one-dataset-out ECE of its
  // group (pooled over the held-out sets); a top-label map only where it
  // lowers it below the temperature's alone. The groups are the question
  // types, choice split by readout regime (few options read in every order,
  // `choice:*`; many read once and shortlisted, `choice:>8`). A group with a
  // single set has no such test: k-fold decides, and the report says so.
  const rejected: string[] = [];
  const noTopLabel: string[] = [];
  const setCount = (group: string) => new Set(items.filter((it) => regimeKey(it) === group).map((it) => it.dataset)).size;
  for (const group of ["noul:*", "choice:*", MANY_KEY, "score:*"]) {
    const rows = lodo.filter((r) => regimeOfKey(r.key) === group);
    const kf = cv.filter((r) => regimeOfKey(r.key) === group);
    if (kf.length === 0) continue;
    const type = group.split(":")[0]!;
    // Held-out sets of a group with one set were scored with another group's map: not this group's test.
    const judge = setCount(group) >= 2 && rows.length > 0 ? rows : kf;
    if (judge === kf && rows.length > 0) {
      io.stderr(`assay calibrate: ${rows.map((r) => r.dataset).join(", ")} is alone in ${group}: judged by k-fold; its leave-one-dataset-out row is another group's map applied to it\n`);
    }
    const name = group === MANY_KEY ? MANY_KEY : type;
    const mine = (section: Record<string, unknown>) => Object.keys(section).filter((k) => regimeOfKey(k) === group);
    // The lowest pooled held-out ECE of: identity, the temperature (noul: Platt), the temperature and the top-label map.
    const identity = pooled(judge, (r) => r.before.ece);
    const temperature = pooled(judge, (r) => r.afterTemperature.ece);
    const withTop = type === "noul" ? Infinity : pooled(judge, (r) => r.after.ece);
    if (!(Math.min(temperature, withTop) < identity)) {
      for (const k of mine(maps.temperatures)) delete maps.temperatures[k];
      for (const k of mine(maps.platt)) delete maps.platt[k];
      for (const k of mine(maps.top_label)) delete maps.top_label[k];
      // Said outright, or a many-option question would take the few-option regime's map.
      if (group === MANY_KEY) maps.temperatures[MANY_KEY] = 1;
      rejected.push(name);
      if (type !== "noul") noTopLabel.push(name);
      continue;
    }
    if (type !== "noul" && !(withTop < temperature && withTop < identity)) {
      for (const k of mine(maps.top_label)) delete maps.top_label[k];
      noTopLabel.push(name);
    }
  }
  if (rejected.length > 0) io.stderr(`assay calibrate: no leave-one-dataset-out gain for ${rejected.join(", ")}: left as identity\n`);
  if (noTopLabel.length > 0) io.stderr(`assay calibrate: no top-label map for ${noTopLabel.join(", ")} (it does not lower the leave-one-dataset-out ECE)\n`);
  const summary = (rows: CrossValidation[], how: string) =>
    rows.map((r) => ({
      dataset: r.dataset,
      key: r.key,
      validation: how,
      before: r.before,
      after_temperature: r.afterTemperature,
      ece_floor_temperature: r.floorTemperature,
      ...(r.type === "noul" ? {} : { after_top_label: r.after, ece_floor_top_label: r.floor }),
    }));
  // Confidence maps, where the run recorded the readings: judged against the maps the build ships now.
  const shippedFile = opts.out ?? path.join(CALIBRATION_DIR, `${header.build}.json`);
  const shippedFit = fs.existsSync(shippedFile) ? readCalibrationFile(shippedFile) : null;
  const shippedMaps = shippedFit && shippedFit.build_hash === header.build_hash ? { temperatures: shippedFit.temperatures, platt: shippedFit.platt, top_label: shippedFit.top_label } : null;
  const confidence = items.some((it) => it.reading) ? fitConfidence(items, shippedMaps) : null;
  const fit = CalibrationFit.parse({
    ...header,
    ...(confidence
      ? {
          confidence: confidence.maps,
          confidence_validation: confidence.rows.map((r) => ({ ...r, validation: "leave-one-dataset-out" })),
          confidence_features: confidence.choice,
        }
      : {}),
    fitted_at: new Date().toISOString(),
    temperatures: maps.temperatures,
    platt: maps.platt,
    top_label: maps.top_label,
    ...(header.prior ? { prior: header.prior } : {}),
    ...(header.prior_state ? { prior_state: header.prior_state } : {}),
    ...(header.demonstrations ? { demonstrations: true } : {}),
    identity_kept: rejected,
    top_label_left_out: noTopLabel,
    cross_validation: [...summary(cv, `${opts.folds}-fold`), ...summary(lodo, "leave-one-dataset-out")],
  });
  io.stdout(`${opts.folds}-fold, within each set:\n${crossValidationTable(cv, opts.folds)}`);
  io.stdout(`\nleave-one-dataset-out (maps fitted on the other sets of the type):\n${crossValidationTable(lodo, opts.folds).replace(/\(\d+-fold\)/g, "(LODO)")}`);
  if (confidence) io.stdout(`\nconfidence maps, leave-one-dataset-out (fitted on the other sets of the type), against the maps shipped before:\n${confidenceTable(confidence)}`);
  io.stdout(`\ntemperatures ${JSON.stringify(maps.temperatures)}\nplatt ${JSON.stringify(maps.platt)}\ntop_label ${JSON.stringify(maps.top_label)}\nprior ${JSON.stringify(header.prior ?? {})}\n`);
  let file: string | null = null;
  if (opts.write) {
    file = opts.out ?? path.join(CALIBRATION_DIR, `${header.build}.json`);
    const existing = fs.existsSync(file) ? readCalibrationFile(file) : null;
    if (existing && existing.build_hash !== fit.build_hash) {
      io.stderr(`assay calibrate: ${file} held a fit for build ${existing.build_hash}; replaced whole (its other sections were for that build)\n`);
    }
    if (opts.confidenceOnly && !(existing && existing.build_hash === fit.build_hash && confidence)) {
      throw new Error("--confidence-only needs readings of this build (a run or --from-readouts of this version) and a fit file for it to add the maps to");
    }
    // Types the data did not cover keep their maps: a refit of noul alone leaves choice and score as they were.
    const merged = opts.confidenceOnly
      ? mergeConfidence(existing!, fit, new Set(items.flatMap((it) => (it.reading ? [it.type] : []))), header.data)
      : mergeFit(existing, fit, new Set(items.map((it) => it.type)));
    // A question's own map was fitted on readings taken under the file's prior, neutral states,
    // worked examples and debiasing: where a refit changes any of them, it no longer applies.
    if (merged.questions && existing && readUnder(existing) !== readUnder(merged)) {
      io.stderr(`assay calibrate: ${Object.keys(merged.questions).length} map(s) for single questions dropped: the questions are read another way now; refit them (--per-question)\n`);
      delete merged.questions;
    }
    fs.mkdirSync(path.dirname(file), { recursive: true });
    fs.writeFileSync(file, JSON.stringify(merged, null, 2) + "\n");
    io.stderr(`wrote ${file} (build ${fit.build_hash}, debias ${header.debias})\n`);
  }
  return { fit, file, crossValidation: cv, items };
}

export function registerCalibrateCommand(program: Command, io: CliIO): void {
  program
    .command("calibrate")
    .description("fit calibration for a model build from labelled JSONL dev sets; prints cross-validated ECE before and after")
    .option("--model <name>", "public model name", "judge-latest")
    .option("--data <files...>", "dataset files (JSONL: noul, choice, score, fact check formats)")
    .option("--from-results <files...>", "fit on `assay eval --calibration none` results.json files instead of running the model")
    .option("--limit <n>", "at most N rows per file, evenly spaced", positiveInt("--limit"))
    .option("--split <part/parts>", "only rows i with i mod PARTS = PART (e.g. 0/2 to fit, 1/2 to evaluate)", parseSplit)
    .option("--folds <k>", "cross-validation folds", positiveInt("--folds"), 5)
    .option("--out <file>", "where to write the fit (default models/calibration/<build>.json)")
    .option("--no-write", "print the fit and its cross-validation only")
    .option("--debias <mode>", "off | cyclic (default: ASSAY_DEBIAS)")
    .option("--shifts <n>", "presentations per choice question at most (default: ASSAY_DEBIAS_MAX_SHIFTS)", positiveInt("--shifts"))
    .option("--concurrency <n>", "requests in flight at once", positiveInt("--concurrency"), 2)
    .option("--prior <weights>", "content-free prior weight per question type for the run, e.g. noul=1,choice=1,score=0 (default: the shipped file's)", parsePrior)
    .option("--prior-state <states>", "the neutral state each type's prior reads, e.g. score=,noul=N/A (default: the shipped file's, else N/A)", parsePriorState)
    .option("--demonstrations <on|off>", "show the worked examples before the state for the run (default: the shipped file's); the written file says which", parseOnOff)
    .option("--read-as <type>", "choice: read score files' rows as choice questions over their level names (a set of their own, <name>@choice: more sets for the choice maps' leave-one-dataset-out gate)", parseReadAs)
    .option("--from-readouts <files...>", "refit from --readouts files of earlier runs on this build (merged; each set once) instead of running the model")
    .option("--confidence-only", "write the confidence maps alone (src/probability/confidence.ts), keeping the file's other maps as they are")
    .option("--per-question", "fit a map for every question asked of at least 40 labelled states, judged by k-fold on its own states, and write those alone into the build's file")
    .option("--readouts <file>", "also write the label log-probabilities and gold labels the fit used (JSON)")
    .option("--target <recall>", "code search: share of needed items kept at noul > 0.5", Number, 0.95)
    .option("--band-fraction <f>", "code search / fact check: share of the small build's dev scores that escalate", Number, 0.3)
    .option("--map <kind>", "fact check: family (fit the family's own Platt map) or general (each build's general noul map and prior; refit the band only)", "family")
    .action(
      async (o: {
        target: number;
        bandFraction: number;
        map: string;
        model: string;
        data?: string[];
        limit?: number;
        split?: Split;
        folds: number;
        out?: string;
        write: boolean;
        debias?: string;
        shifts?: number;
        concurrency: number;
        readouts?: string;
        fromResults?: string[];
        prior?: Record<string, number>;
        priorState?: Record<string, string>;
        demonstrations?: boolean;
        fromReadouts?: string[];
        readAs?: "choice";
        confidenceOnly?: boolean;
        perQuestion?: boolean;
      }) => {
        if (!o.data && !o.fromResults && !o.fromReadouts) throw new Error("give --data FILE… (or --from-results results.json…, or --from-readouts FILE…)");
        const config = loadConfig(io.env);
        const family = ModelRegistry.load(config.modelsConfig, config.modelsDir).resolve(o.model).family;
        if (o.map !== "family" && o.map !== "general") throw new Error(`--map must be family or general, got "${o.map}"`);
        if (family !== "general") {
          if (o.perQuestion) throw new Error(`--per-question fits maps for general questions; "${o.model}" is a ${family} model`);
          // Code search and fact check fit their own maps (src/cli/calibrate-family.ts).
          await calibrateFamilyCommand(
            {
              model: o.model,
              data: o.data ?? [],
              folds: o.folds,
              write: o.write,
              target: o.target,
              bandFraction: o.bandFraction,
              map: o.map,
              ...defined({ limit: o.limit }),
              // A claim is a noul question: its prior is the noul weight and neutral state.
              ...(o.prior?.["noul"] !== undefined ? { prior: { weight: o.prior["noul"], state: o.priorState?.["noul"] ?? "N/A" } } : {}),
            },
            io,
          );
          return;
        }
        if (o.debias !== undefined && o.debias !== "off" && o.debias !== "cyclic") throw new Error(`--debias must be off or cyclic, got "${o.debias}"`);
        await calibrateCommand(
          {
            model: o.model,
            data: o.data ?? [],
            folds: o.folds,
            write: o.write,
            concurrency: o.concurrency,
            ...defined({
              limit: o.limit,
              split: o.split,
              out: o.out,
              debias: o.debias,
              shifts: o.shifts,
              readouts: o.readouts,
              confidenceOnly: o.confidenceOnly,
              perQuestion: o.perQuestion,
              readAs: o.readAs,
              fromResults: o.fromResults,
              prior: o.prior,
              priorState: o.priorState,
              demonstrations: o.demonstrations,
              fromReadouts: o.fromReadouts,
            }),
          },
          io,
        );
      },
    );
}
