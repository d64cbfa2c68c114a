/**
 * The contract's shapes, each written once as a zod schema: the TypeScript
 * type of the same name is its `z.infer`, the scoring routes validate the
 * request envelope with it (src/http/routes.ts), and the OpenAPI document is
 * generated from these objects (src/http/openapi.ts).
 */
import { z } from "zod";
import type { ValidationIssue } from "../errors/catalogue.js";

/** Spec limits, in one place. */
export const LIMITS = {
  generalQuestions: { min: 1, max: 64 },
  codeSearchQuestions: { min: 1, max: 128 },
  options: { min: 2, max: 255 },
  levels: { min: 2, max: 255 },
  bodyBytes: 1024 * 1024, // 1 MiB
  codeSearchStateChars: 2_000_000,
  /**
   * Nesting levels of a JSON state. A 1 MiB body can nest arrays ~500,000
   * deep; rendering such a state (JSON.stringify, recursive) overflows the
   * stack, so the depth is refused up front (422) instead of failing (500).
   */
  stateDepth: 512,
} as const;

/**
 * Text a caller may send structured, as the official SDKs allow for instructions, noul criteria,
 * option descriptions and score levels: a string, or an object or array that the model reads as
 * JSON text, the way a JSON state is (`JSON.stringify`, as `renderState`). Parsing yields the text,
 * so everything after validation (prompts, option debiasing, the prefix cache, the score legend)
 * sees strings only.
 */
const StructuredText = z
  .union([z.string(), z.record(z.string(), z.unknown()), z.array(z.unknown())], {
    error: "expected a string, an object or an array",
  })
  .refine((v) => typeof v === "string" || !nestedDeeperThan(v, LIMITS.stateDepth), {
    message: `structured text may nest objects and arrays at most ${LIMITS.stateDepth} levels deep`,
  })
  .transform((v) => (typeof v === "string" ? v : JSON.stringify(v)));

/** `null` reads as absent: clients serialise an unset optional field as null. */
const optionalText = StructuredText.nullable()
  .transform((v) => v ?? undefined)
  .optional();
const instructions = optionalText;

export const NoulQuestion = z.strictObject({
  type: z.literal("noul"),
  instructions,
  // Absent, null, one- or two-sided; a side that is null is absent.
  criteria: z
    .strictObject({ true: optionalText, false: optionalText })
    .nullable()
    .transform((c) => c ?? undefined)
    .optional(),
});

export const ChoiceQuestion = z.strictObject({
  type: z.literal("choice"),
  instructions,
  criteria: z
    .record(z.string().min(1, "option keys must be non-empty"), StructuredText.nullable())
    .refine((c) => Object.keys(c).length >= LIMITS.options.min && Object.keys(c).length <= LIMITS.options.max, {
      message: `a choice question needs ${LIMITS.options.min} to ${LIMITS.options.max} options`,
    }),
});

export const ScoreQuestion = z.strictObject({
  type: z.literal("score"),
  instructions,
  criteria: z
    .array(StructuredText)
    .min(LIMITS.levels.min, `a score question needs ${LIMITS.levels.min} to ${LIMITS.levels.max} levels`)
    .max(LIMITS.levels.max, `a score question needs ${LIMITS.levels.min} to ${LIMITS.levels.max} levels`),
});

/** Code search accepts `boolean` and answers it exactly like `noul`. */
export const BooleanQuestion = NoulQuestion.extend({ type: z.literal("boolean") });

export const Question = z.discriminatedUnion("type", [NoulQuestion, ChoiceQuestion, ScoreQuestion]);
/** Parsed questions: every text field is a string (structured text became its JSON text). */
export type Question = z.output<typeof Question>;
export type NoulQuestion = z.output<typeof NoulQuestion>;
export type ChoiceQuestion = z.output<typeof ChoiceQuestion>;
export type ScoreQuestion = z.output<typeof ScoreQuestion>;

/** Whether a parsed JSON value nests objects/arrays more than `max` levels deep. Iterative: no recursion on caller data. */
export function nestedDeeperThan(value: unknown, max: number): boolean {
  const stack: [unknown, number][] = [[value, 1]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!;
    if (depth > max) return true;
    for (const child of Array.isArray(v) ? v : Object.values(v as object)) {
      if (child !== null && typeof child === "object") stack.push([child, depth + 1]);
    }
  }
  return false;
}

export const State = z
  .union([z.string(), z.record(z.string(), z.unknown()), z.array(z.unknown())], {
    // Worded as zod words an absent field, so that `zodIssues` types it `missing`.
    error: (iss) =>
      iss.input === undefined
        ? "state must be a string, an object or an array, received undefined"
        : "state must be a string, an object or an array",
  })
  .refine((s) => typeof s === "string" || !nestedDeeperThan(s, LIMITS.stateDepth), {
    message: `a JSON state may nest objects and arrays at most ${LIMITS.stateDepth} levels deep`,
  });
export type State = z.infer<typeof State>;

/**
 * The envelope only: `questions` is checked per family once the model is
 * known, because the count limit and the allowed types depend on it. Unknown
 * top-level fields are dropped, not refused: clients add their own (tracing
 * ids, `seed`); the route logs their names at debug.
 */
export const RequestEnvelope = z.object({
  model: z.string().min(1).default("judge-latest"),
  state: State,
  questions: z.record(z.string(), z.unknown()),
});
export type RequestEnvelope = z.infer<typeof RequestEnvelope>;

export function generalQuestions() {
  return z
    .record(z.string(), Question)
    .refine(
      (q) => Object.keys(q).length >= LIMITS.generalQuestions.min && Object.keys(q).length <= LIMITS.generalQuestions.max,
      { message: `general models take ${LIMITS.generalQuestions.min} to ${LIMITS.generalQuestions.max} questions` },
    );
}

/** Code search: `noul` or its alias `boolean`, 1–128 of them. */
export function codeSearchQuestions() {
  return z
    .record(
      z.string(),
      z.discriminatedUnion("type", [NoulQuestion, BooleanQuestion], {
        error: "code search questions are of type noul (or its alias boolean)",
      }),
    )
    .refine(
      (q) => Object.keys(q).length >= LIMITS.codeSearchQuestions.min && Object.keys(q).length <= LIMITS.codeSearchQuestions.max,
      { message: `code search models take ${LIMITS.codeSearchQuestions.min} to ${LIMITS.codeSearchQuestions.max} questions` },
    );
}

export const CodeSearchItem = z.looseObject({
  id: z.string().min(1),
  path: z.string(),
  kind: z.string().min(1),
  filePreview: z.looseObject({ text: z.string() }).optional(),
  childPreview: z
    .looseObject({ entries: z.array(z.looseObject({ name: z.string(), kind: z.string() })) })
    .optional(),
});
export const CodeSearchQuery = z.looseObject({ query: z.string(), items: z.array(CodeSearchItem) });
export const CodeSearchState = z.union([z.string(), CodeSearchQuery]);
export type CodeSearchState = z.infer<typeof CodeSearchState>;

const CLAIM_NEEDED = "a fact check question needs its claim in `instructions`";

/** Fact check: every question is a `noul` whose instructions hold one claim. */
export function factCheckQuestions() {
  return z
    .record(
      z.string(),
      z.discriminatedUnion(
        "type",
        [NoulQuestion.extend({ instructions: z.string({ error: CLAIM_NEEDED }).trim().min(1, CLAIM_NEEDED) })],
        { error: "fact check questions are of type noul, one claim each in `instructions`" },
      ),
    )
    .refine(
      (q) => Object.keys(q).length >= LIMITS.generalQuestions.min && Object.keys(q).length <= LIMITS.generalQuestions.max,
      { message: `fact check models take ${LIMITS.generalQuestions.min} to ${LIMITS.generalQuestions.max} questions` },
    );
}

// ---- answers ---------------------------------------------------------------
// Written once, as zod: the TypeScript types are inferred from these and the
// OpenAPI document (src/http/openapi.ts) is generated from the same objects.

const Probability = z.number().min(0).max(1);

export const NoulAnswer = z.object({ type: z.literal("noul"), noul: Probability });
export const ChoiceAnswer = z.object({
  type: z.literal("choice"),
  choice: z.string(),
  probabilities: z.record(z.string(), Probability),
  confidence: Probability,
});
export const ScoreAnswer = z.object({
  type: z.literal("score"),
  score: z.number().min(0),
  legend: z.record(z.string(), z.string()),
  probabilities: z.record(z.string(), Probability),
  confidence: Probability,
});
export const Answer = z.discriminatedUnion("type", [NoulAnswer, ChoiceAnswer, ScoreAnswer]);
export type NoulAnswer = z.infer<typeof NoulAnswer>;
export type ChoiceAnswer = z.infer<typeof ChoiceAnswer>;
export type ScoreAnswer = z.infer<typeof ScoreAnswer>;
export type Answer = z.infer<typeof Answer>;

export const Usage = z.object({ input_tokens: z.number().int().min(0), output_tokens: z.number().int().min(0) });
export type Usage = z.infer<typeof Usage>;

/** Loose: a family may add fields of its own next to these. */
export const SystemOneResponse = z.looseObject({
  model: z.string(),
  answers: z.record(z.string(), Answer),
  usage: Usage,
  request_id: z.string().optional(),
});
export type SystemOneResponse = z.infer<typeof SystemOneResponse>;

/** The spec's error body, whatever the status. */
export const ErrorBody = z.object({
  detail: z.unknown().describe("Why the request failed."),
  request_id: z.string().describe("Same value as the x-request-id header."),
});
export type ErrorBody = z.infer<typeof ErrorBody>;

/**
 * A zod error (or its issues, as a route schema's validator reports them) as the 422's issues.
 * Paths are from the top of the request body: `at` is where the validated value sits in it
 * (`questions` when a family checks the questions alone).
 */
export function zodIssues(err: { issues: readonly ZodIssueLike[] }, at: readonly (string | number)[] = []): ValidationIssue[] {
  const loc = (path: readonly PropertyKey[]) => ["body", ...at, ...path.map((p) => (typeof p === "number" ? p : String(p)))];
  return err.issues.map((i) => {
    // A bad record key (an empty option key) is reported by zod as "Invalid key in record" at a
    // path ending in the key itself; the caller needs the key's own rule and which key broke it.
    if (i.code === "invalid_key" && i.issues?.length) {
      const key = i.path[i.path.length - 1];
      return {
        loc: loc(i.path.slice(0, -1)),
        msg: `key ${JSON.stringify(String(key))}: ${i.issues.map((n) => n.message).join("; ")}`,
        type: "invalid_key",
      };
    }
    // FastAPI's (and so the SDKs') code for an absent required field.
    const missing = /received undefined$/.test(i.message);
    return { loc: loc(i.path), msg: i.message, type: missing ? "missing" : (i.code ?? "value_error") };
  });
}

interface ZodIssueLike {
  path: readonly PropertyKey[];
  message: string;
  code?: string;
  issues?: readonly { message: string }[];
}
