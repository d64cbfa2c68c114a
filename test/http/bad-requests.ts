/**
 * Bad request bodies and the 422 `detail` fragment each must produce. Shared
 * so the engine's own tests can run the same table against the real
 * pipeline (the envelope rows are checked by the HTTP layer; the question
 * rows by the pipeline's per-family validation).
 */
export interface BadRequestCase {
  name: string;
  body: unknown;
  /** Substring the `detail` must contain. */
  detail: string | RegExp;
}

const state = "Some text.";
const options = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`o${i}`, null]));
const levels = (n: number) => Array.from({ length: n }, (_, i) => `level ${i}`);

export const ENVELOPE_CASES: BadRequestCase[] = [
  { name: "missing state", body: { questions: { q: { type: "noul" } } }, detail: "state" },
  { name: "state is a number", body: { state: 42, questions: { q: { type: "noul" } } }, detail: "state" },
  { name: "state is null", body: { state: null, questions: { q: { type: "noul" } } }, detail: "state" },
  { name: "questions missing", body: { state }, detail: "questions" },
  { name: "questions is an array", body: { state, questions: [{ type: "noul" }] }, detail: "questions" },
  { name: "model is empty", body: { model: "", state, questions: { q: { type: "noul" } } }, detail: "model" },
  { name: "body is an array", body: [1, 2], detail: "expected object, received array" },
  { name: "body is a string", body: "hello", detail: "expected object, received string" },
  { name: "body is null", body: null, detail: "expected object, received null" },
];

export const QUESTION_CASES: BadRequestCase[] = [
  { name: "unknown question type", body: { state, questions: { q1: { type: "maybe" } } }, detail: /\bq1\.type\b/ },
  { name: "question without type", body: { state, questions: { q1: { instructions: "x" } } }, detail: /\bq1\.type\b/ },
  {
    name: "choice with 1 option",
    body: { state, questions: { q1: { type: "choice", criteria: options(1) } } },
    detail: "2 to 255 options",
  },
  {
    name: "choice with 256 options",
    body: { state, questions: { q1: { type: "choice", criteria: options(256) } } },
    detail: "2 to 255 options",
  },
  {
    name: "score with 1 level",
    body: { state, questions: { q1: { type: "score", criteria: levels(1) } } },
    detail: "2 to 255 levels",
  },
  {
    name: "score with 256 levels",
    body: { state, questions: { q1: { type: "score", criteria: levels(256) } } },
    detail: "2 to 255 levels",
  },
  {
    name: "score criteria is an object",
    body: { state, questions: { q1: { type: "score", criteria: { low: "a", high: "b" } } } },
    detail: /\bq1\.criteria\b/,
  },
  {
    name: "choice criteria is an array",
    body: { state, questions: { q1: { type: "choice", criteria: ["a", "b"] } } },
    detail: /\bq1\.criteria\b/,
  },
  {
    name: "choice with an empty option key",
    body: { state, questions: { q1: { type: "choice", criteria: { "": null, b: null } } } },
    detail: 'q1.criteria: key "": option keys must be non-empty',
  },
  {
    name: "noul criteria is a string",
    body: { state, questions: { q1: { type: "noul", criteria: "yes" } } },
    detail: /\bq1\.criteria\b/,
  },
  {
    name: "choice without criteria",
    body: { state, questions: { q1: { type: "choice" } } },
    detail: /\bq1\.criteria\b/,
  },
  { name: "no questions", body: { state, questions: {} }, detail: "1 to 64 questions" },
  {
    name: "65 questions",
    body: { state, questions: Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`q${i}`, { type: "noul" }])) },
    detail: "1 to 64 questions",
  },
];
