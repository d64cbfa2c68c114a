/**
 * Shipped calibration files: applied to the build they were fitted on,
 * refused (with a warning, identity) for another build, and unknown sections
 * kept for the families that add their own. Uses a minimal manifest in a
 * temporary folder: readBuild reads manifest.json only.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { checkCalibration, readBuild, readCalibrationFile, CALIBRATION_DIR } from "../../src/models/manifest.js";
import { calibrateCommand, mergeFit } from "../../src/cli/calibrate.js";
import { loadConfig } from "../../src/config/index.js";
import { ModelRegistry } from "../../src/models/registry.js";

let root: string;
let modelDir: string;
let calDir: string;

const manifest = (hash: string) => ({
  format: "assay-packed-v2",
  architecture: "qwen2",
  name: "test",
  vocab_size: 10,
  context_length: 100,
  hidden_size: 8,
  num_layers: 1,
  parameters: 100,
  quantization: {},
  chat_template: null,
  special_tokens: {},
  eos_token_id: 0,
  source: {},
  build_hash: hash,
  calibration: null,
});

const fitFile = (hash: string, extra: Record<string, unknown> = {}) => ({
  build_hash: hash,
  fitted_at: "2026-11-22T00:00:00Z",
  build: "tiny",
  dir: "tiny-dir",
  temperatures: { "choice:4": 1.7 },
  platt: { "noul:2": { a: 0.6, b: -0.2 } },
  data: [],
  ...extra,
});

beforeEach(() => {
  root = fs.mkdtempSync(path.join(os.tmpdir(), "assay-cal-"));
  modelDir = path.join(root, "tiny-dir");
  calDir = path.join(root, "calibration");
  fs.mkdirSync(modelDir);
  fs.mkdirSync(calDir);
  fs.writeFileSync(path.join(modelDir, "manifest.json"), JSON.stringify(manifest("aaaa")));
});
afterEach(() => fs.rmSync(root, { recursive: true, force: true }));

describe("loading shipped calibration", () => {
  it("applies a fit whose build hash matches, keeping sections it does not know", () => {
    fs.writeFileSync(path.join(calDir, "tiny.json"), JSON.stringify(fitFile("aaaa", { recall: { threshold: 0.3 } })));
    const warnings: string[] = [];
    const b = readBuild(modelDir, { calibrationDir: calDir, warn: (m) => warnings.push(m) });
    expect(b.manifest.calibration?.temperatures).toEqual({ "choice:4": 1.7 });
    expect(b.manifest.calibration?.platt).toEqual({ "noul:2": { a: 0.6, b: -0.2 } });
    expect((b.manifest.calibration as Record<string, unknown>)["recall"]).toEqual({ threshold: 0.3 });
    expect(warnings).toEqual([]);
  });

  it("refuses a fit made for this folder on another build: a warning, and identity", () => {
    fs.writeFileSync(path.join(calDir, "tiny.json"), JSON.stringify(fitFile("bbbb")));
    const warnings: string[] = [];
    const b = readBuild(modelDir, { calibrationDir: calDir, warn: (m) => warnings.push(m) });
    expect(b.manifest.calibration).toBeNull();
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatch(/fitted on build bbbb, this is aaaa/);
  });

  it("ignores silently a fit for another build in another folder", () => {
    fs.writeFileSync(path.join(calDir, "other.json"), JSON.stringify(fitFile("cccc", { dir: "other-dir" })));
    const warnings: string[] = [];
    expect(readBuild(modelDir, { calibrationDir: calDir, warn: (m) => warnings.push(m) }).manifest.calibration).toBeNull();
    expect(warnings).toEqual([]);
  });

  it("checkCalibration: a clear error for a file fitted on another build", () => {
    const file = path.join(calDir, "tiny.json");
    fs.writeFileSync(file, JSON.stringify(fitFile("bbbb")));
    const fit = readCalibrationFile(file);
    expect(() => checkCalibration(fit, { build_hash: "aaaa", name: "test" }, file)).toThrow(/fitted on model build bbbb .*not on the loaded build aaaa.*assay calibrate/);
    expect(checkCalibration(fit, { build_hash: "bbbb", name: "test" }, file)).toBe(fit);
  });

  it("a Platt map with a ≤ 0 (not monotone increasing) is not a valid fit", () => {
    const file = path.join(calDir, "bad.json");
    fs.writeFileSync(file, JSON.stringify(fitFile("aaaa", { platt: { "noul:2": { a: -1, b: 0 } } })));
    expect(() => readCalibrationFile(file)).toThrow(/not a calibration fit/);
  });
});

describe("mergeFit (assay calibrate rewriting a shipped file)", () => {
  it("decides every general key afresh and keeps the families' keys and sections of the same build", () => {
    const existing = readFit(
      fitFile("aaaa", {
        temperatures: { "choice:4": 1.7, "choice:9": 2 },
        platt: { "factcheck:noul": { a: 0.8, b: -1 }, "noul:2": { a: 2, b: 1 } },
        prior: { noul: 1 },
        factcheck: { x: 1 },
      }),
    );
    const fresh = readFit(fitFile("aaaa", { temperatures: { "choice:*": 1.2 }, platt: { "noul:2": { a: 0.9, b: 0 } } }));
    const merged = mergeFit(existing, fresh);
    // A per-set key the refit dropped (choice:4, choice:9) does not survive it.
    expect(merged.temperatures).toEqual({ "choice:*": 1.2 });
    expect(merged.platt).toEqual({ "factcheck:noul": { a: 0.8, b: -1 }, "noul:2": { a: 0.9, b: 0 } });
    // The prior is part of the readings a fit was made on: a fit without one leaves none.
    expect(merged.prior).toBeUndefined();
    expect((merged as Record<string, unknown>)["factcheck"]).toEqual({ x: 1 });
  });

  it("the worked examples: a whole refit sets them as it ran; a partial refit under another setting than the kept maps is refused", () => {
    const existing = readFit(fitFile("aaaa", { temperatures: { "choice:*": 1.2 }, platt: { "noul:2": { a: 2, b: 1 } }, demonstrations: true }));
    // Run on every type without them: the file says so (no stale flag from the old file).
    const whole = mergeFit(existing, readFit(fitFile("aaaa", { temperatures: { "choice:*": 1.1 } })));
    expect(whole.demonstrations).toBeUndefined();
    // Noul alone without them, over choice maps read with them: refused, nothing mixed.
    expect(() => mergeFit(existing, readFit(fitFile("aaaa", { platt: { "noul:2": { a: 1, b: 0 } } })), new Set(["noul"]))).toThrow(/worked examples/);
    // The same setting: merged.
    const same = mergeFit(existing, readFit(fitFile("aaaa", { platt: { "noul:2": { a: 1, b: 0 } }, demonstrations: true })), new Set(["noul"]));
    expect(same.demonstrations).toBe(true);
    expect(same.temperatures["choice:*"]).toBe(1.2);
  });

  it("a fit run on some types only keeps the other types' keys, prior and data notes", () => {
    const existing = readFit(
      fitFile("aaaa", {
        temperatures: { "choice:*": 1.2, "score:5": 2 },
        platt: { "noul:2": { a: 2, b: 1 }, "factcheck:noul": { a: 0.8, b: -1 } },
        top_label: { "choice:*": { a: 0.5, b: 0 } },
        prior: { noul: 0.5, choice: 1 },
        prior_state: { noul: "N/A", score: "" },
        data: ["noul_boolq.jsonl (80 rows)", "choice_agnews.jsonl (80 rows)"],
      }),
    );
    const fresh = readFit(
      fitFile("aaaa", { temperatures: {}, platt: { "noul:2": { a: 0.9, b: -0.2 } }, prior: { noul: 1 }, prior_state: { noul: "" }, data: ["noul_boolq.jsonl (100 rows)"] }),
    );
    const merged = mergeFit(existing, fresh, new Set(["noul"]));
    expect(merged.temperatures).toEqual({ "choice:*": 1.2, "score:5": 2 });
    expect(merged.platt).toEqual({ "noul:2": { a: 0.9, b: -0.2 }, "factcheck:noul": { a: 0.8, b: -1 } });
    expect(merged.top_label).toEqual({ "choice:*": { a: 0.5, b: 0 } });
    expect(merged.prior).toEqual({ noul: 1, choice: 1 });
    expect(merged.prior_state).toEqual({ noul: "", score: "" });
    expect(merged.data).toEqual(["choice_agnews.jsonl (80 rows)", "noul_boolq.jsonl (100 rows)"]);
    // A noul key dropped by the refit does not survive it.
    expect(mergeFit(existing, readFit(fitFile("aaaa", { temperatures: {}, platt: {} })), new Set(["noul"])).platt).toEqual({ "factcheck:noul": { a: 0.8, b: -1 } });
  });

  it("top-label maps are decided afresh by each fit: one the new fit left out does not survive", () => {
    const existing = readFit(fitFile("aaaa", { top_label: { "choice:4": { a: 0.5, b: 0 }, "score:5": { a: 0.7, b: 0.1 } } }));
    const fresh = readFit(fitFile("aaaa", { top_label: { "choice:4": { a: 0.6, b: -0.1 } } }));
    expect(mergeFit(existing, fresh).top_label).toEqual({ "choice:4": { a: 0.6, b: -0.1 } });
  });

  it("a top-label map with a ≤ 0 is not a valid fit", () => {
    expect(() => readFit(fitFile("aaaa", { top_label: { "choice:4": { a: 0, b: 0 } } }))).toThrow();
  });

  it("a file for another build is replaced whole", () => {
    const merged = mergeFit(readFit(fitFile("old", { factcheck: { x: 1 } })), readFit(fitFile("new")));
    expect(merged.build_hash).toBe("new");
    expect((merged as Record<string, unknown>)["factcheck"]).toBeUndefined();
  });
});

describe("the repository ships a fit for every default general build", () => {
  it("models/calibration/<build>.json exists for each build a general model name uses, names its folder and carries a build hash", () => {
    const config = loadConfig({});
    const registry = ModelRegistry.load(config.modelsConfig, config.modelsDir);
    const general = registry.names().map((n) => registry.resolve(n)).filter((r) => r.family === "general");
    const builds = new Set(general.map((r) => JSON.stringify([r.build, path.basename(r.buildDir)])));
    expect(builds.size).toBeGreaterThan(0);
    for (const entry of builds) {
      const [build, dir] = JSON.parse(entry) as [string, string];
      const fit = readCalibrationFile(path.join(CALIBRATION_DIR, `${build}.json`));
      expect(fit.dir).toBe(dir);
      expect(fit.build_hash).toMatch(/^[0-9a-f]{16}$/);
      expect(Object.keys(fit.temperatures).length + Object.keys(fit.platt ?? {}).length).toBeGreaterThan(0);
    }
  });
});

describe("assay calibrate --from-readouts with several files", () => {
  // A build folder with its manifest only: refitting from readouts never loads the model.
  const setup = () => {
    const cache = path.join(root, "cache");
    fs.mkdirSync(path.join(cache, "tiny-dir"), { recursive: true });
    fs.writeFileSync(path.join(cache, "tiny-dir", "manifest.json"), JSON.stringify(manifest("aaaa")));
    const models = path.join(root, "models.json");
    fs.writeFileSync(
      models,
      JSON.stringify({ default: "tiny-judge", builds: { tiny: { dir: "tiny-dir" } }, models: { "tiny-judge": { family: "general", build: "tiny" } } }),
    );
    const env = { ASSAY_MODELS_DIR: cache, ASSAY_MODELS_CONFIG: models };
    const io = { stdout: () => {}, stderr: () => {}, env };
    const header = (data: string[], prior: Record<string, number> = { noul: 1 }) => ({
      build_hash: "aaaa",
      build: "tiny",
      dir: "tiny-dir",
      debias: "cyclic",
      debias_max_shifts: 8,
      prior,
      data,
    });
    // Readings that separate the classes imperfectly, so a Platt map has something to fit.
    const items = (dataset: string, n: number, shift: number) =>
      Array.from({ length: n }, (_, i) => {
        const gold = i % 2;
        const margin = (gold === 0 ? 1 : -1) * (0.5 + (i % 5) * 0.4) + (i % 7 === 0 ? -2 : 0) + shift;
        return { dataset, type: "noul", lp: [Math.log(1 / (1 + Math.exp(-margin))), Math.log(1 / (1 + Math.exp(margin)))], gold };
      });
    const write = (name: string, content: unknown) => {
      const file = path.join(root, name);
      fs.writeFileSync(file, JSON.stringify(content));
      return file;
    };
    return { io, header, items, write };
  };
  const base = { model: "tiny-judge", data: [], folds: 5, write: false, concurrency: 1 };

  it("merges the sets of several files into one fit, validated leave-one-dataset-out across them", async () => {
    const { io, header, items, write } = setup();
    const a = write("a.json", { build_hash: "aaaa", header: header(["set_a.jsonl (40 rows)"]), items: items("set_a", 40, 0.3) });
    const b = write("b.json", { build_hash: "aaaa", header: header(["set_b.jsonl (40 rows)"]), items: items("set_b", 40, -0.3) });
    const result = await calibrateCommand({ ...base, fromReadouts: [a, b] }, io);
    expect(result.items).toHaveLength(80);
    expect(result.fit.data).toEqual(["set_a.jsonl (40 rows)", "set_b.jsonl (40 rows)"]);
    const rows = (result.fit as { cross_validation?: { dataset: string; validation: string }[] }).cross_validation ?? [];
    const lodo = rows.filter((r) => r.validation === "leave-one-dataset-out").map((r) => r.dataset);
    expect(new Set(lodo)).toEqual(new Set(["set_a", "set_b"]));
  });

  it("--confidence-only adds the confidence maps and leaves the file's other maps as they were", async () => {
    const { io, header, write } = setup();
    // Choice readings of three sets whose answers are flat but whose presentations agree when right:
    // a confidence map beats the file's (identity) choice maps held out, so it ships.
    const choice = (dataset: string, n: number) =>
      Array.from({ length: n }, (_, i) => {
        const right = i % 5 !== 0;
        const top = right ? 0.45 + (i % 3) * 0.02 : 0.3;
        const lp = [Math.log(top), Math.log((1 - top) / 2), Math.log((1 - top) / 2)];
        const off = [Math.log((1 - top) / 2), Math.log(top), Math.log((1 - top) / 2)];
        const presentations = right ? [lp, lp, lp] : [lp, off, lp];
        return { dataset, type: "choice", lp, gold: right ? 0 : 1, reading: { lp, presentations, raw: lp, prior: null, shortlisted: false } };
      });
    const file = path.join(root, "fit.json");
    // The file already holds a noul map and its record: a refit that read only choice questions keeps them.
    const noulMap = { bias: 0.1, weights: { z: 0.9 } };
    const noulRow = { dataset: "set_n", type: "noul", validation: "leave-one-dataset-out" };
    fs.writeFileSync(
      file,
      JSON.stringify({
        ...fitFile("aaaa", { temperatures: { "choice:*": 1.3 }, platt: { "noul:2": { a: 0.6, b: -0.2 } } }),
        confidence: { noul: noulMap },
        confidence_validation: [noulRow, { dataset: "set_old", type: "choice" }],
        confidence_features: { noul: { features: ["z"] }, choice: { features: ["top"] } },
        confidence_data: ["set_n.jsonl (50 rows)", "set_old.jsonl (50 rows)"],
      }),
    );
    const a = write("a.json", { build_hash: "aaaa", header: header(["set_a.jsonl"]), items: [...choice("set_a", 60), ...choice("set_b", 60), ...choice("set_c", 60)] });
    await calibrateCommand({ ...base, write: true, out: file, confidenceOnly: true, fromReadouts: [a] }, io);
    const written = readCalibrationFile(file);
    expect(written.temperatures).toEqual({ "choice:*": 1.3 });
    expect(written.platt).toEqual({ "noul:2": { a: 0.6, b: -0.2 } });
    expect(written.confidence?.choice?.weights).toHaveProperty("top");
    expect(written.confidence?.noul).toEqual(noulMap);
    const record = written as unknown as { confidence_validation: { dataset: string }[]; confidence_data: string[]; confidence_features: Record<string, unknown> };
    expect(record.confidence_validation.map((r) => r.dataset).sort()).toEqual(["set_a", "set_b", "set_c", "set_n"]);
    expect(record.confidence_data).toEqual(["set_n.jsonl (50 rows)", "set_a.jsonl"]);
    expect(record.confidence_features["noul"]).toEqual({ features: ["z"] });
  });

  it("--per-question writes the question maps it fits into the file, decides a refitted question afresh, keeps the rest, and refuses readings taken another way", async () => {
    const { io, header, write } = setup();
    // One question read on a narrow scale (true at z ≈ 1.3, false at z ≈ −0.15), which the file's
    // Platt map states near 0.6 however clear the reading: its own map states it surer. A second
    // question has too few labelled states for a map.
    const noul = (question: string, n: number) =>
      Array.from({ length: n }, (_, i) => {
        const truth = i % 2 === 0;
        const z = truth ? 1.2 + (i % 7) * 0.05 : -0.3 + (i % 7) * 0.05;
        const lp = [-Math.log1p(Math.exp(-z)), -Math.log1p(Math.exp(z))];
        return { dataset: `set_${question}`, type: "noul", lp, gold: truth ? 0 : 1, question, reading: { lp, presentations: [lp], raw: lp, prior: null, shortlisted: false } };
      });
    const file = path.join(root, "fit.json");
    const stale = { type: "noul", map: { bias: 9, weights: {} } };
    const other = { type: "choice", map: { bias: 1, weights: { top: 0.5 } } };
    fs.writeFileSync(file, JSON.stringify(fitFile("aaaa", { prior: { noul: 1 }, debias: "cyclic", questions: { narrow: stale, elsewhere: other } })));
    const a = write("q.json", { build_hash: "aaaa", header: header(["set_narrow.jsonl", "set_few.jsonl"]), items: [...noul("narrow", 60), ...noul("few", 10)] });
    await calibrateCommand({ ...base, write: true, out: file, perQuestion: true, fromReadouts: [a] }, io);
    const written = readCalibrationFile(file);
    expect(written.temperatures).toEqual({ "choice:4": 1.7 });
    expect(written.platt).toEqual({ "noul:2": { a: 0.6, b: -0.2 } });
    expect(Object.keys(written.questions ?? {}).sort()).toEqual(["elsewhere", "narrow"]);
    expect(written.questions!["elsewhere"]).toEqual(other);
    expect(written.questions!["narrow"]!.map.weights["z"]!).toBeGreaterThan(0.6);
    const rows = (written as unknown as { questions_validation: { key: string; ships: boolean }[] }).questions_validation;
    expect(rows.map((r) => [r.key, r.ships])).toEqual([["narrow", true]]);
    // The file's maps were fitted under another prior: its questions were read another way.
    fs.writeFileSync(file, JSON.stringify(fitFile("aaaa", { prior: { noul: 0.5 }, debias: "cyclic" })));
    await expect(calibrateCommand({ ...base, write: true, out: file, perQuestion: true, fromReadouts: [a] }, io)).rejects.toThrow(/taken another way/);
  });

  it("refuses files read under different priors, and a set given twice", async () => {
    const { io, header, items, write } = setup();
    const a = write("a.json", { build_hash: "aaaa", header: header(["set_a.jsonl"]), items: items("set_a", 20, 0) });
    const other = write("o.json", { build_hash: "aaaa", header: header(["set_b.jsonl"], { noul: 0.5 }), items: items("set_b", 20, 0) });
    await expect(calibrateCommand({ ...base, fromReadouts: [a, other] }, io)).rejects.toThrow(/another prior/);
    const again = write("again.json", { build_hash: "aaaa", header: header(["set_a.jsonl"]), items: items("set_a", 20, 0) });
    await expect(calibrateCommand({ ...base, fromReadouts: [a, again] }, io)).rejects.toThrow(/reads set_a again/);
  });
});

function readFit(obj: Record<string, unknown>) {
  const file = path.join(calDir, `f${Math.random().toString(36).slice(2)}.json`);
  fs.writeFileSync(file, JSON.stringify(obj));
  return readCalibrationFile(file);
}
