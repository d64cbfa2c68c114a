import { describe, expect, it } from "vitest";
import {
  answer,
  argmax,
  choiceAnswer,
  choiceConfidence,
  noulAnswer,
  scoreAnswer,
  scoreConfidence,
  softmax,
  temperatureFor,
  topLabelFor,
} from "../../src/probability/index.js";
import type { CalibrationFit } from "../../src/models/manifest.js";

const sum = (xs: readonly number[]) => xs.reduce((a, b) => a + b, 0);
const fit = (temperatures: Record<string, number>): CalibrationFit => ({
  build_hash: "abc",
  fitted_at: "2025-01-01T00:00:00Z",
  temperatures,
  data: [],
});

describe("softmax", () => {
  it("turns log-probabilities into probabilities", () => {
    const p = softmax([Math.log(1), Math.log(2), Math.log(5)]);
    expect(p[0]).toBeCloseTo(1 / 8, 12);
    expect(p[1]).toBeCloseTo(2 / 8, 12);
    expect(p[2]).toBeCloseTo(5 / 8, 12);
    expect(sum(p)).toBeCloseTo(1, 12);
  });

  it("renormalises label log-probabilities that do not add up to 1", () => {
    // Two labels with 2% and 6% of the model's mass → 25% / 75%.
    const p = softmax([Math.log(0.02), Math.log(0.06)]);
    expect(p[0]).toBeCloseTo(0.25, 12);
    expect(p[1]).toBeCloseTo(0.75, 12);
  });

  it("subtracts the true max: [-1000, 1] does not overflow or underflow to NaN", () => {
    const p = softmax([-1000, 1]);
    expect(p.every(Number.isFinite)).toBe(true);
    expect(p[1]).toBe(1);
    expect(p[0]).toBeGreaterThanOrEqual(0);
    expect(p[0]).toBeLessThan(1e-300);
  });

  it("large logits do not overflow", () => {
    const p = softmax([1000, 1001]);
    expect(p[0]).toBeCloseTo(1 / (1 + Math.E), 12);
    expect(p[1]).toBeCloseTo(Math.E / (1 + Math.E), 12);
    const q = softmax([-1000, -1001, -1000]);
    expect(q.every(Number.isFinite)).toBe(true);
    expect(sum(q)).toBeCloseTo(1, 12);
    expect(q[0]).toBeCloseTo(q[2]!, 15);
  });

  it("the max is not assumed to be the first element", () => {
    const p = softmax([-5, 700, 699]);
    expect(p[1]).toBeCloseTo(Math.E / (1 + Math.E), 12);
    expect(p[2]).toBeCloseTo(1 / (1 + Math.E), 12);
  });

  it("divides by the temperature", () => {
    const lp = [0, Math.log(2)];
    const t2 = softmax(lp, 2);
    expect(t2[0]).toBeCloseTo(1 / (1 + Math.SQRT2), 12);
    expect(t2[1]).toBeCloseTo(Math.SQRT2 / (1 + Math.SQRT2), 12);
    const t05 = softmax(lp, 0.5);
    expect(t05[0]).toBeCloseTo(1 / 5, 12);
    expect(t05[1]).toBeCloseTo(4 / 5, 12);
    // T = 1 is the default.
    expect(softmax(lp)).toEqual(softmax(lp, 1));
  });

  it("a high temperature flattens, a low one sharpens", () => {
    const lp = [-0.2, -1.5, -3];
    const hot = softmax(lp, 100);
    const cold = softmax(lp, 0.01);
    for (const x of hot) expect(x).toBeCloseTo(1 / 3, 2);
    expect(cold[0]).toBeCloseTo(1, 12);
  });

  it("-Infinity entries get 0; all -Infinity falls back to uniform", () => {
    expect(softmax([-Infinity, 0])).toEqual([0, 1]);
    expect(softmax([-Infinity, -Infinity, -Infinity, -Infinity])).toEqual([0.25, 0.25, 0.25, 0.25]);
  });

  it("always sums to 1", () => {
    for (const lp of [
      [-0.1, -2.3],
      [-12.5, -0.001, -7, -7, -30],
      Array.from({ length: 255 }, (_, i) => -i / 10),
    ]) {
      expect(sum(softmax(lp))).toBeCloseTo(1, 12);
      expect(sum(softmax(lp, 1.7))).toBeCloseTo(1, 12);
    }
  });
});

describe("argmax", () => {
  it("index of the largest value; the first one on ties", () => {
    expect(argmax([0.1, 0.7, 0.2])).toBe(1);
    expect(argmax([0.4, 0.4, 0.2])).toBe(0);
    expect(argmax([0.2, 0.4, 0.4])).toBe(1);
  });
});

describe("choiceConfidence = (p_max − 1/k) / (1 − 1/k), clipped to [0, 1]", () => {
  it("1 when one option holds all the mass", () => {
    expect(choiceConfidence([1, 0])).toBe(1);
    expect(choiceConfidence([0, 0, 1, 0])).toBe(1);
  });

  it("0 when all options are equally likely", () => {
    expect(choiceConfidence([0.5, 0.5])).toBe(0);
    expect(choiceConfidence([0.25, 0.25, 0.25, 0.25])).toBeCloseTo(0, 12);
    expect(choiceConfidence(Array(7).fill(1 / 7))).toBeCloseTo(0, 12);
  });

  it("worked examples", () => {
    // k = 3, p_max = 0.7: (0.7 − 1/3) / (2/3) = 0.55
    expect(choiceConfidence([0.7, 0.2, 0.1])).toBeCloseTo(0.55, 12);
    // k = 2, p_max = 0.8: (0.8 − 0.5) / 0.5 = 0.6
    expect(choiceConfidence([0.2, 0.8])).toBeCloseTo(0.6, 12);
    // k = 4, p_max = 0.4: (0.4 − 0.25) / 0.75 = 0.2
    expect(choiceConfidence([0.1, 0.4, 0.3, 0.2])).toBeCloseTo(0.2, 12);
  });

  it("stays within [0, 1]", () => {
    // Rounding can push p_max slightly past 1 or below 1/k.
    expect(choiceConfidence([1 + 1e-12, 0])).toBe(1);
    expect(choiceConfidence([0.5 - 1e-12, 0.5 - 1e-12])).toBe(0);
  });
});

describe("scoreConfidence = max(0, 1 − Σ p_i|i−m| / Σ (1/k)|i−(k−1)/2|), m = argmax (the reference formula)", () => {
  it("1 for a one-hot distribution at any level", () => {
    expect(scoreConfidence([0, 0, 1, 0, 0])).toBe(1);
    expect(scoreConfidence([1, 0, 0])).toBe(1);
    expect(scoreConfidence([0, 0, 0, 1])).toBe(1);
  });

  it("0 for a uniform distribution", () => {
    // m = 0 (first max): spread = (0+1+2+3+4)/5 = 2, above the centre's 1.2 → floored at 0
    expect(scoreConfidence([0.2, 0.2, 0.2, 0.2, 0.2])).toBe(0);
    expect(scoreConfidence([0.5, 0.5])).toBeCloseTo(0, 12);
  });

  it("worked example: peaked in the middle", () => {
    // k = 5, m = 2: spread = 0.1·(2+1+1+2) = 0.6; uniform = (2+1+0+1+2)/5 = 1.2 → 1 − 0.5 = 0.5
    expect(scoreConfidence([0.1, 0.1, 0.6, 0.1, 0.1])).toBeCloseTo(0.5, 12);
  });

  it("worked example: mass spread to one side", () => {
    // k = 3, m = 0: spread = 0.25·1 + 0.25·2 = 0.75; uniform = (1+0+1)/3 = 2/3 → floored at 0
    expect(scoreConfidence([0.5, 0.25, 0.25])).toBe(0);
    // k = 4, m = 3: spread = 0.1·3 + 0.1·2 + 0.2·1 = 0.7; uniform = (1.5+0.5+0.5+1.5)/4 = 1 → 0.3
    expect(scoreConfidence([0.1, 0.1, 0.2, 0.6])).toBeCloseTo(0.3, 12);
  });

  it("one yardstick per scale: the same shape scores the same at an end and in the middle", () => {
    const end = scoreConfidence([0.8, 0.2, 0, 0, 0]);
    const middle = scoreConfidence([0, 0, 0.8, 0.2, 0]);
    expect(end).toBeCloseTo(middle, 12);
    // spread 0.2, uniform 1.2 → 1 − 1/6
    expect(end).toBeCloseTo(1 - 0.2 / 1.2, 12);
  });

  it("matches jevcompat's reference on an 11-level scale", () => {
    // The reference (jevcompat 0.1.1, validate.score_confidence) computed by hand for this distribution:
    // m = 5, spread = Σ p_i·|i−5| = 0.05·5 + 0.05·4 + 0.1·3 + 0.1·2 + 0.1·1 + 0.1·1 + 0.1·2 + 0.1·3 + 0.05·4 + 0.05·5 = 2.1,
    // uniform = Σ |i−5| / 11 = 30/11 → 1 − 2.1·11/30 = 0.23 (jevcompat prints 0.230)
    const p = [0.05, 0.05, 0.1, 0.1, 0.1, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05];
    expect(p.reduce((x, y) => x + y, 0)).toBeCloseTo(1, 12);
    expect(scoreConfidence(p)).toBeCloseTo(1 - (2.1 * 11) / 30, 12);
  });

  it("distance matters: neighbours cost less than far levels", () => {
    const near = scoreConfidence([0, 0.3, 0.7, 0, 0]);
    const far = scoreConfidence([0.3, 0, 0.7, 0, 0]);
    expect(near).toBeGreaterThan(far);
    // near: m = 2, spread 0.3; uniform 1.2 → 0.75. far: spread 0.6 → 0.5
    expect(near).toBeCloseTo(0.75, 12);
    expect(far).toBeCloseTo(0.5, 12);
  });

  it("floored at 0 when the mass sits far from the mode", () => {
    // k = 5, m = 1 (first of the tied maxima): spread = 0.5·3 = 1.5; uniform = 1.2 → negative → 0
    expect(scoreConfidence([0, 0.5, 0, 0, 0.5])).toBe(0);
  });
});

describe("answers", () => {
  it("noul: the probability of yes (label 0) against no", () => {
    const a = noulAnswer([Math.log(0.3), Math.log(0.1)]);
    expect(a.type).toBe("noul");
    expect(a.noul).toBeCloseTo(0.75, 12);
    expect(noulAnswer([0, 0]).noul).toBe(0.5);
  });

  it("choice: every key, probabilities sum to 1, the argmax key, its confidence", () => {
    const keys = ["red", "blue", "green"];
    const a = choiceAnswer(keys, [Math.log(0.1), Math.log(0.7), Math.log(0.2)]);
    expect(a.type).toBe("choice");
    expect(Object.keys(a.probabilities)).toEqual(keys);
    expect(sum(Object.values(a.probabilities))).toBeCloseTo(1, 12);
    expect(a.choice).toBe("blue");
    expect(a.probabilities.blue).toBeCloseTo(0.7, 12);
    expect(a.confidence).toBeCloseTo(0.55, 12);
  });

  it("score: the expected level, the legend, string level keys", () => {
    const levels = ["bad", "ok", "good"];
    const a = scoreAnswer(levels, [Math.log(0.1), Math.log(0.2), Math.log(0.7)]);
    expect(a.type).toBe("score");
    // 0·0.1 + 1·0.2 + 2·0.7 = 1.6
    expect(a.score).toBeCloseTo(1.6, 12);
    expect(a.legend).toEqual({ "0": "bad", "1": "ok", "2": "good" });
    expect(Object.keys(a.probabilities)).toEqual(["0", "1", "2"]);
    expect(a.probabilities["2"]).toBeCloseTo(0.7, 12);
    expect(sum(Object.values(a.probabilities))).toBeCloseTo(1, 12);
    // m = 2: spread = 0.1·2 + 0.2·1 = 0.4; uniform about the centre = 2/3 → 0.4
    expect(a.confidence).toBeCloseTo(0.4, 12);
  });

  it("score can fall between two levels", () => {
    const a = scoreAnswer(["a", "b", "c", "d"], [0, 0, -Infinity, -Infinity]);
    expect(a.score).toBeCloseTo(0.5, 12);
  });

  it("answer() dispatches on type and applies the fitted temperature", () => {
    const lp = [0, Math.log(2)];
    const f = fit({ "noul:2": 2 });
    const n = answer({ type: "noul", keys: ["true", "false"] }, lp, f);
    expect(n.type === "noul" && n.noul).toBeCloseTo(1 / (1 + Math.SQRT2), 12);
    const unfitted = answer({ type: "noul", keys: ["true", "false"] }, lp, null);
    expect(unfitted.type === "noul" && unfitted.noul).toBeCloseTo(1 / 3, 12);
    const c = answer({ type: "choice", keys: ["x", "y"] }, lp, f); // no choice temperature → 1
    expect(c.type === "choice" && c.probabilities.y).toBeCloseTo(2 / 3, 12);
    const s = answer({ type: "score", keys: ["0", "1"], levels: ["low", "high"] }, lp, undefined);
    expect(s.type).toBe("score");
    expect(s.type === "score" && s.legend).toEqual({ "0": "low", "1": "high" });
  });
});

describe("temperatureFor", () => {
  it("is 1 without a fit", () => {
    expect(temperatureFor(null, "noul", 2)).toBe(1);
    expect(temperatureFor(undefined, "choice", 4)).toBe(1);
  });

  it("looks up `type:k` first, then `type:*`, else 1", () => {
    const f = fit({ "choice:4": 1.5, "choice:*": 1.2, "noul:2": 0.8, "score:*": 2.5 });
    expect(temperatureFor(f, "choice", 4)).toBe(1.5);
    expect(temperatureFor(f, "choice", 3)).toBe(1.2);
    expect(temperatureFor(f, "noul", 2)).toBe(0.8);
    expect(temperatureFor(f, "score", 5)).toBe(2.5);
    expect(temperatureFor(f, "score", 11)).toBe(2.5);
    expect(temperatureFor(fit({ "noul:2": 0.8 }), "choice", 2)).toBe(1);
    expect(temperatureFor(fit({}), "noul", 2)).toBe(1);
  });

  it("a many-option regime key `type:>N` applies above N, before `type:*`, even when it says identity", () => {
    const f = fit({ "choice:5": 0.7, "choice:>8": 1, "choice:*": 1.2 });
    expect(temperatureFor(f, "choice", 5)).toBe(0.7);
    expect(temperatureFor(f, "choice", 4)).toBe(1.2);
    expect(temperatureFor(f, "choice", 8)).toBe(1.2);
    expect(temperatureFor(f, "choice", 9)).toBe(1);
    expect(temperatureFor(f, "choice", 77)).toBe(1);
    expect(temperatureFor(fit({ "choice:>8": 2, "choice:>20": 3 }), "choice", 77)).toBe(3);
    expect(temperatureFor(fit({ "choice:>8": 2 }), "score", 9)).toBe(1);
  });

  it("a regime's top-label map is its own: none where only the other regime has one", () => {
    const top = { a: 0.5, b: 0.6 };
    const f = { build_hash: "x", fitted_at: "", temperatures: { "choice:*": 1.1, "choice:>8": 1 }, top_label: { "choice:*": top }, data: [] };
    expect(topLabelFor(f, "choice", 4)).toEqual(top);
    expect(topLabelFor(f, "choice", 77)).toBeUndefined();
    const g = { ...f, top_label: { "choice:*": top, "choice:>8": { a: 2, b: 0 } } };
    expect(topLabelFor(g, "choice", 77)).toEqual({ a: 2, b: 0 });
    // Files without regime keys read as before.
    expect(topLabelFor({ ...f, temperatures: { "choice:*": 1.1 } }, "choice", 77)).toEqual(top);
  });

  it("does not mix up types with the same k", () => {
    const f = fit({ "choice:2": 3, "noul:*": 0.5 });
    expect(temperatureFor(f, "noul", 2)).toBe(0.5);
    expect(temperatureFor(f, "score", 2)).toBe(1);
  });
});
