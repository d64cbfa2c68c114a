import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { describe, expect, it } from "vitest";
import {
  accuracy,
  auroc,
  binaryPrediction,
  brier,
  flipRate,
  logSoftmax,
  macroF1,
  meanAbsoluteError,
  offByOneAccuracy,
  reliability,
  unreverseLevel,
} from "../../src/eval/metrics.js";
import { detectFormat, groupByState, readDataset, rowToItem, spread, type EvalItem } from "../../src/eval/datasets.js";
import { readAnswer, reversedQuestion } from "../../src/eval/runner.js";

describe("accuracy", () => {
  it("is the fraction correct; null when empty", () => {
    expect(accuracy([true, false, true, true])).toBe(0.75);
    expect(accuracy([])).toBeNull();
  });
});

describe("macroF1", () => {
  it("averages per-class F1 over gold ∪ predicted classes", () => {
    // a: tp1 fp0 fn1 → 2/3; b: tp1 fp2 fn0 → 1/2; c: tp0 → 0; mean 7/18
    expect(macroF1(["a", "a", "b", "c"], ["a", "b", "b", "b"])).toBeCloseTo(7 / 18, 12);
  });
  it("counts a class that is only predicted", () => {
    // x: tp1 fp0 fn1 → 2/3; y: 0 → 1/3
    expect(macroF1(["x", "x"], ["x", "y"])).toBeCloseTo(1 / 3, 12);
  });
  it("is 1 for perfect predictions and null when empty", () => {
    expect(macroF1(["a", "b"], ["a", "b"])).toBe(1);
    expect(macroF1([], [])).toBeNull();
  });
});

describe("MAE and off-by-one", () => {
  it("MAE of argmax levels", () => {
    expect(meanAbsoluteError([0, 2, 4], [1, 2, 2])).toBe(1);
  });
  it("MAE of expected levels", () => {
    expect(meanAbsoluteError([1, 3], [1.5, 2.25])).toBeCloseTo(0.625, 12);
  });
  it("off-by-one accuracy", () => {
    expect(offByOneAccuracy([0, 2, 4, 1], [1, 2, 2, 3])).toBe(0.5);
  });
});

describe("auroc", () => {
  it("counts positive-over-negative pairs", () => {
    // positives 0.9, 0.7; negatives 0.8, 0.6, 0.4 → (3 + 2) / 6
    expect(auroc([0.9, 0.8, 0.7, 0.6, 0.4], [true, false, true, false, false])).toBeCloseTo(5 / 6, 12);
  });
  it("counts ties as one half", () => {
    // (0.5 vs 0.5) ½ + (0.5 vs 0.2) 1 + (0.8 vs 0.5) 1 + (0.8 vs 0.2) 1 = 3.5 of 4
    expect(auroc([0.5, 0.5, 0.8, 0.2], [true, false, true, false])).toBeCloseTo(0.875, 12);
  });
  it("is 0 when perfectly inverted and null with one class", () => {
    expect(auroc([0.1, 0.9], [true, false])).toBe(0);
    expect(auroc([0.1, 0.9], [true, true])).toBeNull();
  });
});

describe("brier", () => {
  it("is the mean squared error of the probability", () => {
    // (0.1² + 0.2² + 0.6²) / 3 = 0.41 / 3
    expect(brier([0.9, 0.2, 0.6], [true, false, false])).toBeCloseTo(0.41 / 3, 12);
  });
});

describe("binaryPrediction", () => {
  it("predicts p > 0.5 with confidence max(p, 1 − p)", () => {
    expect(binaryPrediction(0.3)).toEqual({ pred: false, confidence: 0.7 });
    expect(binaryPrediction(0.8)).toEqual({ pred: true, confidence: 0.8 });
    expect(binaryPrediction(0.5)).toEqual({ pred: false, confidence: 0.5 });
  });
});

describe("reliability / ECE", () => {
  it("bins by ⌊c·15⌋ and weights the gaps by bin size", () => {
    // bins: 14 ← 0.95, 0.95 (acc 0.5, gap 0.45); 9 ← 0.62 (acc 1, gap 0.38); 8 ← 0.55 (acc 1, gap 0.45)
    // ECE = 2/4·0.45 + 1/4·0.38 + 1/4·0.45 = 0.4325
    const r = reliability([0.95, 0.95, 0.62, 0.55], [true, false, true, true]);
    expect(r.bins).toHaveLength(15);
    expect(r.ece).toBeCloseTo(0.4325, 12);
    expect(r.bins[14]).toMatchObject({ count: 2, accuracy: 0.5 });
    expect(r.bins[14]!.confidence).toBeCloseTo(0.95, 12);
    expect(r.bins[9]).toMatchObject({ count: 1, accuracy: 1 });
    expect(r.bins[8]).toMatchObject({ count: 1, accuracy: 1 });
    expect(r.bins[0]).toMatchObject({ count: 0, accuracy: null, confidence: null, lo: 0 });
    expect(r.bins[14]!.lo).toBeCloseTo(14 / 15, 12);
    expect(r.bins[14]!.hi).toBe(1);
  });
  it("puts confidence 1 in the last bin and 0 in the first", () => {
    const r = reliability([1, 0], [true, true]);
    expect(r.bins[14]!.count).toBe(1);
    expect(r.bins[0]!.count).toBe(1);
    // gaps: |1 − 1| and |1 − 0| → ECE 0.5
    expect(r.ece).toBeCloseTo(0.5, 12);
  });
  it("is null with no items", () => {
    expect(reliability([], []).ece).toBeNull();
  });
});

describe("flip rate", () => {
  it("is the fraction of pairs whose answer differs, ignoring missing sides", () => {
    expect(flipRate(["a", "b", "c", null], ["a", "c", "c", "a"])).toBeCloseTo(1 / 3, 12);
    expect(flipRate([0, 4], [0, 4])).toBe(0);
  });
  it("maps reversed level indices back: i → k − 1 − i", () => {
    expect([0, 1, 2, 3, 4].map((i) => unreverseLevel(i, 5))).toEqual([4, 3, 2, 1, 0]);
  });
});

describe("logSoftmax", () => {
  it("normalises log-probabilities over the labels", () => {
    const l = logSoftmax([Math.log(2), Math.log(6)]);
    expect(l[0]).toBeCloseTo(Math.log(0.25), 12);
    expect(l[1]).toBeCloseTo(Math.log(0.75), 12);
  });
});

describe("eval helpers", () => {
  const where = { file: "x.jsonl", line: 1 };
  it("detects each dataset format from its fields", () => {
    expect(detectFormat({ text: "t", question: "q", answer: true })).toBe("noul");
    expect(detectFormat({ text: "t", question: "q", options: ["a"], label: "a" })).toBe("choice");
    expect(detectFormat({ text: "t", question: "q", levels: ["l"], level: 0 })).toBe("score");
    expect(detectFormat({ document: "d", claim: "c", supported: false, label: "unsupported" })).toBe("factcheck");
    expect(() => detectFormat({ query: "q", items: [], needed: [] })).toThrow(/code search/);
  });

  it("asks a fact check as noul with the claim in the instructions", () => {
    const it = rowToItem("factcheck", { id: "f1", document: "D", claim: "C", supported: true }, where);
    expect(it).toMatchObject({ type: "noul", state: "D", gold: true, question: { instructions: "The document supports this claim: C" } });
  });

  it("reverses choice keys and score levels, and maps reversed score answers back", () => {
    const choice = rowToItem("choice", { id: "c", text: "T", question: "Q", options: ["a", "b", "c"], label: "b" }, where);
    const rq = reversedQuestion(choice);
    expect(rq.type === "choice" && Object.keys(rq.criteria)).toEqual(["c", "b", "a"]);

    const score = rowToItem("score", { id: "s", text: "T", question: "Q", levels: ["lo", "mid", "hi"], level: 2 }, where);
    const rs = reversedQuestion(score);
    expect(rs.type === "score" && rs.criteria).toEqual(["hi", "mid", "lo"]);
    // Shown level 0 is "hi" (level 2): p = [0.7, 0.2, 0.1] shown → [0.1, 0.2, 0.7] low→high
    const r = readAnswer(
      score,
      { type: "score", score: 0.4, legend: {}, probabilities: { "0": 0.7, "1": 0.2, "2": 0.1 }, confidence: 0 },
      "flip",
      null,
    );
    expect(r.probabilities).toEqual([0.1, 0.2, 0.7]);
    expect(r.pred).toBe(2);
    expect(r.expected).toBeCloseTo(1.6, 12);
    expect(r.confidence).toBe(0.7);
    expect(r.labelLogprobs[2]).toBeCloseTo(Math.log(0.7), 12);
  });

  it("reads a score file as choice questions over its level names, a set of its own", () => {
    const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "assay-ds-")), "score_x.jsonl");
    const row = (id: string, level: number) => JSON.stringify({ id, text: `T${id}`, question: "Q", levels: ["lo", "mid", "hi"], level });
    fs.writeFileSync(file, `${row("a", 2)}\n${row("b", 0)}\n`);
    const ds = readDataset(file, undefined, undefined, "choice");
    expect(ds).toMatchObject({ name: "score_x@choice", format: "choice", task: "choice", totalRows: 2 });
    expect(ds.items[0]).toEqual({
      type: "choice",
      id: "a",
      state: "Ta",
      question: { type: "choice", instructions: "Q", criteria: { lo: null, mid: null, hi: null } },
      options: ["lo", "mid", "hi"],
      gold: "hi",
    });
    expect(ds.items[1]).toMatchObject({ gold: "lo" });
    // Read as itself, the same file is a score set under its own name.
    expect(readDataset(file)).toMatchObject({ name: "score_x", task: "score", items: [{ type: "score", gold: 2 }, { gold: 0 }] });
    const noul = path.join(path.dirname(file), "noul_x.jsonl");
    fs.writeFileSync(noul, `${JSON.stringify({ id: "n", text: "T", question: "Q", answer: true })}\n`);
    expect(() => readDataset(noul, undefined, undefined, "choice")).toThrow(/only score rows can be read as choice/);
  });

  it("batches items sharing a state (up to the limit) and keeps order", () => {
    const items = ["A", "B", "A", "A", "C"].map((state, i) => ({ state, id: String(i) }));
    expect(groupByState(items, 2).map((g) => g.map((x) => x.id))).toEqual([["0", "2"], ["1"], ["3"], ["4"]]);
  });

  it("spreads a limit evenly over the file", () => {
    expect(spread([0, 1, 2, 3, 4, 5, 6, 7], 4)).toEqual([0, 2, 4, 6]);
    expect(spread([0, 1], 5)).toEqual([0, 1]);
  });

  it("reads noul answers as [true, false]", () => {
    const item: EvalItem = { type: "noul", id: "n", state: "s", question: { type: "noul" }, gold: true };
    const r = readAnswer(item, { type: "noul", noul: 0.2 }, "main", null);
    expect(r).toMatchObject({ pred: false, noul: 0.2 });
    expect(r.confidence).toBeCloseTo(0.8, 12);
  });
});
