import { describe, expect, it } from "vitest";
import { buildPrompt, buildQuestion, NO_DEBIAS, presentationOrders, styleFromTemplate, type Debias } from "../../src/prompt/index.js";
import type { Question } from "../../src/validate/schema.js";

const CHATML = styleFromTemplate("<|im_start|>");
const CYCLIC: Debias = { mode: "cyclic", maxShifts: 8 };

const choice = (keys: string[]): Question => ({
  type: "choice",
  instructions: "Which topic?",
  criteria: Object.fromEntries(keys.map((k) => [k, k === "Sports" ? "games and athletes" : null])),
});

/** Every presentation's suffix of one question, as buildPrompt writes them. */
const suffixes = (q: Question, debias: Debias) => {
  const p = buildPrompt(CHATML, "state", { q }, debias).questions[0]!;
  return [p.suffix, ...(p.variants ?? [])];
};

describe("presentationOrders", () => {
  it("off: the caller's order, once", () => {
    expect(presentationOrders(choice(["b", "a", "c"]), NO_DEBIAS)).toEqual([[0, 1, 2]]);
    expect(buildPrompt(CHATML, "s", { q: choice(["b", "a"]) }).questions[0]!.variants).toBeUndefined();
  });

  it("cyclic: every shift of the canonical (sorted) order; each option visits every position once", () => {
    const orders = presentationOrders(choice(["World", "Sports", "Business", "Sci/Tech"]), CYCLIC);
    expect(orders).toHaveLength(4);
    // canonical: Business(2), Sci/Tech(3), Sports(1), World(0)
    expect(orders[0]).toEqual([2, 3, 1, 0]);
    for (let pos = 0; pos < 4; pos++) expect(new Set(orders.map((o) => o[pos])).size).toBe(4);
  });

  it("cyclic with more options than maxShifts: the canonical order alone", () => {
    const keys = Array.from({ length: 10 }, (_, i) => `k${9 - i}`);
    expect(presentationOrders(choice(keys), { mode: "cyclic", maxShifts: 8 })).toEqual([[9, 8, 7, 6, 5, 4, 3, 2, 1, 0]]);
    expect(presentationOrders(choice(keys), { mode: "cyclic", maxShifts: 10 })).toHaveLength(10);
  });

  it("score: low → high and high → low, never rotated", () => {
    const q: Question = { type: "score", criteria: ["low", "mid", "high"] };
    expect(presentationOrders(q, CYCLIC)).toEqual([
      [0, 1, 2],
      [2, 1, 0],
    ]);
    expect(presentationOrders(q, { mode: "cyclic", maxShifts: 1 })).toEqual([[0, 1, 2]]);
  });

  it("noul: one presentation", () => {
    expect(presentationOrders({ type: "noul", instructions: "x" }, CYCLIC)).toEqual([[]]);
  });
});

describe("debiased prompts", () => {
  it("choice: the presentations depend only on the set of options, not on the caller's order", () => {
    const a = suffixes(choice(["World", "Sports", "Business", "Sci/Tech"]), CYCLIC);
    const b = suffixes(choice(["Sci/Tech", "World", "Business", "Sports"]), CYCLIC);
    expect(b).toEqual(a);
    // ... while without debiasing the order shows.
    expect(suffixes(choice(["World", "Sports"]), NO_DEBIAS)).not.toEqual(suffixes(choice(["Sports", "World"]), NO_DEBIAS));
  });

  it("keys stay in the caller's order; every presentation reads the same number labels, each mapped to the option it numbers there", () => {
    const p = buildPrompt(CHATML, "s", { q: choice(["b", "a", "c"]) }, CYCLIC).questions[0]!;
    expect(p.keys).toEqual(["b", "a", "c"]);
    expect(p.labels).toEqual(["1", "2", "3"]);
    // Canonical order a, b, c: "1" is a (option 1), "2" is b (option 0), "3" is c.
    expect(p.option).toEqual([1, 0, 2]);
    expect(p.variants).toHaveLength(2);
    // Shifted once: b, c, a.
    expect(p.variantOptions).toEqual([
      [0, 2, 1],
      [2, 1, 0],
    ]);
    const r = buildPrompt(CHATML, "s", { q: choice(["c", "b", "a"]) }, CYCLIC).questions[0]!;
    expect(r.labels).toEqual(p.labels);
    expect([r.suffix, ...r.variants!]).toEqual([p.suffix, ...p.variants!]);
    // Canonical order a, b, c shows first; the caller's own wording is what is billed.
    expect(p.suffix.indexOf("1. a")).toBeLessThan(p.suffix.indexOf("2. b"));
    expect(p.billedSuffix).toBe(buildQuestion(CHATML, "q", choice(["b", "a", "c"])).suffix);
    // Already in canonical order: the first presentation is the caller's own text.
    expect(buildPrompt(CHATML, "s", { q: choice(["a", "b", "c"]) }, CYCLIC).questions[0]!.billedSuffix).toBeUndefined();
  });

  it("score: named levels up and down under a header without direction, the same pair for a scale and its reverse", () => {
    const q: Question = { type: "score", instructions: "How positive?", criteria: ["negative", "neutral", "positive"] };
    const [up, down] = suffixes(q, CYCLIC);
    expect(up).toMatch(/Levels:\n- negative\n- neutral\n- positive\n/);
    expect(down).toMatch(/Levels:\n- positive\n- neutral\n- negative\n/);
    // Also read by listed position, both ways: numbered 1… from the top of each list.
    const all = suffixes(q, CYCLIC);
    expect(all).toHaveLength(4);
    expect(all[2]).toMatch(/Levels:\n1\. negative\n2\. neutral\n3\. positive\nAnswer with the number of the level only\./);
    expect(all[3]).toMatch(/Levels:\n1\. positive\n2\. neutral\n3\. negative\n/);
    const rev: Question = { ...q, criteria: ["positive", "neutral", "negative"] };
    expect([...suffixes(rev, CYCLIC)].sort()).toEqual([...all].sort());
    const p = buildPrompt(CHATML, "s", { q }, CYCLIC).questions[0]!;
    expect(p.variantLabels).toEqual([["negative", "neutral", "positive"], ["1", "2", "3"], ["1", "2", "3"]]);
    // "1" is level 0 when listed up, level 2 when listed down.
    expect(p.variantOptions!.slice(1)).toEqual([
      [0, 1, 2],
      [2, 1, 0],
    ]);
    // Billing reads the caller's own wording (with its direction words).
    expect(buildPrompt(CHATML, "s", { q }, CYCLIC).questions[0]!.billedSuffix).toMatch(/from lowest to highest/);
    // Without debiasing the direction is stated as before.
    expect(buildQuestion(CHATML, "s", q, [2, 1, 0]).suffix).toMatch(/from highest to lowest:\n- positive\n- neutral\n- negative\n/);
    // Numbered levels keep their numbers when listed in reverse.
    const long = ["a".repeat(50), "b".repeat(50)];
    const numbered = buildQuestion(CHATML, "s", { type: "score", criteria: long }, [1, 0]).suffix;
    expect(numbered.indexOf(`1: ${long[1]}`)).toBeLessThan(numbered.indexOf(`0: ${long[0]}`));
  });
});
