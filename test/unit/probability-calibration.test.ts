import { describe, expect, it } from "vitest";
import {
  answer,
  averageReadings,
  calibrateNoul,
  calibrationForMode,
  labelProbabilities,
  noulLogit,
  sigmoid,
  softmax,
  uncalibrateNoulLogit,
} from "../../src/probability/index.js";
import { mulberry32 } from "../../src/eval/calibrate.js";
import { fitPlatt, fitTemperature, fitTopLabel, plattNll, temperatureNll } from "../../src/eval/fitting.js";
import type { CalibrationFit } from "../../src/models/manifest.js";

/** Deterministic PRNG (mulberry32) so the synthetic samples are the same on every run. */
const rng = mulberry32;

const gauss = (r: () => number) => Math.sqrt(-2 * Math.log(1 - r())) * Math.cos(2 * Math.PI * r());

/** Items whose gold label is drawn from softmax(lp / T): a model that is miscalibrated by exactly T. */
function temperatureSample(t: number, n: number, k: number, seed: number) {
  const r = rng(seed);
  return Array.from({ length: n }, () => {
    const lp = Array.from({ length: k }, () => 3 * gauss(r));
    const p = softmax(lp, t);
    let u = r();
    let gold = 0;
    while (gold < k - 1 && u > p[gold]!) u -= p[gold++]!;
    return { lp, gold };
  });
}

describe("fitTemperature", () => {
  it.each([
    [0.5, 4],
    [2, 4],
    [3, 77],
  ])("recovers T = %s on synthetic data with %s options", (t, k) => {
    const items = temperatureSample(t, 4000, k, 7 + k);
    const fitted = fitTemperature(items);
    expect(Math.abs(Math.log(fitted / t))).toBeLessThan(0.08);
    // The fit is the NLL minimum: nearby temperatures are worse.
    const nll = temperatureNll(items, fitted);
    expect(temperatureNll(items, fitted * 1.2)).toBeGreaterThan(nll);
    expect(temperatureNll(items, fitted / 1.2)).toBeGreaterThan(nll);
  });

  it("a calibrated model keeps T ≈ 1", () => {
    expect(fitTemperature(temperatureSample(1, 4000, 5, 3))).toBeCloseTo(1, 1);
  });

  it("no usable items → identity", () => {
    expect(fitTemperature([])).toBe(1);
  });
});

describe("Platt scaling for noul", () => {
  const sample = (a: number, b: number, n: number, seed: number) => {
    const r = rng(seed);
    return Array.from({ length: n }, () => {
      const z = 4 * gauss(r);
      return { z, y: r() < sigmoid(a * z + b) };
    });
  };

  it("recovers known (a, b)", () => {
    const fit = fitPlatt(sample(0.4, -0.8, 6000, 11));
    expect(fit.a).toBeCloseTo(0.4, 1);
    expect(fit.b).toBeCloseTo(-0.8, 1);
    const items = sample(0.4, -0.8, 2000, 12);
    expect(plattNll(items, fit)).toBeLessThan(plattNll(items, { a: 1, b: 0 }));
  });

  it("stays monotone increasing even when the log-odds point the wrong way", () => {
    const fit = fitPlatt(sample(-1, 0, 2000, 5));
    expect(fit.a).toBeGreaterThan(0);
    const maps = { platt: { "noul:2": fit } };
    let prev = -Infinity;
    for (let z = -20; z <= 20; z += 0.5) {
      const p = calibrateNoul(z, maps);
      expect(p).toBeGreaterThanOrEqual(prev);
      prev = p;
    }
  });

  it("a separable sample does not drive a to infinity (smoothed targets)", () => {
    const items = Array.from({ length: 50 }, (_, i) => ({ z: i < 25 ? -1 - i : 1 + i, y: i >= 25 }));
    const fit = fitPlatt(items);
    expect(Number.isFinite(fit.a) && fit.a < 50).toBe(true);
  });

  it("calibrateNoul: Platt under the key, else a temperature under it, else identity", () => {
    expect(calibrateNoul(2, null)).toBeCloseTo(sigmoid(2), 15);
    expect(calibrateNoul(2, { temperatures: { "noul:2": 2 } })).toBeCloseTo(sigmoid(1), 15);
    expect(calibrateNoul(2, { platt: { "factcheck:noul": { a: 0.5, b: 1 } } }, "factcheck:noul")).toBeCloseTo(sigmoid(2), 15);
    // Another key's map does not apply.
    expect(calibrateNoul(2, { platt: { "factcheck:noul": { a: 0.5, b: 1 } } })).toBeCloseTo(sigmoid(2), 15);
    const maps = { platt: { "noul:2": { a: 0.7, b: -0.3 } } };
    expect(uncalibrateNoulLogit(noulLogit(1.3, maps), maps)).toBeCloseTo(1.3, 12);
  });

  it("answer() reads noul through Platt", () => {
    const lp = [Math.log(0.8), Math.log(0.2)];
    const a = answer({ type: "noul", keys: ["true", "false"] }, lp, { platt: { "noul:2": { a: 0.5, b: -1 } } });
    expect(a.type === "noul" && a.noul).toBeCloseTo(sigmoid(0.5 * Math.log(4) - 1), 12);
  });
});

describe("averageReadings (option-order debiasing)", () => {
  it("cancels a bias the model adds to each position when every option visits every position", () => {
    const content = [0.3, -1.2, 2.0, 0.1, -0.5];
    const bias = [2.5, 0.4, -0.3, 0, 1.1]; // by position: a strong lean to the first listed option
    const k = content.length;
    const readings = Array.from({ length: k }, (_, s) => {
      // Shift s shows option (i + s) % k at position i.
      const lp = new Array<number>(k);
      for (let pos = 0; pos < k; pos++) lp[(pos + s) % k] = content[(pos + s) % k]! + bias[pos]!;
      return lp;
    });
    const avg = averageReadings(readings);
    const clean = softmax(content).map(Math.log);
    avg.forEach((x, i) => expect(x).toBeCloseTo(clean[i]!, 12));
    // One reading alone keeps the bias.
    expect(softmax(readings[0]!).indexOf(Math.max(...softmax(readings[0]!)))).not.toBe(2);
  });

  it("is normalised and is the identity for one reading", () => {
    const lp = [Math.log(0.02), Math.log(0.06)];
    const avg = averageReadings([lp]);
    expect(Math.exp(avg[0]!)).toBeCloseTo(0.25, 12);
    expect(Math.exp(avg[1]!)).toBeCloseTo(0.75, 12);
    expect(() => averageReadings([])).toThrow();
  });
});

describe("calibrationForMode", () => {
  const fit: CalibrationFit = {
    build_hash: "h",
    fitted_at: "2026-01-01T00:00:00Z",
    temperatures: { "choice:4": 2, "score:*": 3, "noul:2": 1.5 },
    platt: { "noul:2": { a: 0.5, b: 0 } },
    top_label: { "choice:4": { a: 1.5, b: 0.2 } },
    debias: "cyclic",
    data: [],
  };
  it("keeps every map under the mode it was fitted under", () => {
    expect(calibrationForMode(fit, "cyclic")).toBe(fit);
  });
  it("drops choice/score temperatures and top-label maps under another mode, keeps noul maps", () => {
    const off = calibrationForMode(fit, "off")!;
    expect(off.temperatures).toEqual({ "noul:2": 1.5 });
    expect(off.top_label).toEqual({});
    expect(off.platt).toEqual(fit.platt);
  });
  it("a fit without a recorded mode applies everywhere; none stays none", () => {
    const { debias: _, ...plain } = fit;
    expect(calibrationForMode(plain, "off")).toBe(plain);
    expect(calibrationForMode(null, "off")).toBeNull();
  });
});

describe("top-label map (choice / score)", () => {
  const lp = [Math.log(0.5), Math.log(0.3), Math.log(0.15), Math.log(0.05)];

  it("without a map it is softmax(lp / T)", () => {
    labelProbabilities(lp, 2, undefined).forEach((p, i) => expect(p).toBeCloseTo(softmax(lp, 2)[i]!, 12));
  });

  it("sets the predicted option from the model's own confidence and keeps the others' tempered proportions", () => {
    const map = { a: 1.2, b: 0.4 };
    const p = labelProbabilities(lp, 2, map);
    const c = 0.5;
    expect(p[0]).toBeCloseTo(sigmoid(1.2 * Math.log(c / (1 - c)) + 0.4), 12);
    expect(p.reduce((s, x) => s + x, 0)).toBeCloseTo(1, 12);
    const q = softmax(lp, 2);
    expect(p[1]! / p[2]!).toBeCloseTo(q[1]! / q[2]!, 12);
    expect(p[2]! / p[3]!).toBeCloseTo(q[2]! / q[3]!, 12);
  });

  it("never changes which option wins: a map that would drop it below the runner-up is floored just above it", () => {
    const close = [Math.log(0.34), Math.log(0.36), Math.log(0.2), Math.log(0.1)];
    const p = labelProbabilities(close, 1, { a: 1, b: -3 });
    expect(p[1]).toBeGreaterThan(p[0]!);
    expect(p[1]).toBeCloseTo(p[0]!, 8);
    expect(answer({ type: "choice", keys: ["a", "b", "c", "d"] }, close, { top_label: { "choice:4": { a: 1, b: -3 } } })).toMatchObject({ choice: "b" });
  });

  it("is blind to option order: permuting the labels permutes the answer", () => {
    const map = { a: 0.8, b: 0.3 };
    const perm = [2, 0, 3, 1];
    const p = labelProbabilities(lp, 1.7, map);
    const pp = labelProbabilities(perm.map((i) => lp[i]!), 1.7, map);
    perm.forEach((from, to) => expect(pp[to]).toBeCloseTo(p[from]!, 12));
  });

  it("fitTopLabel recovers the map behind how often the predicted option is right", () => {
    const r = rng(9);
    const items = Array.from({ length: 4000 }, () => {
      const confidence = 0.25 + 0.74 * r();
      const right = sigmoid(0.6 * Math.log(confidence / (1 - confidence)) + 0.7);
      return { confidence, correct: r() < right };
    });
    const m = fitTopLabel(items);
    expect(m.a).toBeGreaterThan(0.45);
    expect(m.a).toBeLessThan(0.75);
    expect(m.b).toBeGreaterThan(0.55);
    expect(m.b).toBeLessThan(0.85);
  });
});
