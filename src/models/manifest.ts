import fs from "node:fs";
import path from "node:path";
import { z } from "zod";
import { INT8_GRAPH, type Int8Products } from "./int8.js";
import { ROOT, type ExecutionProvider } from "../config/index.js";

/**
 * Calibration maps for one model build; identity until fitted. The maps and
 * why each type gets the one it gets: src/probability/calibration.ts.
 * Loose: families add sections of their own (e.g. a recall adjustment) and
 * the keys this schema does not name are kept as they are.
 */
/** One confidence map (src/probability/confidence.ts): σ(bias + Σ weights[f]·f). */
const ConfidenceMap = z.object({ bias: z.number(), weights: z.record(z.string(), z.number()), spread: z.number().nonnegative().optional() });

export const CalibrationFit = z.looseObject({
  build_hash: z.string(),
  fitted_at: z.string(),
  /** Build name in models.json and its folder, to name the build a file is meant for. */
  build: z.string().optional(),
  dir: z.string().optional(),
  /** key: `${type}:${k}` (e.g. "noul:2", "choice:4") or `${type}:*` as fallback. */
  temperatures: z.record(z.string(), z.number().positive()),
  /** Platt scaling σ(a·z + b) on yes/no log-odds z, keyed like temperatures ("noul:2", "factcheck:noul"); a > 0. */
  platt: z.record(z.string(), z.looseObject({ a: z.number().positive(), b: z.number() })).optional(),
  /** Top-label maps σ(a·logit(c) + b) on the predicted option's probability (choice/score), keyed like temperatures; a > 0. */
  top_label: z.record(z.string(), z.looseObject({ a: z.number().positive(), b: z.number() })).optional(),
  /**
   * Weight of the content-free prior subtracted per question type ("noul", "choice", "score"),
   * 0–1; absent or 0: none (src/engine/prior.ts). The maps above are fitted on readings with it applied.
   */
  prior: z.record(z.string(), z.number().min(0).max(1)).optional(),
  /** The content-free state each type's prior is read against (default "N/A"). */
  prior_state: z.record(z.string(), z.string().max(100)).optional(),
  /**
   * Options a many-option choice question is read again over (shortlist, then choose), for this
   * build: at most ASSAY_SHORTLIST; 0 turns it off where it was measured not to help. Absent: ASSAY_SHORTLIST.
   */
  shortlist: z.number().int().min(0).max(8).optional(),
  /**
   * The general prompt shows the worked examples (src/prompt/demonstrations.ts) before the state on
   * this build; the maps above are fitted on readings taken with them. Absent: not shown.
   */
  demonstrations: z.boolean().optional(),
  /** ASSAY_DEBIAS mode the choice/score temperatures and top-label maps were fitted under. */
  debias: z.string().optional(),
  /**
   * Confidence maps per question type (src/probability/confidence.ts): a logistic model over features
   * of the readings. Where a type has one it replaces that type's Platt and top-label maps (its
   * temperature still shares out the other options). Fitted under `debias` and `prior` like them.
   */
  confidence: z.object({ noul: ConfidenceMap.optional(), choice: ConfidenceMap.optional(), score: ConfidenceMap.optional() }).optional(),
  /**
   * Confidence maps for single questions (src/probability/question-maps.ts), keyed by `questionKey`:
   * fitted on labelled examples of that question (`assay calibrate --per-question`), they replace the
   * type's map for it. Read under `debias` and `prior` like the maps above.
   */
  questions: z.record(z.string(), z.looseObject({ type: z.enum(["noul", "choice", "score"]), map: ConfidenceMap })).optional(),
  data: z.array(z.string()).default([]),
});
export type CalibrationFit = z.infer<typeof CalibrationFit>;

export const Manifest = z.object({
  /**
   * v3 graphs also take `past_kv` and return `present_kv` (the prefix cache); v2 builds run without it.
   * v4 is v3 with its norms written out in operators no onnxruntime fuses, so that it reads the same
   * on every runtime version (scripts/export_onnx.py `rms`).
   */
  format: z.enum(["assay-packed-v2", "assay-packed-v3", "assay-packed-v4"]),
  architecture: z.string(),
  name: z.string(),
  vocab_size: z.number().int().positive(),
  context_length: z.number().int().positive(),
  hidden_size: z.number().int().positive(),
  num_layers: z.number().int().positive(),
  /** Key/value layout of `past_kv` / `present_kv` (v3 and later). */
  kv: z.object({ layers: z.number().int().positive(), kv_heads: z.number().int().positive(), head_dim: z.number().int().positive() }).optional(),
  parameters: z.number().int().positive(),
  quantization: z.record(z.string(), z.unknown()),
  chat_template: z.string().nullable(),
  special_tokens: z.record(z.string(), z.string()),
  eos_token_id: z.number().int().nullable(),
  source: z.record(z.string(), z.unknown()),
  build_hash: z.string(),
  calibration: CalibrationFit.nullable(),
  /**
   * The input layout of the build's batch graphs (scripts/batch_graph.py stamps it once they are written);
   * the worker batches only through graphs of the layout src/inference/batch.ts builds (BATCH_LAYOUT).
   */
  batch_layout: z.number().int().positive().optional(),
});
export type Manifest = z.infer<typeof Manifest>;

export interface ModelBuild {
  dir: string;
  manifest: Manifest;
  onnxPath: string;
  tokenizerJson: string;
  tokenizerConfig: string;
}

/** models/calibration/ in the repository: the fits shipped for the default builds. */
export const CALIBRATION_DIR = path.join(ROOT, "models", "calibration");

/** Read and validate one calibration file. */
export function readCalibrationFile(file: string): CalibrationFit {
  const parsed = CalibrationFit.safeParse(JSON.parse(fs.readFileSync(file, "utf8")));
  if (!parsed.success) throw new Error(`${file}: not a calibration fit: ${parsed.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ")}`);
  return parsed.data;
}

/**
 * A calibration fit for exactly this build, or a clear error: fits are
 * refused for any build other than the one they were fitted on.
 */
export function checkCalibration(fit: CalibrationFit, manifest: Pick<Manifest, "build_hash" | "name">, source: string): CalibrationFit {
  if (fit.build_hash !== manifest.build_hash) {
    throw new Error(
      `${source} was fitted on model build ${fit.build_hash}${fit.build ? ` ("${fit.build}")` : ""}, ` +
        `not on the loaded build ${manifest.build_hash} (${manifest.name}); refit it with \`assay calibrate\``,
    );
  }
  return fit;
}

export interface ReadBuildOptions {
  /** Where shipped fits are looked up (default models/calibration/). */
  calibrationDir?: string;
  /** Told about a fit that is present but refused (another build). Default: a process warning. */
  warn?: (message: string) => void;
  /**
   * Replaces the fit found for this build, at load: the offline tools read a
   * build raw (eval `--calibration none`), under another file, or under the
   * shipped prior alone (calibrate), without changing a build once loaded.
   */
  calibration?: (found: CalibrationFit | null, manifest: Manifest) => CalibrationFit | null;
  /**
   * The int8 products to run (int8.ts): `u8u8` / `s8s8` pick
   * `model.u8u8.onnx` / `model.s8s8.onnx` where the build has it (where it
   * has not: `model.onnx`, told through `warn`). Default `u8s8`: `model.onnx`.
   */
  int8?: Int8Products;
  /**
   * A GPU provider: the build's GPU graph (GPU_GRAPH) serves where it is current. Without one, WebGPU
   * refuses the build (its int8 products would run on the host); CUDA runs the `int8` graph, told through `warn`.
   */
  provider?: ExecutionProvider;
  /** On CUDA: the half-precision GPU graph (GPU16_GRAPH) where the build has a current one, else the float32 one. */
  gpuPrecision?: GpuPrecision;
}

export type GpuPrecision = "half" | "float32";

/** A build's GPU graph (scripts/gpu_graph.py): float products a GPU provider runs on the device, and what it was made from. */
export const GPU_GRAPH = { file: "model.gpu.onnx", facts: "model.gpu.json", format: "assay-gpu-v1" } as const;
/** Its half-precision twin for CUDA (scripts/half_graph.py): the same graph, its products and weights in float16. */
export const GPU16_GRAPH = { file: "model.gpu16.onnx", facts: "model.gpu16.json", format: "assay-gpu16-v1" } as const;

const GpuFacts = z.looseObject({ format: z.string(), build_hash: z.string().nullable() });

/** The GPU graph (`kind`) of the build in `dir`, or why it cannot serve (absent, or made from other weights or by another format). */
export function gpuGraph(
  dir: string,
  manifest: Pick<Manifest, "build_hash">,
  kind: typeof GPU_GRAPH | typeof GPU16_GRAPH = GPU_GRAPH,
): { file: string } | { missing: string } {
  const factsFile = path.join(dir, kind.facts);
  const file = path.join(dir, kind.file);
  const what = kind === GPU_GRAPH ? "GPU graph" : "half-precision GPU graph";
  if (!fs.existsSync(factsFile) || !fs.existsSync(file)) return { missing: `${dir} has no ${what} (${kind.file})` };
  const facts = GpuFacts.safeParse(JSON.parse(fs.readFileSync(factsFile, "utf8")));
  if (!facts.success || facts.data.format !== kind.format) return { missing: `${dir}'s ${what} is not of format ${kind.format}` };
  if (facts.data.build_hash !== manifest.build_hash) return { missing: `${dir}'s ${what} was made from build ${facts.data.build_hash}, not ${manifest.build_hash}` };
  return { file };
}

/**
 * The fit to use for an exported build, from (last wins): the manifest's own,
 * a shipped file in `calibrationDir` with this build hash, and a
 * `calibration.json` beside the manifest. A file that names this build's
 * folder but carries another hash is refused with a warning (identity, or
 * the manifest's own fit, is used): the weights changed since it was fitted.
 */
function findCalibration(dir: string, manifest: Manifest, opts: ReadBuildOptions): CalibrationFit | null {
  const warn = opts.warn ?? ((m: string) => process.emitWarning(m, { code: "ASSAY_CALIBRATION_MISMATCH" }));
  let fit = manifest.calibration;
  const calDir = opts.calibrationDir ?? CALIBRATION_DIR;
  const candidates: string[] = [];
  if (fs.existsSync(calDir)) {
    for (const f of fs.readdirSync(calDir).sort()) if (f.endsWith(".json")) candidates.push(path.join(calDir, f));
  }
  const beside = path.join(dir, "calibration.json");
  if (fs.existsSync(beside)) candidates.push(beside);
  for (const file of candidates) {
    let c: CalibrationFit;
    try {
      c = readCalibrationFile(file);
    } catch (e) {
      warn(`calibration ignored: ${e instanceof Error ? e.message : String(e)}`);
      continue;
    }
    const meant = file === beside || (c.dir !== undefined && path.basename(c.dir) === path.basename(dir));
    if (c.build_hash === manifest.build_hash) fit = c;
    else if (meant) warn(`calibration ${file} refused for ${dir}: fitted on build ${c.build_hash}, this is ${manifest.build_hash}; answers are uncalibrated`);
  }
  return fit;
}

/** Why a missing graph matters, and how to write it. */
const MISSING_GRAPH: Record<Exclude<Int8Products, "u8s8">, string> = {
  u8u8: "its int8 products may saturate on this CPU and move answers; run npm run prepare-models",
  s8s8: "under CUDA its int8 products and their scaling run on the host CPU; run ASSAY_EXECUTION_PROVIDER=cuda npm run prepare-models",
};

export function readBuild(dir: string, opts: ReadBuildOptions = {}): ModelBuild {
  const file = path.join(dir, "manifest.json");
  if (!fs.existsSync(file)) throw new Error(`no exported model in ${dir} (manifest.json missing); run npm run prepare-models`);
  const manifest = Manifest.parse(JSON.parse(fs.readFileSync(file, "utf8")));
  const found = findCalibration(dir, manifest, opts);
  manifest.calibration = opts.calibration ? opts.calibration(found, manifest) : found;
  const warn = opts.warn ?? ((m: string) => process.emitWarning(m, { code: "ASSAY_INT8_GRAPH" }));
  let graph: string = INT8_GRAPH.u8s8;
  const want = opts.int8 ?? "u8s8";
  const gpu = opts.provider && opts.provider !== "cpu" ? gpuGraph(dir, manifest) : null;
  const half = opts.provider === "cuda" && (opts.gpuPrecision ?? "half") === "half" ? gpuGraph(dir, manifest, GPU16_GRAPH) : null;
  if (half && "file" in half) graph = GPU16_GRAPH.file;
  else if (gpu && "file" in gpu) {
    graph = GPU_GRAPH.file;
    if (half) warn(`${half.missing}: CUDA runs the float32 GPU graph instead; run ASSAY_EXECUTION_PROVIDER=cuda npm run prepare-models`);
  }
  else if (gpu && opts.provider === "webgpu") {
    throw new Error(`${gpu.missing}: the WebGPU provider has no kernels for the CPU graph's int8 products; run ASSAY_EXECUTION_PROVIDER=webgpu npm run prepare-models`);
  } else {
    if (gpu) warn(`${gpu.missing}: CUDA runs the int8 graph instead; run ASSAY_EXECUTION_PROVIDER=cuda npm run prepare-models`);
    if (want !== "u8s8" && manifest.quantization["op"] === "MatMulInteger") {
      if (fs.existsSync(path.join(dir, INT8_GRAPH[want]))) graph = INT8_GRAPH[want];
      else warn(`${dir} has no ${INT8_GRAPH[want]}: ${MISSING_GRAPH[want]}`);
    }
  }
  return {
    dir,
    manifest,
    onnxPath: path.join(dir, graph),
    tokenizerJson: path.join(dir, "tokenizer.json"),
    tokenizerConfig: path.join(dir, "tokenizer_config.json"),
  };
}
