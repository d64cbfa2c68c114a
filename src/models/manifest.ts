import fs from "node:fs";
import path from "node:path";
import { z } from "zod";

/** Temperature per question type and option count; identity until fitted. */
export const CalibrationFit = z.object({
  build_hash: z.string(),
  fitted_at: z.string(),
  /** key: `${type}:${k}` (e.g. "noul:2", "choice:4") or `${type}:*` as fallback. */
  temperatures: z.record(z.string(), z.number().positive()),
  data: z.array(z.string()).default([]),
});
export type CalibrationFit = z.infer<typeof CalibrationFit>;

export const Manifest = z.object({
  format: z.literal("assay-packed-v2"),
  architecture: z.string(),
  name: z.string(),
  vocab_size: z.number().int().positive(),
  context_length: z.number().int().positive(),
  hidden_size: z.number().int().positive(),
  num_layers: z.number().int().positive(),
  parameters: z.number().int().positive(),
  quantization: z.record(z.string(), z.unknown()),
  chat_template: z.string().nullable(),
  special_tokens: z.record(z.string(), z.string()),
  eos_token_id: z.number().int().nullable(),
  source: z.record(z.string(), z.unknown()),
  build_hash: z.string(),
  calibration: CalibrationFit.nullable(),
});
export type Manifest = z.infer<typeof Manifest>;

export interface ModelBuild {
  dir: string;
  manifest: Manifest;
  onnxPath: string;
  tokenizerJson: string;
  tokenizerConfig: string;
}

export function readBuild(dir: string): ModelBuild {
  const file = path.join(dir, "manifest.json");
  if (!fs.existsSync(file)) throw new Error(`no exported model in ${dir} (manifest.json missing); run npm run prepare-models`);
  const manifest = Manifest.parse(JSON.parse(fs.readFileSync(file, "utf8")));
  // A separately fitted calibration file overrides the one in the manifest,
  // but only for the build it was fitted on.
  const calFile = path.join(dir, "calibration.json");
  if (fs.existsSync(calFile)) {
    const fit = CalibrationFit.parse(JSON.parse(fs.readFileSync(calFile, "utf8")));
    if (fit.build_hash === manifest.build_hash) manifest.calibration = fit;
  }
  return {
    dir,
    manifest,
    onnxPath: path.join(dir, "model.onnx"),
    tokenizerJson: path.join(dir, "tokenizer.json"),
    tokenizerConfig: path.join(dir, "tokenizer_config.json"),
  };
}
