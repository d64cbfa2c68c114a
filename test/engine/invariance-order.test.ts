/**
 * Option-order invariance on the real exported model (never a stub), with
 * ASSAY_DEBIAS=cyclic: a choice question gets the same probabilities
 * whatever order its options are written in, and a score question asked with
 * its levels reversed gets the mirrored answer. Billing counts the caller's
 * own question once.
 *
 * Cost: one engine; 3 choice passes (4 presentations each), 2 score passes.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config/index.js";
import { prepare } from "../../src/families/general.js";
import { EnginePipeline } from "../../src/pipeline/index.js";
import { NO_DEBIAS } from "../../src/prompt/index.js";
import type { ChoiceAnswer, Question, ScoreAnswer } from "../../src/validate/schema.js";
import { ask, smallDeployment } from "./engine.js";

/** Packing noise between requests of different layout (as in invariance.test.ts). */
const TOL = 0.005;

const STATE = "Shares of the chip maker jumped 12% after it raised its full-year revenue forecast on strong data-centre demand.";
const OPTIONS: Record<string, string | null> = { World: null, Sports: null, Business: null, "Sci/Tech": "science and technology" };

const reorder = (keys: string[]): Question => ({
  type: "choice",
  instructions: "What is the topic of the news?",
  criteria: Object.fromEntries(keys.map((k) => [k, OPTIONS[k] ?? null])),
});

let engine: EnginePipeline;
beforeAll(async () => {
  // Invariance is the debiasing's, by construction, on any build: the small deployment.
  engine = await EnginePipeline.create(loadConfig({ ...process.env, ...smallDeployment(), LOG_LEVEL: "silent", ASSAY_DEBIAS: "cyclic", ASSAY_DEBIAS_MAX_SHIFTS: "8" }));
});
afterAll(async () => {
  await engine?.close();
});

describe("option-order debiasing on the real model", () => {
  it("choice: the same probabilities for any order of the options", async () => {
    const orders = [
      ["World", "Sports", "Business", "Sci/Tech"],
      ["Sci/Tech", "Business", "Sports", "World"],
      ["Business", "World", "Sci/Tech", "Sports"],
    ];
    const answers: ChoiceAnswer[] = [];
    for (const o of orders) {
      const res = await ask(engine, STATE, { topic: reorder(o) });
      answers.push(res.answers.topic as ChoiceAnswer);
    }
    const [first, ...rest] = answers;
    for (const a of rest) {
      expect(a.choice).toBe(first!.choice);
      for (const k of Object.keys(OPTIONS)) expect(Math.abs(a.probabilities[k]! - first!.probabilities[k]!), k).toBeLessThanOrEqual(TOL);
    }
  });

  it("score: levels reversed give the mirrored answer", async () => {
    const levels = ["very negative", "negative", "neutral", "positive", "very positive"];
    const up = (await ask(engine, STATE, { s: { type: "score", instructions: "How positive is the news for the company?", criteria: levels } }))
      .answers.s as ScoreAnswer;
    const down = (
      await ask(engine, STATE, { s: { type: "score", instructions: "How positive is the news for the company?", criteria: [...levels].reverse() } })
    ).answers.s as ScoreAnswer;
    // Both requests show the same two texts (up and down, no direction word).
    for (let i = 0; i < 5; i++) expect(Math.abs(up.probabilities[String(i)]! - down.probabilities[String(4 - i)]!)).toBeLessThanOrEqual(TOL);
    expect(Math.abs(up.score - (4 - down.score))).toBeLessThanOrEqual(4 * TOL);
  });

  it("usage counts the prefix and the caller's own question once, whatever the debias setting", async () => {
    const lb = engine.build("judge-latest");
    // In canonical (sorted) order and not: both are charged as written.
    for (const keys of [
      ["Business", "Sci/Tech", "Sports", "World"],
      ["World", "Sports", "Business", "Sci/Tech"],
    ]) {
      const q = reorder(keys);
      const res = await ask(engine, STATE, { topic: q });
      const plain = prepare(lb, STATE, { topic: q }, undefined, { debias: NO_DEBIAS });
      const debiased = prepare(lb, STATE, { topic: q }, undefined, { debias: { mode: "cyclic", maxShifts: 8 } });
      expect(plain.packed.branches).toBe(1);
      // Four presentations, read in one block behind their shared stem (pack.ts).
      expect(debiased.encoded).toHaveLength(4);
      expect(debiased.packed.branches).toBe(1);
      expect(debiased.packed.inputIds.length).toBeGreaterThan(plain.packed.inputIds.length + 50);
      expect(debiased.packed.promptTokens).toBe(plain.packed.promptTokens);
      expect(res.usage.input_tokens).toBe(plain.packed.promptTokens);
    }
  });
});
