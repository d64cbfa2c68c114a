import { describe, expect, it } from "vitest";
import { applyMaps, crossValidate, eceFloor, fitMaps, mulberry32, fitShippedMaps, scoreProbabilities, type FitItem } from "../../src/eval/calibrate.js";
import { sigmoid, softmax } from "../../src/probability/index.js";

const rng = mulberry32;

/** An overconfident choice model (true temperature 2.5) and a noul model leaning to "yes". */
function synthetic(): FitItem[] {
  const r = rng(42);
  const items: FitItem[] = [];
  for (let i = 0; i < 600; i++) {
    const lp = Array.from({ length: 4 }, () => 6 * (r() - 0.5));
    const p = softmax(lp, 2.5);
    let u = r();
    let gold = 0;
    while (gold < 3 && u > p[gold]!) u -= p[gold++]!;
    items.push({ dataset: "choice_set", type: "choice", lp: lp.map((x) => x - Math.log(softmax(lp).reduce((a, b) => a + b, 0))), gold });
  }
  // Two noul sets: a map fitted on one set alone does not ship (fitShippedMaps), so k-fold validates none.
  for (let i = 0; i < 1200; i++) {
    const z = 8 * (r() - 0.5) + 2;
    const y = r() < sigmoid(0.5 * z - 1);
    items.push({ dataset: i % 2 ? "noul_set_b" : "noul_set", type: "noul", lp: [Math.log(sigmoid(z)), Math.log(sigmoid(-z))], gold: y ? 0 : 1 });
  }
  return items;
}

/**
 * A choice model whose confidence says nothing beyond a lapse rate: on 40% of
 * items the gold label is drawn uniformly, whatever the model read. A single
 * temperature must trade the confident hits against the lapses; the
 * top-label map reads the rate of being right off the confidence directly.
 */
function lapsing(): FitItem[] {
  const r = rng(7);
  return Array.from({ length: 1500 }, () => {
    const lp = Array.from({ length: 4 }, () => 8 * (r() - 0.5));
    const p = softmax(lp);
    let gold = 0;
    if (r() < 0.4) gold = Math.floor(r() * 4);
    else {
      let u = r();
      while (gold < 3 && u > p[gold]!) u -= p[gold++]!;
    }
    const lse = Math.log(lp.reduce((s, x) => s + Math.exp(x), 0));
    return { dataset: "lapsing", type: "choice" as const, lp: lp.map((x) => x - lse), gold };
  });
}

/** Items of one set read at a true temperature `t` (the model's log-probs are `t` times too sharp). */
function atTemperature(dataset: string, k: number, t: number, n: number, seed: number): FitItem[] {
  const r = rng(seed);
  return Array.from({ length: n }, () => {
    const lp = Array.from({ length: k }, () => 6 * (r() - 0.5));
    const p = softmax(lp, t);
    let u = r();
    let gold = 0;
    while (gold < k - 1 && u > p[gold]!) u -= p[gold++]!;
    const lse = Math.log(lp.reduce((s, x) => s + Math.exp(x), 0));
    return { dataset, type: "choice" as const, lp: lp.map((x) => x - lse), gold };
  });
}

describe("fitMaps", () => {
  it("fits choice by readout regime: `choice:*` on few options only, `choice:>8` on many, which ships from one set", () => {
    const items = [...atTemperature("few_a", 4, 2.5, 800, 1), ...atTemperature("few_b", 5, 2.5, 800, 2), ...atTemperature("many", 20, 0.5, 800, 3)];
    const maps = fitShippedMaps(items);
    expect(Object.keys(maps.temperatures).sort()).toEqual(["choice:*", "choice:>8"]);
    expect(maps.temperatures["choice:*"]).toBeGreaterThan(2);
    expect(maps.temperatures["choice:*"]).toBeLessThan(3.2);
    expect(maps.temperatures["choice:>8"]).toBeGreaterThan(0.35);
    expect(maps.temperatures["choice:>8"]).toBeLessThan(0.7);
    // Pooled over both regimes, one temperature would sit between the two and fit neither.
    const few = items.filter((it) => it.lp.length <= 8);
    expect(fitShippedMaps(few).temperatures["choice:>8"]).toBeUndefined();
    const many = items.find((it) => it.dataset === "many")!;
    expect(applyMaps(many, maps)).toEqual(applyMaps(many, { temperatures: { "choice:20": maps.temperatures["choice:>8"]! }, top_label: { "choice:20": maps.top_label["choice:>8"]! } }));
  });

  it("what ships keeps only keys whose data spans two sets or more, and the pooled type:* maps", () => {
    const items = synthetic();
    const maps = fitShippedMaps(items);
    // choice:4 comes from one set (choice_set): only choice:* ships; noul:2 spans noul_set and noul_set_b.
    expect(Object.keys(maps.temperatures)).toEqual(["choice:*"]);
    expect(Object.keys(maps.top_label)).toEqual(["choice:*"]);
    expect(Object.keys(maps.platt)).toEqual(["noul:2"]);
    expect(Object.keys(fitShippedMaps(items.filter((it) => it.dataset !== "noul_set_b")).platt)).toEqual([]);
  });

  it("fits a temperature and a top-label map per type:k with type:* fallbacks, and Platt for noul", () => {
    const maps = fitMaps(synthetic());
    expect(Object.keys(maps.temperatures).sort()).toEqual(["choice:*", "choice:4"]);
    expect(Object.keys(maps.top_label).sort()).toEqual(["choice:*", "choice:4"]);
    expect(maps.temperatures["choice:4"]).toBeGreaterThan(2);
    expect(maps.temperatures["choice:4"]).toBeLessThan(3.2);
    expect(Object.keys(maps.platt)).toEqual(["noul:2"]);
    expect(maps.platt["noul:2"]!.a).toBeGreaterThan(0.3);
    expect(maps.platt["noul:2"]!.a).toBeLessThan(0.7);
  });
});

describe("crossValidate", () => {
  it("out-of-fold ECE and NLL improve on a miscalibrated model; noul accuracy may move (Platt's bias), choice accuracy does not", () => {
    const cv = crossValidate(synthetic(), 5);
    expect(cv.map((r) => r.dataset)).toEqual(["choice_set", "noul_set", "noul_set_b"]);
    for (const r of cv) {
      expect(r.before.n).toBe(600);
      expect(r.after.n).toBe(600);
      expect(r.after.ece!).toBeLessThan(r.before.ece!);
      expect(r.after.nll!).toBeLessThan(r.before.nll!);
    }
    expect(cv[0]!.after.accuracy).toBe(cv[0]!.before.accuracy);
  });

  it("reports the temperature alone beside temperature + top-label; the top-label map wins where a lapse rate flattens confidence", () => {
    const [r] = crossValidate(lapsing(), 5);
    expect(r!.afterTemperature.ece!).toBeLessThan(r!.before.ece!);
    expect(r!.after.ece!).toBeLessThan(r!.afterTemperature.ece!);
    expect(r!.after.accuracy).toBe(r!.before.accuracy);
    expect(r!.floorTemperature).not.toBeNull();
  });

  it("eceFloor: a calibrated model's ECE from sampling alone shrinks with n and is 0 at confidence 1", () => {
    const small = eceFloor(Array.from({ length: 100 }, () => 0.6))!;
    const large = eceFloor(Array.from({ length: 10_000 }, () => 0.6))!;
    expect(small).toBeGreaterThan(0.02);
    expect(large).toBeLessThan(small / 5);
    expect(eceFloor([1, 1, 1])).toBe(0);
    expect(eceFloor([])).toBeNull();
  });

  it("scoreProbabilities uses the predicted class's probability and p(yes) > 0.5 for noul", () => {
    const s = scoreProbabilities("noul", [[0.8, 0.2], [0.3, 0.7]], [0, 0]);
    expect(s.accuracy).toBe(0.5);
    // bins: 0.8 (correct) and 0.7 (wrong): |1 − 0.8|/2 + |0 − 0.7|/2
    expect(s.ece).toBeCloseTo(0.45, 12);
  });

  it("applyMaps with no maps is the model's own distribution", () => {
    const it0: FitItem = { dataset: "d", type: "score", lp: [Math.log(0.2), Math.log(0.3), Math.log(0.5)], gold: 2 };
    applyMaps(it0, null).forEach((p, i) => expect(p).toBeCloseTo([0.2, 0.3, 0.5][i]!, 12));
  });
});
