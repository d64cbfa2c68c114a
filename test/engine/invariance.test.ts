/**
 * Packing invariance on the real exported model (never a stub): a question
 * gets the same answer whether it is asked alone or together with others,
 * because each question's block only sees the shared prefix and itself.
 *
 * Cost: 4 single-question passes, one 64-question pass, two 2-question passes.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { passLimit } from "../../src/engine/index.js";
import { prepare } from "../../src/families/general.js";
import type { EnginePipeline } from "../../src/pipeline/index.js";
import type { Answer, Question } from "../../src/validate/schema.js";
import { ask, smallDeployment, startEngine } from "./engine.js";

const TOL = 0.005;

const STATE =
  "Hi, I paid with my card in a shop abroad yesterday and my bank charged me an extra fee for the card payment. " +
  "Why was I charged this fee? Please refund it.";

/** The questions under test: one of each kind, plus multi-token (and nested) keys. */
const TARGETS = {
  fee: { type: "noul", instructions: "The customer is asking about a fee." },
  kind: {
    type: "choice",
    instructions: "What kind of message is this?",
    criteria: {
      question: "asks for information",
      complaint: "complains about a problem",
      praise: "praises the service",
      spam: "unsolicited advertising",
    },
  },
  urgency: {
    type: "score",
    instructions: "How urgent is this message?",
    criteria: ["not urgent", "slightly urgent", "moderately urgent", "urgent", "extremely urgent"],
  },
  intent: {
    type: "choice",
    instructions: "Which banking intent fits the message?",
    criteria: {
      card_payment_fee_charged: null,
      cash_withdrawal: null,
      card_payment_wrong_amount: null,
      // token-prefix nesting: cash_withdrawal is a token prefix of cash_withdrawal_charge
      cash_withdrawal_charge: null,
    },
  },
} satisfies Record<string, Question>;

/** Varied filler questions to pad a request to the 64-question limit. */
function fillers(n: number): Record<string, Question> {
  const out: Record<string, Question> = {};
  const topics = ["a refund", "a card", "travel", "a shop", "a fee", "a loan", "a password", "an ATM", "a transfer", "the weather"];
  for (let i = 0; i < n; i++) {
    const topic = topics[i % topics.length]!;
    switch (i % 4) {
      case 0:
        out[`f${i}`] = { type: "noul", instructions: `The message mentions ${topic}.` };
        break;
      case 1:
        out[`f${i}`] = {
          type: "choice",
          instructions: `Is the message about ${topic}?`,
          criteria: { yes: null, no: null, unclear: "cannot tell" },
        };
        break;
      case 2:
        out[`f${i}`] = {
          type: "score",
          instructions: `How much does the message talk about ${topic}?`,
          criteria: ["not at all", "a little", "a lot"],
        };
        break;
      default:
        out[`f${i}`] = {
          type: "choice",
          instructions: `Which department should handle a message about ${topic}?`,
          criteria: { cards: null, loans: null, fraud_team: "suspected fraud", general_support: null },
        };
    }
  }
  return out;
}

/** Every probability of an answer, keyed so two answers can be compared. */
function probabilities(a: Answer): Record<string, number> {
  switch (a.type) {
    case "noul":
      return { noul: a.noul };
    case "choice":
    case "score":
      return a.probabilities;
  }
}

function expectSame(id: string, alone: Answer | undefined, together: Answer | undefined): void {
  expect(alone, id).toBeDefined();
  expect(together, id).toBeDefined();
  expect(together!.type, id).toBe(alone!.type);
  const a = probabilities(alone!);
  const b = probabilities(together!);
  expect(Object.keys(b), id).toEqual(Object.keys(a));
  for (const [k, p] of Object.entries(a)) {
    const diff = Math.abs(p - b[k]!);
    expect(diff, `${id}.${k}: alone ${p} vs together ${b[k]}`).toBeLessThanOrEqual(TOL);
  }
}

let engine: EnginePipeline;
beforeAll(async () => {
  // The default pass limit (8,192 tokens): 64 questions with every debias
  // presentation pack to more than that, so the request is read in several
  // passes over the same state, every presentation kept. Packing is the engine's, the same for every
  // build: the small one reads every name here (the 64-question request read on the 1.5B took over
  // 180 s on a 2-core machine without AVX-512).
  engine = await startEngine(smallDeployment());
});
afterAll(async () => {
  await engine?.close();
});

describe("answers do not depend on the other questions in the request", () => {
  it("each target asked alone matches the same target among 64 questions", async () => {
    const alone: Record<string, Answer> = {};
    for (const [id, q] of Object.entries(TARGETS)) {
      const res = await ask(engine, STATE, { [id]: q });
      alone[id] = res.answers[id]!;
    }

    // Targets spread through the request: first, middle, late and last.
    const pad = fillers(64 - Object.keys(TARGETS).length);
    const padIds = Object.keys(pad);
    const questions: Record<string, Question> = {};
    questions.fee = TARGETS.fee;
    padIds.slice(0, 20).forEach((k) => (questions[k] = pad[k]!));
    questions.intent = TARGETS.intent;
    padIds.slice(20, 40).forEach((k) => (questions[k] = pad[k]!));
    questions.kind = TARGETS.kind;
    padIds.slice(40).forEach((k) => (questions[k] = pad[k]!));
    questions.urgency = TARGETS.urgency;
    expect(Object.keys(questions)).toHaveLength(64);

    // Read in several passes (its shared-stem blocks come to about 6,800 packed tokens: the planner splits
    // them by width, and by the limit where they exceed it), and still answered as each question alone.
    const lb = engine.build("judge-latest");
    const prepared = prepare(lb, STATE, questions);
    expect(engine.engine.plan(lb, prepared.prefix.length, prepared.encoded, passLimit(lb, 8192)).length).toBeGreaterThan(1);
    const together = await ask(engine, STATE, questions);
    expect(Object.keys(together.answers)).toHaveLength(64);
    for (const id of Object.keys(TARGETS)) expectSame(id, alone[id], together.answers[id]);
    // A bound, not a timing assertion.
  }, 900_000);

  it("the same question next to two different other questions gets the same answer", async () => {
    const withX = await ask(engine, STATE, {
      intent: TARGETS.intent,
      x: { type: "noul", instructions: "The customer is happy with the bank." },
    });
    const withY = await ask(engine, STATE, {
      y: {
        type: "score",
        instructions: "How polite is the message?",
        criteria: ["rude", "neutral", "polite", "very polite"],
      },
      intent: TARGETS.intent,
    });
    expectSame("intent", withX.answers.intent, withY.answers.intent);
  });
});
