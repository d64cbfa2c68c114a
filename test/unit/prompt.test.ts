import { describe, expect, it } from "vitest";
import {
  buildPrefix,
  buildPrompt,
  buildQuestion,
  preamble,
  prefixHead,
  renderState,
  styleFromTemplate,
  SYSTEM,
  type PromptStyle,
} from "../../src/prompt/index.js";
import { DEMONSTRATIONS } from "../../src/prompt/demonstrations.js";
import type { Question } from "../../src/validate/schema.js";

/** Pure prompt layer: no tokenizer, no model. */

const CHATML: PromptStyle = { kind: "chatml", end: "<|im_end|>" };
const COMPLETION: PromptStyle = { kind: "completion" };
const STYLES = [
  ["chatml", CHATML],
  ["completion", COMPLETION],
] as const;

/** Where the model's answer starts, per style. */
const ANSWER_START = {
  chatml: "<|im_end|>\n<|im_start|>assistant\n",
  completion: "\nAnswer:",
} as const;

const count = (text: string, needle: string) => text.split(needle).length - 1;

describe("styleFromTemplate", () => {
  it("picks ChatML when the template writes <|im_start|>", () => {
    expect(styleFromTemplate("{{- '<|im_start|>' + message.role + '\\n' }}")).toEqual(CHATML);
  });

  it("falls back to plain completion without a chat template", () => {
    expect(styleFromTemplate(null)).toEqual(COMPLETION);
    expect(styleFromTemplate("")).toEqual(COMPLETION);
    expect(styleFromTemplate("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")).toEqual(COMPLETION);
  });
});

describe("state rendering", () => {
  it("keeps a text state as it is", () => {
    expect(renderState("The meeting was moved.\nSecond line.")).toBe("The meeting was moved.\nSecond line.");
  });

  it("renders a JSON object state as JSON text", () => {
    const state = { order: { id: 17, status: "shipped", items: [{ sku: "A1", qty: 2 }] }, note: null };
    const text = renderState(state);
    expect(text).toBe('{"order":{"id":17,"status":"shipped","items":[{"sku":"A1","qty":2}]},"note":null}');
    expect(JSON.parse(text)).toEqual(state);
  });

  it("renders a JSON array state as JSON text", () => {
    expect(renderState([1, "two", { three: 3 }])).toBe('[1,"two",{"three":3}]');
  });

  it("a JSON string-looking text state is not re-encoded", () => {
    // A string state is text, even when it happens to be JSON: no extra quotes.
    expect(renderState('{"a":1}')).toBe('{"a":1}');
  });

  it.each(STYLES)("%s prefix carries the rendered state", (_name, style) => {
    const state = { user: "ana", tags: ["x", "y"] };
    const prefix = buildPrefix(style, state);
    expect(prefix).toContain(JSON.stringify(state));
    expect(prefix).not.toContain("[object Object]");
    expect(buildPrefix(style, "plain text state")).toContain("plain text state");
  });
});

describe("prefix", () => {
  it("chatml: a system turn, then an open user turn holding the state", () => {
    const prefix = buildPrefix(CHATML, "S");
    expect(prefix.startsWith("<|im_start|>system\n")).toBe(true);
    expect(prefix).toContain("<|im_end|>\n<|im_start|>user\n");
    // The user turn stays open: the question suffix closes it.
    expect(count(prefix, "<|im_start|>")).toBe(2);
    expect(count(prefix, "<|im_end|>")).toBe(1);
    expect(prefix.indexOf("S", prefix.indexOf("<|im_start|>user\n"))).toBeGreaterThan(0);
  });

  it("completion: plain text without chat tokens", () => {
    const prefix = buildPrefix(COMPLETION, "S");
    expect(prefix).not.toContain("<|im_start|>");
    expect(prefix).not.toContain("<|im_end|>");
    expect(prefix).toContain("State:\nS");
  });

  it("with the worked examples: finished exchanges after the system turn, each answered with one of its labels, then the state", () => {
    const style = { ...CHATML, demonstrations: true };
    const prefix = buildPrefix(style, "S");
    expect(prefix.startsWith(preamble(style))).toBe(true);
    expect(prefix).toBe(`${prefixHead(style)}S\n\n`);
    expect(preamble(style).startsWith(preamble(CHATML))).toBe(true);
    // Each example is a user turn and an answered assistant turn; the state's user turn stays open.
    expect(count(prefix, "<|im_start|>assistant\n")).toBe(DEMONSTRATIONS.length);
    expect(count(prefix, "<|im_start|>user\n")).toBe(DEMONSTRATIONS.length + 1);
    const answers = [...prefix.matchAll(/<\|im_start\|>assistant\n([^<]*)<\|im_end\|>/g)].map((m) => m[1]);
    expect(answers).toEqual(["yes", "no", "no", "2", "terrible"]);
    // Completion style: the same exchanges as plain text, answers after "Answer:".
    const plain = buildPrefix({ ...COMPLETION, demonstrations: true }, "S");
    expect(plain).not.toContain("<|im_start|>");
    expect(count(plain, "\nAnswer: ")).toBe(DEMONSTRATIONS.length);
  });

  it("without the worked examples the prefix is the system turn and the state, as before they existed", () => {
    expect(buildPrefix(CHATML, "S")).toBe(`<|im_start|>system\n${SYSTEM}<|im_end|>\n<|im_start|>user\nState:\nS\n\n`);
    expect(buildPrefix(COMPLETION, "S")).toBe(`${SYSTEM}\n\nState:\nS\n\n`);
  });

  it("does not depend on the questions (so questions are independent of each other)", () => {
    const a = buildPrompt(CHATML, "S", { q: { type: "noul", instructions: "x" } });
    const b = buildPrompt(CHATML, "S", {
      r: { type: "score", criteria: ["lo", "hi"] },
      s: { type: "choice", criteria: { a: null, b: null } },
    });
    expect(a.prefix).toBe(b.prefix);
    expect(a.prefix).toBe(buildPrefix(CHATML, "S"));
  });
});

describe("noul questions", () => {
  const q: Question = {
    type: "noul",
    instructions: "  The meeting was moved to Friday.  ",
    criteria: { true: "the text says so explicitly", false: "the text does not say so" },
  };

  it.each(STYLES)("%s: suffix holds the statement and both criteria", (name, style) => {
    const p = buildQuestion(style, "q1", q);
    expect(p.id).toBe("q1");
    expect(p.type).toBe("noul");
    expect(p.suffix).toContain("The meeting was moved to Friday.");
    expect(p.suffix).toContain("the text says so explicitly");
    expect(p.suffix).toContain("the text does not say so");
    expect(p.suffix.endsWith(ANSWER_START[name])).toBe(true);
  });

  it("chatml labels are the bare words; completion labels carry a leading space", () => {
    expect(buildQuestion(CHATML, "q", q).labels).toEqual(["yes", "Yes", "no", "No"]);
    expect(buildQuestion(COMPLETION, "q", q).labels).toEqual([" yes", " Yes", " no", " No"]);
  });

  it("both casings of yes count for true and both of no for false", () => {
    expect(buildQuestion(CHATML, "q", q).option).toEqual([0, 0, 1, 1]);
  });

  it("keys are true/false with yes first (the answer reads label 0 as true)", () => {
    expect(buildQuestion(CHATML, "q", q).keys).toEqual(["true", "false"]);
    expect(buildQuestion(COMPLETION, "q", q).keys).toEqual(["true", "false"]);
  });

  it("the suffix names the allowed labels", () => {
    const s = buildQuestion(CHATML, "q", q).suffix;
    expect(s).toMatch(/yes/);
    expect(s).toMatch(/no/);
  });

  it("only the criteria given are written", () => {
    const onlyTrue = buildQuestion(CHATML, "q", { type: "noul", instructions: "X", criteria: { true: "TRUE-MEANING" } });
    expect(onlyTrue.suffix).toContain("TRUE-MEANING");
    expect(onlyTrue.suffix).not.toContain('"no" means');
    const none = buildQuestion(CHATML, "q", { type: "noul", instructions: "X" });
    expect(none.suffix).not.toContain("means:");
  });

  it("questions and statements alike are asked as a question about the state", () => {
    const asked = buildQuestion(CHATML, "q", { type: "noul", instructions: "Is the customer asking for a refund? " }).suffix;
    expect(asked).toMatch(/^Based on the state above, answer the question\.\nQuestion: Is the customer asking for a refund\?\nAnswer yes or no\./);
    const stated = buildQuestion(CHATML, "q", { type: "noul", instructions: "The customer asks for a refund." }).suffix;
    expect(stated).toMatch(/^Based on the state above, answer the question\.\nQuestion: The customer asks for a refund\.\nAnswer yes or no\./);
  });

  it("a missing or blank statement gets a default statement", () => {
    for (const instructions of [undefined, "", "   "]) {
      const q2: Question = instructions === undefined ? { type: "noul" } : { type: "noul", instructions };
      const p = buildQuestion(CHATML, "q", q2);
      expect(p.suffix).toMatch(/Question: \S/);
    }
  });
});

describe("choice questions", () => {
  const q: Question = {
    type: "choice",
    instructions: "What color is the car?",
    criteria: { red: "The car is red", blue: null, green: "The car is green" },
  };

  it.each(STYLES)("%s: suffix holds the question and every option, numbered", (name, style) => {
    const p = buildQuestion(style, "c", q);
    expect(p.type).toBe("choice");
    expect(p.suffix).toContain("What color is the car?");
    expect(p.suffix).toContain("1. red: The car is red");
    expect(p.suffix).toContain("3. green: The car is green");
    expect(p.suffix.endsWith(ANSWER_START[name])).toBe(true);
  });

  it("a null description shows the key alone", () => {
    const p = buildQuestion(CHATML, "c", q);
    expect(p.suffix).toMatch(/^2\. blue$/m);
    expect(p.suffix).not.toContain("null");
  });

  it("options are listed in the order given", () => {
    const s = buildQuestion(CHATML, "c", q).suffix;
    expect(s.indexOf("1. red")).toBeLessThan(s.indexOf("2. blue"));
    expect(s.indexOf("2. blue")).toBeLessThan(s.indexOf("3. green"));
    const shifted = buildQuestion(CHATML, "c", q, [2, 0, 1]).suffix;
    expect(shifted).toMatch(/1\. green: The car is green\n2\. red: The car is red\n3\. blue\n/);
  });

  it("keys are the option keys; labels are the numbers shown, each mapped to the option it numbers (with a space in completion style)", () => {
    const chat = buildQuestion(CHATML, "c", q);
    expect(chat.keys).toEqual(["red", "blue", "green"]);
    expect(chat.labels).toEqual(["1", "2", "3"]);
    expect(chat.option).toEqual([0, 1, 2]);
    const comp = buildQuestion(COMPLETION, "c", q, [1, 2, 0]);
    expect(comp.keys).toEqual(["red", "blue", "green"]);
    expect(comp.labels).toEqual([" 1", " 2", " 3"]);
    expect(comp.option).toEqual([1, 2, 0]);
  });

  it("more than 8 options: listed once and read by key (multi-token and nested keys kept whole)", () => {
    const criteria: Record<string, string | null> = Object.fromEntries(Array.from({ length: 9 }, (_, i) => [`intent_${i}`, null]));
    criteria["1"] = null;
    criteria["12"] = null;
    criteria["card_payment_fee_charged"] = "fee";
    const p = buildQuestion(CHATML, "c", { type: "choice", criteria });
    expect(p.labels).toEqual(Object.keys(criteria));
    expect(p.option).toEqual(Object.keys(criteria).map((_, i) => i));
    expect(p.suffix).toMatch(/^- card_payment_fee_charged: fee$/m);
    expect(p.suffix).toMatch(/option key only/);
  });

  it("tells the model to answer with the number", () => {
    expect(buildQuestion(CHATML, "c", q).suffix).toMatch(/option number only/);
  });
});

describe("score questions", () => {
  const levels = ["very negative", "negative", "neutral", "positive", "very positive"];
  const q: Question = { type: "score", instructions: "How positive is the review?", criteria: levels };
  // Rubric-style levels (longer than 40 characters) are answered by number.
  const rubric = [
    "The answer ignores the question entirely and is off topic.",
    "The answer addresses the question but with major factual errors.",
    "The answer is correct, complete and clearly written throughout.",
  ];
  const qr: Question = { type: "score", instructions: "Grade the answer.", criteria: rubric };

  it.each(STYLES)("%s: short level names are listed lowest to highest and read as the answer", (name, style) => {
    const p = buildQuestion(style, "s", q);
    expect(p.type).toBe("score");
    expect(p.suffix).toContain("How positive is the review?");
    expect(p.suffix).toMatch(/lowest to highest/);
    levels.forEach((text) => expect(p.suffix).toMatch(new RegExp(`^- ${text}$`, "m")));
    const idx = levels.map((t) => p.suffix.indexOf(`\n- ${t}\n`));
    for (let i = 1; i < idx.length; i++) expect(idx[i]!).toBeGreaterThan(idx[i - 1]!);
    expect(p.suffix).toMatch(/level name only/);
    expect(p.suffix.endsWith(ANSWER_START[name])).toBe(true);
  });

  it("short names: keys are level numbers, labels are the names", () => {
    const chat = buildQuestion(CHATML, "s", q);
    expect(chat.keys).toEqual(["0", "1", "2", "3", "4"]);
    expect(chat.labels).toEqual(levels);
    expect(chat.option).toEqual([0, 1, 2, 3, 4]);
    expect(buildQuestion(COMPLETION, "s", q).labels).toEqual(levels.map((l) => ` ${l}`));
  });

  it.each(STYLES)("%s: long levels are numbered from 0, lowest to highest, and read as numbers", (name, style) => {
    const p = buildQuestion(style, "s", qr);
    rubric.forEach((text, i) => expect(p.suffix).toContain(`\n${i}: ${text}`));
    expect(p.suffix).toMatch(/level number only/);
    expect(p.keys).toEqual(["0", "1", "2"]);
    expect(p.labels).toEqual(style === CHATML ? ["0", "1", "2"] : [" 0", " 1", " 2"]);
    expect(p.suffix.endsWith(ANSWER_START[name])).toBe(true);
  });

  it("duplicate level names fall back to numbers", () => {
    const p = buildQuestion(CHATML, "s", { type: "score", criteria: ["ok", "ok", "good"] });
    expect(p.labels).toEqual(["0", "1", "2"]);
  });

  it("more than ten numbered levels get two-digit numbers", () => {
    const many = Array.from({ length: 12 }, (_, i) => `Level ${i}: ${"a fairly long description of this level"}`);
    const p = buildQuestion(CHATML, "s", { type: "score", criteria: many });
    expect(p.keys.at(-1)).toBe("11");
    expect(p.labels.at(-1)).toBe("11");
    expect(p.suffix).toMatch(/^11: Level 11/m);
  });
});

describe("buildPrompt", () => {
  it.each(STYLES)("%s: one suffix per question, in order, with the caller's ids", (name, style) => {
    const questions: Record<string, Question> = {
      zeta: { type: "noul", instructions: "A" },
      alpha: { type: "choice", criteria: { x: null, y: null } },
      mid: { type: "score", criteria: ["lo", "hi"] },
    };
    const p = buildPrompt(style, { k: 1 }, questions);
    expect(p.questions.map((q) => q.id)).toEqual(["zeta", "alpha", "mid"]);
    expect(p.questions.map((q) => q.type)).toEqual(["noul", "choice", "score"]);
    for (const q of p.questions) expect(q.suffix.endsWith(ANSWER_START[name])).toBe(true);
  });

  it("chatml: prefix + suffix is one well-formed conversation ending at the assistant turn", () => {
    const p = buildPrompt(CHATML, "The car is red.", { c: { type: "choice", criteria: { red: null, blue: null } } });
    const text = p.prefix + p.questions[0]!.suffix;
    expect(count(text, "<|im_start|>")).toBe(3);
    expect(count(text, "<|im_end|>")).toBe(2);
    expect(text).toMatch(/^<\|im_start\|>system\n[^]*<\|im_end\|>\n<\|im_start\|>user\n[^]*<\|im_end\|>\n<\|im_start\|>assistant\n$/);
    // The state comes before the question inside the user turn.
    expect(text.indexOf("The car is red.")).toBeLessThan(text.indexOf("1. red"));
  });

  it("completion: prefix + suffix ends at 'Answer:' (labels start with a space)", () => {
    const p = buildPrompt(COMPLETION, "S", { n: { type: "noul", instructions: "X" } });
    const text = p.prefix + p.questions[0]!.suffix;
    expect(text.endsWith("Answer:")).toBe(true);
    expect(text + p.questions[0]!.labels[0]).toMatch(/Answer: yes$/);
  });

  it("a question's suffix does not depend on its neighbours", () => {
    const q: Question = { type: "noul", instructions: "X" };
    const alone = buildPrompt(CHATML, "S", { q }).questions[0]!;
    const together = buildPrompt(CHATML, "S", { a: { type: "score", criteria: ["a", "b"] }, q }).questions[1]!;
    expect(together).toEqual(alone);
  });
});
