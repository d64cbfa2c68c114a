import { describe, expect, it } from "vitest";
import { answer, applyConfidenceMap, calibrationForMode, nearChosen, noulFeatures, optionFeatures, singleReading, softmax, withTop, type QuestionReading } from "../../src/probability/index.js";
import { answersWorse, confidenceItems, expectedLevelError, fitConfidence, fitConfidenceMap, fitSpread, setWeights, type ConfidenceItem } from "../../src/eval/confidence-fit.js";
import type { FitItem } from "../../src/eval/calibrate.js";
import { mulberry32 } from "../../src/eval/calibrate.js";

const log = (ps: number[]) => ps.map(Math.log);
const argmaxOf = (xs: readonly number[]) => xs.indexOf(Math.max(...xs));
const reading = (presentations: number[][], prior: number[] | null = null): QuestionReading => {
  const norm = (xs: number[]) => {
    const m = Math.max(...xs);
    const z = m + Math.log(xs.reduce((s, x) => s + Math.exp(x - m), 0));
    return xs.map((x) => x - z);
  };
  const mean = (rs: number[][]) => norm(rs[0]!.map((_, i) => rs.reduce((s, r) => s + norm(r)[i]!, 0) / rs.length));
  const raw = mean(presentations);
  const lp = prior ? norm(raw.map((x, i) => x - norm(prior)[i]!)) : raw;
  return { lp, presentations: presentations.map((p) => (prior ? norm(norm(p).map((x, i) => x - norm(prior)[i]!)) : norm(p))), raw, prior, shortlisted: false };
};

describe("optionFeatures", () => {
  it("reads agreement, margin and the prior's pull about the chosen option", () => {
    const agreeing = optionFeatures(reading([log([0.7, 0.2, 0.1]), log([0.6, 0.3, 0.1]), log([0.8, 0.1, 0.1])]));
    const split = optionFeatures(reading([log([0.7, 0.2, 0.1]), log([0.2, 0.7, 0.1]), log([0.8, 0.1, 0.1])]));
    expect(agreeing.agree).toBeCloseTo(1 - 1 / 3, 12);
    expect(split.agree).toBeCloseTo(2 / 3 - 1 / 3, 12);
    expect(agreeing.spread).toBeLessThan(split.spread!);
    expect(agreeing.margin).toBeGreaterThan(0);
    expect(agreeing.logk).toBeCloseTo(Math.log(3), 12);
    // A prior that favoured the chosen option pulls toward it: pull > 0, and the raw reading is surer than the answer.
    const pulled = optionFeatures(reading([log([0.7, 0.2, 0.1])], log([0.6, 0.2, 0.2])));
    expect(pulled.pull).toBeCloseTo(Math.log(3 * 0.6), 9);
    expect(pulled.raw).toBeGreaterThan(pulled.top!);
    // One presentation, no prior: no agreement to read, no pull.
    const single = optionFeatures(singleReading(log([0.5, 0.3, 0.2])));
    expect(single.agree).toBe(0);
    expect(single.pull).toBe(0);
  });
});

describe("noulFeatures", () => {
  it("signs every feature toward true", () => {
    const f = noulFeatures(reading([log([0.8, 0.2]), log([0.6, 0.4])], log([0.3, 0.7])));
    expect(f.raw).toBeGreaterThan(0);
    expect(f.prior).toBeLessThan(0);
    expect(f.agree).toBe(1);
    expect(f.z).toBeCloseTo(f.raw! - f.prior!, 9);
  });
});

describe("answer under a confidence map", () => {
  const fitWith = (confidence: object) => ({ temperatures: {}, confidence }) as Parameters<typeof answer>[2];

  it("sets the chosen option's probability and never changes the choice", () => {
    const r = reading([log([0.4, 0.35, 0.25]), log([0.45, 0.3, 0.25])]);
    const plain = answer({ type: "choice", keys: ["a", "b", "c"] }, r, null);
    const mapped = answer({ type: "choice", keys: ["a", "b", "c"] }, r, fitWith({ choice: { bias: 2, weights: {} } }));
    if (plain.type !== "choice" || mapped.type !== "choice") throw new Error("not a choice");
    expect(mapped.choice).toBe(plain.choice);
    expect(mapped.probabilities.a).toBeCloseTo(1 / (1 + Math.exp(-2)), 12);
    // The others keep their proportions.
    expect(mapped.probabilities.b! / mapped.probabilities.c!).toBeCloseTo(plain.probabilities.b! / plain.probabilities.c!, 9);
    // A map that would put the chosen option below the runner-up is floored above it.
    const low = answer({ type: "choice", keys: ["a", "b", "c"] }, r, fitWith({ choice: { bias: -5, weights: {} } }));
    if (low.type !== "choice") throw new Error("not a choice");
    expect(low.choice).toBe("a");
    expect(low.probabilities.a).toBeGreaterThan(low.probabilities.b!);
  });

  it("leans a score's other levels toward the chosen one by the map's spread, and leaves choice alone", () => {
    const r = reading([log([0.1, 0.4, 0.2, 0.1, 0.2]), log([0.1, 0.35, 0.25, 0.1, 0.2])]);
    const levels = ["0", "1", "2", "3", "4"];
    const plain = answer({ type: "score", keys: levels, levels }, r, fitWith({ score: { bias: 0.5, weights: {} } }));
    const spread = answer({ type: "score", keys: levels, levels }, r, fitWith({ score: { bias: 0.5, weights: {}, spread: 1 } }));
    if (plain.type !== "score" || spread.type !== "score") throw new Error("not a score");
    const p = (a: typeof plain) => levels.map((l) => a.probabilities[l]!);
    // The chosen level keeps the map's probability; the rest shifts toward it, so the expected level
    // moves toward level 1 and the ordinal confidence rises.
    expect(spread.probabilities["1"]).toBeCloseTo(1 / (1 + Math.exp(-0.5)), 12);
    expect(p(spread)[0]! / p(spread)[2]!).toBeCloseTo(p(plain)[0]! / p(plain)[2]!, 9);
    expect(p(spread)[2]! / p(spread)[3]!).toBeCloseTo((p(plain)[2]! / p(plain)[3]!) * Math.E, 9);
    expect(p(spread)[2]! / p(spread)[4]!).toBeCloseTo((p(plain)[2]! / p(plain)[4]!) * Math.E ** 2, 9);
    expect(Math.abs(spread.score - 1)).toBeLessThan(Math.abs(plain.score - 1));
    expect(spread.confidence).toBeGreaterThan(plain.confidence);
    // The same map on a choice question: its options have no order, so no spread.
    const keys = ["a", "b", "c", "d", "e"];
    const c1 = answer({ type: "choice", keys }, r, fitWith({ choice: { bias: 0.5, weights: {} } }));
    const c2 = answer({ type: "choice", keys }, r, fitWith({ choice: { bias: 0.5, weights: {}, spread: 1 } }));
    expect(c2).toEqual(c1);
    // nearChosen keeps the chosen level the argmax, even from a tie.
    const tied = nearChosen([0.4, 0.4, 0.2], 0, 0.5);
    expect(tied[0]).toBeGreaterThan(tied[1]!);
    expect(tied.reduce((a, b) => a + b, 0)).toBeCloseTo(1, 12);
  });

  it("answers noul from the map's probability of true", () => {
    const r = reading([log([0.7, 0.3])], log([0.5, 0.5]));
    const a = answer({ type: "noul", keys: ["true", "false"] }, r, fitWith({ noul: { bias: 0.5, weights: { raw: 1 } } }));
    if (a.type !== "noul") throw new Error("not noul");
    expect(a.noul).toBeCloseTo(1 / (1 + Math.exp(-(0.5 + Math.log(0.7 / 0.3)))), 9);
  });

  it("drops a choice or score map read under another debias mode (it reads the presentations), keeps a noul map", () => {
    const fit = {
      build_hash: "x",
      fitted_at: "",
      temperatures: {},
      data: [],
      debias: "cyclic",
      confidence: { choice: { bias: 2, weights: {} }, noul: { bias: 1, weights: {} } },
    };
    expect(calibrationForMode(fit, "cyclic")?.confidence).toEqual(fit.confidence);
    expect(calibrationForMode(fit, "off")?.confidence).toEqual({ noul: { bias: 1, weights: {} } });
  });

  it("leaves a shortlisted question to its regime's maps", () => {
    const r = { ...reading([log([0.6, 0.3, 0.1])]), shortlisted: true };
    const a = answer({ type: "choice", keys: ["a", "b", "c"] }, r, fitWith({ choice: { bias: 5, weights: {} } }));
    if (a.type !== "choice") throw new Error("not a choice");
    expect(a.probabilities.a).toBeCloseTo(softmax(r.lp)[0]!, 12);
  });
});

describe("fitting a confidence map", () => {
  it("weighs every set the same, and noul classes the same within a set", () => {
    const items: ConfidenceItem[] = [
      ...Array.from({ length: 30 }, () => ({ dataset: "big", type: "choice" as const, features: {}, y: true, gold: true })),
      ...Array.from({ length: 10 }, () => ({ dataset: "small", type: "choice" as const, features: {}, y: false, gold: false })),
    ];
    const w = setWeights(items);
    expect(w.slice(0, 30).reduce((s, x) => s + x, 0)).toBeCloseTo(w.slice(30).reduce((s, x) => s + x, 0), 12);
    // So an intercept-only map lands halfway between the sets, not at their pooled 0.75.
    expect(applyConfidenceMap(fitConfidenceMap(items, []), {})).toBeCloseTo(0.5, 6);
  });

  it("recovers the logistic model the data were drawn from", () => {
    const rand = mulberry32(7);
    const items: ConfidenceItem[] = Array.from({ length: 4000 }, (_, i) => {
      const top = rand() * 6 - 3;
      const agree = rand();
      const p = 1 / (1 + Math.exp(-(0.5 + 1.5 * top - 2 * agree)));
      const y = rand() < p;
      return { dataset: `set${i % 4}`, type: "choice", features: { top, agree }, y, gold: y };
    });
    const map = fitConfidenceMap(items, ["top", "agree"], 0);
    expect(map.bias).toBeCloseTo(0.5, 0);
    expect(map.weights.top).toBeCloseTo(1.5, 0);
    expect(map.weights.agree).toBeCloseTo(-2, 0);
  });

  it("judges each set by a map fitted on the others, and ships a map that beats a flattening one", () => {
    const rand = mulberry32(11);
    // Three sets whose right answers the shipped maps (identity here) read far too flat:
    // the averaged reading is near uniform, while the presentations agree when the answer is right.
    const items: FitItem[] = [];
    for (const dataset of ["a", "b", "c"]) {
      for (let i = 0; i < 150; i++) {
        const right = rand() < 0.85;
        const gold = right ? 0 : 1;
        const sure = right ? 0.45 : 0.3;
        const pres = [0, 1, 2].map(() => log([sure + rand() * 0.05, (1 - sure) / 2, (1 - sure) / 2]));
        const r = reading(pres);
        items.push({ dataset, type: "choice", lp: r.lp, gold, reading: r });
      }
    }
    const fit = fitConfidence(items, null);
    const rows = fit.rows.filter((r) => r.type === "choice");
    expect(rows.map((r) => r.dataset).sort()).toEqual(["a", "b", "c"]);
    for (const r of rows) {
      expect(r.heldOut.ece!).toBeLessThan(r.shipped.ece!);
      expect(r.heldOut.accuracy).toBe(r.shipped.accuracy);
    }
    expect(fit.maps.choice).toBeDefined();
    expect(confidenceItems(items).every((it) => it.type === "choice")).toBe(true);
  });

  it("does not ship a noul map that answers a set worse, however much it lowers the pooled ECE", () => {
    const rand = mulberry32(5);
    // Sets a and b read every false statement as a weak yes (z ≈ 1) and the true ones as a strong
    // yes (z ≈ 3): held out, they want the 0.5 line near z = 2. Set c reads its true statements at
    // z ≈ 1.5 and is answered right as read: a map from a and b would answer them false.
    const items: FitItem[] = [];
    const noul = (dataset: string, z: number, truth: boolean) => {
      const lp = [-Math.log1p(Math.exp(-z)), -Math.log1p(Math.exp(z))];
      items.push({ dataset, type: "noul", lp, gold: truth ? 0 : 1, reading: { ...singleReading(lp), prior: null } });
    };
    for (const dataset of ["a", "b"]) {
      for (let i = 0; i < 100; i++) noul(dataset, 3 + rand() * 0.4, true);
      for (let i = 0; i < 100; i++) noul(dataset, 1 + rand() * 0.4, false);
    }
    for (let i = 0; i < 100; i++) noul("c", 1.5 + rand() * 0.2, true);
    for (let i = 0; i < 100; i++) noul("c", -2 - rand() * 0.4, false);
    const fit = fitConfidence(items, null);
    const c = fit.rows.find((r) => r.dataset === "c")!;
    expect(c.heldOut.accuracy!).toBeLessThan(c.shipped.accuracy!);
    expect(fit.choice.noul!.ships).toBe(false);
    expect(fit.maps.noul).toBeUndefined();
  });

  it("measures the expected level's error with the chosen level set and the others in proportion", () => {
    // E = 0.6 + 2·0.3 = 1.2; with the top at 0.9 the rest keep 1:3, so E = 0.9 + 2·0.075 = 1.05.
    expect(expectedLevelError([0.1, 0.6, 0.3], 1)).toBeCloseTo(0.2, 12);
    expect(expectedLevelError([0.1, 0.6, 0.3], 1, 0.9)).toBeCloseTo(0.05, 12);
  });

  it("does not ship a score map that moves the expected level away from the gold one, however much it lowers the ECE", () => {
    const rand = mulberry32(7);
    // Five levels read almost flat, level 0 a little ahead: right 45% of the time, and wrong with the
    // gold level at the far end. A map that states the 45% sharpens the reading toward level 0, which
    // calibrates it and moves the expected level (the answer's score) away from the gold level on average.
    const items: FitItem[] = [];
    for (const dataset of ["a", "b", "c"]) {
      for (let i = 0; i < 200; i++) {
        const gold = rand() < 0.45 ? 0 : 4;
        const top = 0.22 + rand() * 0.01;
        const rest = (1 - top) / 4;
        const r = reading([0, 1].map(() => log([top, rest, rest, rest, rest])));
        items.push({ dataset, type: "score", lp: r.lp, gold, reading: r });
      }
    }
    const fit = fitConfidence(items, null);
    for (const r of fit.rows.filter((x) => x.type === "score")) expect(r.heldOut.ece!).toBeLessThan(r.shipped.ece!);
    expect(fit.choice.score!.candidates.every((c) => !c.keepsAccuracy)).toBe(true);
    expect(fit.maps.score).toBeUndefined();
  });

  it("fits the spread that the gold levels were drawn with, and none where misses land anywhere on the scale", () => {
    const rand = mulberry32(3);
    const draw = (p: readonly number[]) => {
      let u = rand();
      for (let i = 0; i < p.length; i++) if ((u -= p[i]!) < 0) return i;
      return p.length - 1;
    };
    // Flat readings with level m chosen; the gold level drawn from the answer the spread λ = 0.7 would give.
    const sets = [0, 1, 2].map(() =>
      Array.from({ length: 400 }, () => {
        const m = Math.floor(rand() * 5);
        const dist = [0, 1, 2, 3, 4].map((i) => (i === m ? 0.3 : 0.175));
        const top = 0.45 + rand() * 0.2;
        return { dist, gold: draw(withTop(nearChosen(dist, m, 0.7), m, top)), top };
      }),
    );
    expect(fitSpread(sets)).toBeGreaterThan(0.5);
    expect(fitSpread(sets)).toBeLessThan(0.9);
    // Misses spread evenly over the other levels: leaning toward the chosen one only costs.
    const even = sets.map((set) => set.map((it) => ({ ...it, gold: draw(withTop(it.dist, argmaxOf(it.dist), it.top)) })));
    expect(fitSpread(even)).toBeLessThan(0.1);
  });

  it("ships a score map's spread only where, held out, it lowers the log-loss without moving the level away", () => {
    const rand = mulberry32(9);
    // Four 5-level sets read in two orders that agree when right; misses land next to the chosen level.
    const items: FitItem[] = [];
    for (const dataset of ["a", "b", "c", "d"]) {
      for (let i = 0; i < 150; i++) {
        const m = Math.floor(rand() * 5);
        const right = rand() < 0.7;
        const gold = right ? m : m === 0 ? 1 : m === 4 ? 3 : m + (rand() < 0.5 ? -1 : 1);
        const pres = [0, 1].map((j) => log([0, 1, 2, 3, 4].map((l) => (l === m ? (right || j === 0 ? 0.32 : 0.16) : l === gold && !right && j === 1 ? 0.3 : 0.17))));
        const r = reading(pres);
        items.push({ dataset, type: "score", lp: r.lp, gold, reading: r });
      }
    }
    const fit = fitConfidence(items, null);
    const spread = fit.choice.score!.spread!;
    expect(fit.maps.score).toBeDefined();
    expect(spread.rows.map((r) => r.dataset).sort()).toEqual(["a", "b", "c", "d"]);
    for (const r of spread.rows) expect(r.logLoss[1]).toBeLessThan(r.logLoss[0]);
    expect(spread.ships).toBe(true);
    expect(fit.maps.score!.spread).toBe(spread.lambda);
  });

  it("calls a set answered worse only beyond chance (one-sided McNemar)", () => {
    const items = (n: number): ConfidenceItem[] => Array.from({ length: n }, () => ({ dataset: "s", type: "noul", features: {}, y: true, gold: true }));
    const set = items(150);
    const right = set.map(() => 0.9);
    // Two items turned wrong, none right: within chance (2 > 1.645·√2 = 2.33 is false)...
    expect(answersWorse(set, right, right.map((p, i) => (i < 2 ? 0.1 : p)))).toBe(false);
    // ...four turned wrong, none right, is not (4 > 3.29); nor is 12 wrong against 2 right (10 > 6.16).
    expect(answersWorse(set, right, right.map((p, i) => (i < 4 ? 0.1 : p)))).toBe(true);
    const mixed = right.map((p, i) => (i < 2 ? 0.1 : p));
    expect(answersWorse(set, mixed, mixed.map((p, i) => (i < 2 ? 0.9 : i < 14 ? 0.1 : p)))).toBe(true);
    // The same answers either way is never worse.
    expect(answersWorse(set, right, right)).toBe(false);
  });
});
