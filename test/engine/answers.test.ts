/**
 * Answers from the real exported model (never a stub): a handful of
 * clear-cut questions, batched so the whole file costs four forward passes.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { AssayError } from "../../src/errors/catalogue.js";
import { prepare } from "../../src/families/general.js";
import { questionKey } from "../../src/probability/index.js";
import type { EnginePipeline } from "../../src/pipeline/index.js";
import type { Answer, ChoiceAnswer, NoulAnswer, Question, ScoreAnswer, SystemOneResponse, State } from "../../src/validate/schema.js";
import { ask, startEngine } from "./engine.js";

let engine: EnginePipeline;

const MEETING = "The meeting was moved to Friday because the room was flooded.";
const MEETING_QS = {
  moved: { type: "noul", instructions: "The meeting was moved to Friday." },
  notMoved: { type: "noul", instructions: "The meeting was not moved." },
  monday: { type: "noul", instructions: "The meeting was moved to Monday." },
  nested: {
    type: "choice",
    instructions: "Pick one of the options.",
    criteria: { "1": "one", "12": "twelve", "123": "one hundred twenty-three" },
  },
  withCriteria: {
    type: "noul",
    instructions: "The room was flooded.",
    criteria: { true: "the text says the room was flooded", false: "the text does not say so" },
  },
} satisfies Record<string, Question>;

const CAR = "Anna parked her red car next to the bakery and walked home.";
const CAR_QS = {
  color: { type: "choice", instructions: "What color is Anna's car?", criteria: { red: null, blue: null, green: null } },
} satisfies Record<string, Question>;

const REVIEW =
  "Absolutely wonderful! Best purchase I have ever made. It works perfectly, arrived early, and the support team was amazing. Five stars, I love it!";
const REVIEW_LEVELS = ["very negative", "negative", "neutral", "positive", "very positive"];
const REVIEW_QS = {
  sentiment: { type: "score", instructions: "How positive is this review?", criteria: REVIEW_LEVELS },
  stars: { type: "score", instructions: "How many stars does the reviewer give?", criteria: ["1", "2", "3", "4", "5"] },
} satisfies Record<string, Question>;

const ORDER = { order: { id: 17, status: "shipped", carrier: "DHL", items: [{ sku: "A1", qty: 2 }] } };
const ORDER_QS = {
  status: { type: "choice", instructions: "What is the order status?", criteria: { pending: null, shipped: null, cancelled: null } },
  carrier: { type: "choice", instructions: "Which carrier ships the order?", criteria: { UPS: null, DHL: null, FedEx: null } },
  shipped: { type: "noul", instructions: "The order has been shipped." },
} satisfies Record<string, Question>;

let meeting: SystemOneResponse;
let car: SystemOneResponse;
let review: SystemOneResponse;
let order: SystemOneResponse;

beforeAll(async () => {
  engine = await startEngine();
  // One forward pass per state; run one after another (one lane, 2 cores).
  meeting = await ask(engine, MEETING, MEETING_QS, "judge-v4");
  car = await ask(engine, CAR, CAR_QS, "vendor/judge-9B");
  review = await ask(engine, REVIEW, REVIEW_QS);
  order = await ask(engine, ORDER, ORDER_QS, "judge-v3");
});

afterAll(async () => {
  await engine?.close();
});

const noul = (a: Answer | undefined): NoulAnswer => {
  expect(a?.type).toBe("noul");
  return a as NoulAnswer;
};
const choice = (a: Answer | undefined): ChoiceAnswer => {
  expect(a?.type).toBe("choice");
  return a as ChoiceAnswer;
};
const score = (a: Answer | undefined): ScoreAnswer => {
  expect(a?.type).toBe("score");
  return a as ScoreAnswer;
};
const sum = (o: Record<string, number>) => Object.values(o).reduce((a, b) => a + b, 0);

/** Shape checks the spec asks of every answer. */
function checkResponse(res: SystemOneResponse, questions: Record<string, Question>): void {
  expect(Object.keys(res.answers).sort()).toEqual(Object.keys(questions).sort());
  for (const [id, q] of Object.entries(questions)) {
    const a = res.answers[id]!;
    expect(a.type, id).toBe(q.type);
    switch (q.type) {
      case "noul": {
        const n = noul(a);
        expect(n.noul).toBeGreaterThanOrEqual(0);
        expect(n.noul).toBeLessThanOrEqual(1);
        break;
      }
      case "choice": {
        const c = choice(a);
        const keys = Object.keys(q.criteria);
        expect(Object.keys(c.probabilities).sort()).toEqual([...keys].sort());
        expect(Math.abs(sum(c.probabilities) - 1), id).toBeLessThan(1e-9);
        for (const p of Object.values(c.probabilities)) {
          expect(p).toBeGreaterThanOrEqual(0);
          expect(p).toBeLessThanOrEqual(1);
        }
        expect(keys).toContain(c.choice);
        expect(c.probabilities[c.choice]).toBe(Math.max(...Object.values(c.probabilities)));
        expect(c.confidence).toBeGreaterThanOrEqual(0);
        expect(c.confidence).toBeLessThanOrEqual(1);
        break;
      }
      case "score": {
        const s = score(a);
        const levels = q.criteria.map((_, i) => String(i));
        expect(Object.keys(s.probabilities).sort()).toEqual([...levels].sort());
        expect(Math.abs(sum(s.probabilities) - 1), id).toBeLessThan(1e-9);
        expect(s.legend).toEqual(Object.fromEntries(q.criteria.map((text, i) => [String(i), text])));
        const expected = q.criteria.reduce((acc, _, i) => acc + i * s.probabilities[String(i)]!, 0);
        expect(s.score).toBeCloseTo(expected, 9);
        expect(s.score).toBeGreaterThanOrEqual(0);
        expect(s.score).toBeLessThanOrEqual(q.criteria.length - 1);
        expect(s.confidence).toBeGreaterThanOrEqual(0);
        expect(s.confidence).toBeLessThanOrEqual(1);
        break;
      }
    }
  }
}

describe("clear-cut questions are answered the right way round", () => {
  it("noul: the negation and a contradiction of a stated fact are less likely than the fact", () => {
    const moved = noul(meeting.answers.moved).noul;
    expect(noul(meeting.answers.notMoved).noul).toBeLessThan(moved);
    expect(noul(meeting.answers.monday).noul).toBeLessThan(moved);
    expect(noul(meeting.answers.notMoved).noul).toBeLessThan(0.5);
    expect(noul(meeting.answers.monday).noul).toBeLessThan(0.5);
  });

  // Regression: the noul answer once read only lowercase "yes"/"no", while the
  // instruct model puts most of its mass on "Yes"/"No"; this fact then scored 0.49.
  it("noul: a fact stated verbatim in the state is more likely true than not (> 0.5)", () => {
    expect(noul(meeting.answers.moved).noul).toBeGreaterThan(0.5);
  });

  it("choice: a plainly stated color wins", () => {
    const c = choice(car.answers.color);
    expect(c.choice).toBe("red");
    expect(c.probabilities.red).toBeGreaterThan(c.probabilities.blue!);
    expect(c.probabilities.red).toBeGreaterThan(c.probabilities.green!);
  });

  it("choice on a JSON state: the value in the JSON wins", () => {
    expect(choice(order.answers.status).choice).toBe("shipped");
    expect(choice(order.answers.carrier).choice).toBe("DHL");
  });

  it("score: an obviously very positive review lands in the upper half", () => {
    const s = score(review.answers.sentiment);
    expect(s.score).toBeGreaterThan((REVIEW_LEVELS.length - 1) / 2);
    const stars = score(review.answers.stars);
    expect(stars.score).toBeGreaterThan(2);
  });
});

describe("a map of a question's own (assay calibrate --per-question)", () => {
  it("answers that question through it, and the question asked beside it through the build's maps", async () => {
    const lb = engine.build("vendor/judge-9B");
    const own = { type: "noul", instructions: "Anna's car is red." } as const;
    const beside = { type: "noul", instructions: "Anna walked home." } as const;
    const before = await ask(engine, CAR, { own, beside }, "vendor/judge-9B");
    const shipped = lb.build.manifest.calibration;
    // A map that states one probability whatever it reads: the answer can only come from it.
    lb.build.manifest.calibration = { ...shipped!, questions: { [questionKey(own)]: { type: "noul", map: { bias: -3, weights: {} } } } };
    let after: SystemOneResponse;
    try {
      after = await ask(engine, CAR, { own, beside }, "vendor/judge-9B");
    } finally {
      lb.build.manifest.calibration = shipped;
    }
    expect((after.answers.own as NoulAnswer).noul).toBeCloseTo(1 / (1 + Math.exp(3)), 9);
    expect(Math.abs((before.answers.own as NoulAnswer).noul - (after.answers.own as NoulAnswer).noul)).toBeGreaterThan(1e-6);
    expect((after.answers.beside as NoulAnswer).noul).toBe((before.answers.beside as NoulAnswer).noul);
    expect(after.usage).toEqual(before.usage);
  });
});

describe("many options: shortlist, then choose (ASSAY_SHORTLIST, default 8)", () => {
  const INTENTS: Record<string, string | null> = {
    card_arrival: null,
    card_declined: "the card was refused when paying",
    change_pin: null,
    exchange_rate: null,
    lost_or_stolen_card: null,
    pending_transfer: null,
    refund_not_showing_up: null,
    top_up_failed: null,
    transfer_fee_charged: null,
    wrong_amount_of_cash_received: null,
    cash_withdrawal_charge: null,
    activate_my_card: null,
  };
  const STATE = "I tried to pay for groceries this morning and the shop's machine refused my card twice. Why?";

  it("a 12-option question is read again over its 8 likeliest: the plain intent wins, the distribution sums to 1, and the caller's option order does not matter", async () => {
    const q = (criteria: Record<string, string | null>) => ({ intent: { type: "choice", instructions: "What is the customer's intent?", criteria } }) satisfies Record<string, Question>;
    const reversed = Object.fromEntries(Object.entries(INTENTS).reverse());
    const a = choice((await ask(engine, STATE, q(INTENTS))).answers.intent);
    const b = choice((await ask(engine, STATE, q(reversed))).answers.intent);
    expect(a.choice).toBe("card_declined");
    expect(Object.keys(a.probabilities).sort()).toEqual(Object.keys(INTENTS).sort());
    expect(Object.values(a.probabilities).reduce((x, y) => x + y, 0)).toBeCloseTo(1, 6);
    for (const k of Object.keys(INTENTS)) expect(b.probabilities[k]).toBeCloseTo(a.probabilities[k]!, 6);
  });
});

describe("response shape", () => {
  it("every answer has its question's type; choice/score distributions cover every key and sum to 1", () => {
    checkResponse(meeting, MEETING_QS);
    checkResponse(car, CAR_QS);
    checkResponse(review, REVIEW_QS);
    checkResponse(order, ORDER_QS);
  });

  it("score legend maps level numbers to the level texts", () => {
    expect(score(review.answers.sentiment).legend).toEqual({
      "0": "very negative",
      "1": "negative",
      "2": "neutral",
      "3": "positive",
      "4": "very positive",
    });
    expect(score(review.answers.stars).legend).toEqual({ "0": "1", "1": "2", "2": "3", "3": "4", "4": "5" });
  });

  it("labels that need several tokens and nest (1, 12, 123) give a valid distribution", () => {
    const c = choice(meeting.answers.nested);
    expect(Object.keys(c.probabilities).sort()).toEqual(["1", "12", "123"]);
    expect(Math.abs(sum(c.probabilities) - 1)).toBeLessThan(1e-9);
    for (const p of Object.values(c.probabilities)) {
      expect(p).toBeGreaterThan(0);
      expect(p).toBeLessThan(1);
    }
  });

  it("a JSON object state works", () => {
    checkResponse(order, ORDER_QS);
    expect(noul(order.answers.shipped).noul).toBeGreaterThan(0);
  });

  it("echoes the model name sent, not the one it resolves to", () => {
    expect(meeting.model).toBe("judge-v4");
    expect(car.model).toBe("vendor/judge-9B");
    expect(review.model).toBe("judge-latest");
    expect(order.model).toBe("judge-v3");
  });

  it("usage: input tokens > 0 (prefix + question suffixes), output tokens 0", () => {
    for (const [res, state, qs] of [
      [meeting, MEETING, MEETING_QS],
      [car, CAR, CAR_QS],
      [review, REVIEW, REVIEW_QS],
      [order, ORDER, ORDER_QS],
    ] as [SystemOneResponse, State, Record<string, Question>][]) {
      expect(Number.isInteger(res.usage.input_tokens)).toBe(true);
      expect(res.usage.input_tokens).toBeGreaterThan(0);
      expect(res.usage.output_tokens).toBe(0);
      const packed = prepare(engine.build(res.model), state, qs).packed;
      expect(res.usage.input_tokens).toBe(packed.promptTokens);
    }
    // More questions about the same state cost more input tokens.
    expect(meeting.usage.input_tokens).toBeGreaterThan(prepare(engine.build("judge-v4"), MEETING, { m: MEETING_QS.moved }).packed.promptTokens);
  });
});

describe("invalid requests", () => {
  it("an unknown model is a 422 AssayError", async () => {
    const err = await ask(engine, MEETING, { q: MEETING_QS.moved }, "judge-v9000").catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AssayError);
    expect((err as AssayError).status).toBe(422);
    expect((err as AssayError).code).toBe("INVALID_REQUEST");
    expect((err as AssayError).message).toContain("judge-v9000");
  });

  it("65 questions are a 422 AssayError; 64 are within the limit (checked by the invariance test)", async () => {
    const qs: Record<string, Question> = {};
    for (let i = 0; i < 65; i++) qs[`q${i}`] = { type: "noul", instructions: `Statement ${i}.` };
    const err = await ask(engine, MEETING, qs).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AssayError);
    expect((err as AssayError).status).toBe(422);
  });

  it("a state that with one question exceeds the model's context is a 422 naming its tokens, before any model work", async () => {
    // Longer than a pass (8,192) is read in chunks (test/engine/prefix-cache.test.ts); longer than the context is refused.
    const long = Array.from({ length: 33_000 }, (_, i) => ["the", "meeting", "moved"][i % 3]).join(" ");
    const err = await ask(engine, long, { q: MEETING_QS.moved }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AssayError);
    expect((err as AssayError).status).toBe(422);
    expect((err as AssayError).message).toMatch(/the state takes \d+ tokens .* over the model's context of 32768 tokens/);
  });

  it("an empty questions map is a 422 AssayError", async () => {
    const err = await ask(engine, MEETING, {}).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AssayError);
    expect((err as AssayError).status).toBe(422);
  });

  it("a choice with one option is a 422 AssayError", async () => {
    const err = await ask(engine, MEETING, { c: { type: "choice", criteria: { only: null } } }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AssayError);
    expect((err as AssayError).status).toBe(422);
  });

  it("an empty option key is a 422 naming the key and its rule", async () => {
    const err = await ask(engine, MEETING, { c: { type: "choice", criteria: { "": null, b: null } } }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AssayError);
    expect((err as AssayError).status).toBe(422);
    expect((err as AssayError).message).toBe('questions.c.criteria: key "": option keys must be non-empty');
  });
});
