import { describe, expect, it } from "vitest";
import { answer, calibrationForMode, questionKey, singleReading, type QuestionReading } from "../../src/probability/index.js";
import { fitQuestionMaps, MIN_ITEMS, questionFitTable } from "../../src/eval/question-fit.js";
import type { FitItem } from "../../src/eval/calibrate.js";
import { mulberry32 } from "../../src/eval/calibrate.js";
import { CalibrationFit } from "../../src/models/manifest.js";
import type { Question } from "../../src/validate/schema.js";

const noulReading = (z: number): QuestionReading => {
  const lp = [-Math.log1p(Math.exp(-z)), -Math.log1p(Math.exp(z))];
  return { ...singleReading(lp), presentations: [lp] };
};

/** A build's file: a noul Platt map fitted elsewhere, which states a z of 1 as 0.5. */
const build = (extra: object = {}): CalibrationFit =>
  CalibrationFit.parse({ build_hash: "h", fitted_at: "t", temperatures: {}, platt: { "noul:2": { a: 1, b: -1 } }, debias: "cyclic", ...extra });

describe("questionKey", () => {
  const choice = (criteria: Record<string, string | null>, instructions?: string): Question => ({ type: "choice", criteria, ...(instructions ? { instructions } : {}) });

  it("names the same question whatever order its options are listed in", () => {
    expect(questionKey(choice({ a: "first", b: null }, "Which?"))).toBe(questionKey(choice({ b: null, a: "first" }, "Which?")));
  });

  it("tells questions apart by their text, their options' meaning, a score's level order and the type", () => {
    const base = questionKey(choice({ a: "first", b: null }, "Which?"));
    expect(questionKey(choice({ a: "first", b: null }, "Which one?"))).not.toBe(base);
    expect(questionKey(choice({ a: "second", b: null }, "Which?"))).not.toBe(base);
    const score = (criteria: string[]): Question => ({ type: "score", instructions: "How bad?", criteria });
    expect(questionKey(score(["low", "high"]))).not.toBe(questionKey(score(["high", "low"])));
    expect(questionKey({ type: "noul", instructions: "Which?" })).not.toBe(questionKey({ type: "choice", instructions: "Which?", criteria: { a: null, b: null } }));
    // An absent side of a noul criterion and an absent instruction read alike however they are left out.
    expect(questionKey({ type: "noul", instructions: "Is it?", criteria: { true: "yes" } })).toBe(questionKey({ type: "noul", instructions: "Is it?", criteria: { true: "yes", false: undefined } }));
  });
});

describe("answer with a map of the question's own", () => {
  it("answers that question through it, and every other question through the build's maps", () => {
    const fit = build({ questions: { k1: { type: "noul", map: { bias: -2, weights: { z: 3 } } } } });
    const r = noulReading(1);
    const own = answer({ type: "noul", keys: ["yes", "no"], key: "k1" }, r, fit);
    const other = answer({ type: "noul", keys: ["yes", "no"], key: "k2" }, r, fit);
    const none = answer({ type: "noul", keys: ["yes", "no"] }, r, fit);
    if (own.type !== "noul" || other.type !== "noul" || none.type !== "noul") throw new Error("not noul");
    expect(own.noul).toBeCloseTo(1 / (1 + Math.exp(-1)), 12);
    expect(other.noul).toBeCloseTo(0.5, 12);
    expect(none.noul).toBeCloseTo(0.5, 12);
  });

  it("ignores a map filed for another type, and under another debias mode keeps only noul maps", () => {
    const fit = build({
      questions: { n: { type: "noul", map: { bias: 0, weights: { z: 2 } } }, c: { type: "choice", map: { bias: 3, weights: {} } } },
    });
    const choice = answer({ type: "choice", keys: ["a", "b"], key: "n" }, singleReading([Math.log(0.6), Math.log(0.4)]), fit);
    if (choice.type !== "choice") throw new Error("not a choice");
    expect(choice.probabilities.a).toBeCloseTo(0.6, 12);
    const off = calibrationForMode(fit, "off");
    expect(Object.keys(off?.questions ?? {})).toEqual(["n"]);
  });
});

describe("fitQuestionMaps", () => {
  /**
   * One question the model reads on a narrow scale: its true states at z ≈ 1.2, its false ones at
   * z ≈ 0.3, every one answered right by a line at 0.75. The build's map (line at z = 1) states them
   * near 0.5 and answers some wrongly; the question's own map states them as they are.
   */
  const narrow = (key: string, n: number, seed: number): FitItem[] => {
    const rand = mulberry32(seed);
    return Array.from({ length: n }, (_, i) => {
      const truth = i % 2 === 0;
      const r = noulReading(truth ? 1.2 + rand() * 0.3 : 0.3 - rand() * 0.3);
      return { dataset: "dated", type: "noul", lp: r.lp, gold: truth ? 0 : 1, reading: r, question: key };
    });
  };

  it("ships a map for a question the build's maps state too timidly, judged out of fold", () => {
    const fit = fitQuestionMaps(narrow("q", 100, 3), build());
    const row = fit.rows[0]!;
    expect(row.n).toBe(100);
    expect(row.after!.ece!).toBeLessThan(row.before.ece!);
    expect(row.after!.accuracy!).toBeGreaterThanOrEqual(row.before.accuracy!);
    expect(row.ships).toBe(true);
    expect(fit.maps["q"]!.type).toBe("noul");
    expect(fit.maps["q"]!.map.weights["z"]!).toBeGreaterThan(1);
    expect(questionFitTable(fit)).toContain("yes (z)");
  });

  it("fits nothing for a question with too few labelled states", () => {
    const few = fitQuestionMaps(narrow("q", MIN_ITEMS - 1, 3), build());
    expect(few.maps).toEqual({});
    expect(few.rows[0]!.after).toBeNull();
    expect(few.rows[0]!.note).toMatch(/fewer than/);
  });

  it("gains nothing to speak of on a question the build already states right", () => {
    // States drawn from the build's own map: calibrated already.
    const rand = mulberry32(9);
    const calibrated: FitItem[] = Array.from({ length: 400 }, () => {
      const z = -3 + rand() * 8;
      const truth = rand() < 1 / (1 + Math.exp(-(z - 1)));
      const r = noulReading(z);
      return { dataset: "plain", type: "noul", lp: r.lp, gold: truth ? 0 : 1, reading: r, question: "p" };
    });
    const same = fitQuestionMaps(calibrated, build());
    expect(same.rows[0]!.after!.ece! + 0.02).toBeGreaterThan(same.rows[0]!.before.ece!);
    expect(same.rows[0]!.after!.meanConfidence!).toBeCloseTo(same.rows[0]!.before.meanConfidence!, 1);
  });

  it("keeps questions apart and skips items that name none", () => {
    const items = [...narrow("a", 60, 1), ...narrow("b", 60, 2)];
    const unnamed = narrow("x", 60, 5).map(({ question: _q, ...it }) => it);
    const fit = fitQuestionMaps([...items, ...unnamed], build());
    expect(fit.rows.map((r) => r.key).sort()).toEqual(["a", "b"]);
  });
});
