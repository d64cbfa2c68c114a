/**
 * Structured text on the real exported model (never a stub): instructions,
 * noul sides, option descriptions and score levels sent as objects or arrays
 * are read by the model as their JSON text, the way a JSON state is. So a
 * structured question answers exactly as the same question with that JSON
 * text as a string (calibration, debiasing and the packed pass see the same
 * prompt), the legend shows the level's JSON text, option-order debiasing
 * holds for structured descriptions and multi-token keys, and a repeated
 * request takes its state from the prefix cache.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { EnginePipeline } from "../../src/pipeline/index.js";
import { Timings } from "../../src/pipeline/timings.js";
import type { ChoiceAnswer, NoulAnswer, ScoreAnswer, SystemOneResponse } from "../../src/validate/schema.js";
import { smallDeployment, startEngine } from "./engine.js";

const STATE = {
  subject: "Charged twice for March",
  body: "I was billed twice for my March plan. Please refund the second charge or I will dispute it with my bank.",
  customer: { plan: "pro", tickets: 3 },
};
const TOL = 0.005;

let engine: EnginePipeline;
beforeAll(async () => {
  // What is read is the prompt: the small deployment (every name on the 0.5B) reads it as any build does.
  engine = await startEngine(smallDeployment());
});
afterAll(async () => {
  await engine.close();
});

async function run(questions: Record<string, unknown>, timings = new Timings()): Promise<SystemOneResponse> {
  return engine.run({ model: "judge-latest", state: STATE, questions }, { requestId: "structured", orgId: "test", timings });
}

const text = (v: unknown) => JSON.stringify(v);

const NOUL_INSTR = { task: "Decide whether the customer wants money back", include: ["refunds", "chargebacks"] };
const NOUL_TRUE = { examples: ["refund me", "I'll dispute this"] };
const NOUL_FALSE = ["questions", "complaints without a request"];
const PRAISE = { task: "Decide whether the customer praises the service", include: ["thanks", "compliments"] };
const CHOICE_INSTR = ["Route the ticket.", "Pick exactly one team."];
const BILLING = { owns: ["invoices", "refunds"] };
const TECH = ["bugs", "outages"];
const LEVELS = [{ level: "calm" }, ["annoyed", "terse"], "angry", { level: "furious", signs: ["threats"] }];

describe("structured text on the real model", () => {
  it("answers exactly as the same question with the JSON text as a string", async () => {
    const structured = await run({
      refund: { type: "noul", instructions: NOUL_INSTR, criteria: { true: NOUL_TRUE, false: NOUL_FALSE } },
      team: { type: "choice", instructions: CHOICE_INSTR, criteria: { Billing: BILLING, Technical: TECH, Sales: "Pricing" } },
      anger: { type: "score", instructions: { scale: "frustration" }, criteria: LEVELS },
      praise: { type: "noul", instructions: PRAISE },
    });
    const strings = await run({
      refund: { type: "noul", instructions: text(NOUL_INSTR), criteria: { true: text(NOUL_TRUE), false: text(NOUL_FALSE) } },
      team: { type: "choice", instructions: text(CHOICE_INSTR), criteria: { Billing: text(BILLING), Technical: text(TECH), Sales: "Pricing" } },
      anger: { type: "score", instructions: text({ scale: "frustration" }), criteria: LEVELS.map((l) => (typeof l === "string" ? l : text(l))) },
      praise: { type: "noul", instructions: text(PRAISE) },
    });
    expect(structured.answers).toEqual(strings.answers);
    expect(structured.usage).toEqual(strings.usage);
    // A real reading, not a degenerate one: the ticket asks for money back rather than praising, and is about billing.
    expect((structured.answers.refund as NoulAnswer).noul).toBeGreaterThan((structured.answers.praise as NoulAnswer).noul + 0.1);
    expect((structured.answers.team as ChoiceAnswer).choice).toBe("Billing");
    const anger = structured.answers.anger as ScoreAnswer;
    // The legend shows each level as the model read it: its JSON text, never null.
    expect(anger.legend).toEqual({ "0": text(LEVELS[0]), "1": text(LEVELS[1]), "2": "angry", "3": text(LEVELS[3]) });
    expect(Object.values(anger.probabilities).reduce((a, b) => a + b, 0)).toBeCloseTo(1, 6);
  });

  it("null criteria and a null side read as absent", async () => {
    const absent = await run({ refund: { type: "noul", instructions: "The customer asks for a refund." } });
    const nulls = await run({ refund: { type: "noul", instructions: "The customer asks for a refund.", criteria: null } });
    expect(nulls.answers).toEqual(absent.answers);
    const oneSided = await run({ refund: { type: "noul", instructions: "The customer asks for a refund.", criteria: { true: "wants money back" } } });
    const nullSide = await run({ refund: { type: "noul", instructions: "The customer asks for a refund.", criteria: { true: "wants money back", false: null } } });
    expect(nullSide.answers).toEqual(oneSided.answers);
  });

  it("option order does not move a choice with structured descriptions and multi-token keys", async () => {
    const options: [string, unknown][] = [
      ["Billing and payments", BILLING],
      ["Technical support", TECH],
      ["Sales", { owns: ["pricing", "upgrades"] }],
      ["Account security", null],
    ];
    const orders = [options, [...options].reverse(), [options[2]!, options[0]!, options[3]!, options[1]!]];
    const answers: ChoiceAnswer[] = [];
    for (const o of orders) {
      const res = await run({ team: { type: "choice", instructions: CHOICE_INSTR, criteria: Object.fromEntries(o) } });
      answers.push(res.answers.team as ChoiceAnswer);
    }
    expect(answers[0]!.choice).toBe("Billing and payments");
    for (const a of answers.slice(1)) {
      expect(a.choice).toBe(answers[0]!.choice);
      for (const [k] of options) expect(Math.abs(a.probabilities[k]! - answers[0]!.probabilities[k]!), k).toBeLessThanOrEqual(TOL);
    }
  });

  it("structured score levels reversed give the mirrored answer", async () => {
    const up = (await run({ a: { type: "score", instructions: { scale: "frustration" }, criteria: LEVELS } })).answers.a as ScoreAnswer;
    const down = (await run({ a: { type: "score", instructions: { scale: "frustration" }, criteria: [...LEVELS].reverse() } })).answers.a as ScoreAnswer;
    const k = LEVELS.length;
    for (let i = 0; i < k; i++) expect(Math.abs(up.probabilities[String(i)]! - down.probabilities[String(k - 1 - i)]!)).toBeLessThanOrEqual(TOL);
    expect(Math.abs(up.score - (k - 1 - down.score))).toBeLessThanOrEqual((k - 1) * TOL);
  });

  it("a repeated structured request takes its state from the prefix cache and answers the same", async () => {
    const qs = { refund: { type: "noul", instructions: NOUL_INSTR, criteria: { true: NOUL_TRUE } } };
    const t1 = new Timings();
    const first = await run(qs, t1);
    const t2 = new Timings();
    const second = await run(qs, t2);
    expect(Number(t2.headers()["x-prefix-cache-tokens"])).toBeGreaterThan(0);
    expect(Math.abs((second.answers.refund as NoulAnswer).noul - (first.answers.refund as NoulAnswer).noul)).toBeLessThanOrEqual(1e-4);
  });
});
