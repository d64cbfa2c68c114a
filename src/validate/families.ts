/**
 * What each family accepts, checked from the request alone: no model, no
 * tokenizer. Kept apart from the families' scoring so that a malformed
 * request gets its 422 whatever the state of the model it names (still
 * loading at boot, a large build loading on first use), not a 503 that
 * invites the caller to retry the same bad request.
 */
import { AssayError, invalid } from "../errors/catalogue.js";
import {
  CodeSearchQuery,
  CodeSearchState,
  LIMITS,
  codeSearchQuestions,
  factCheckQuestions,
  generalQuestions,
  type Question,
  type RequestEnvelope,
  zodIssues,
} from "./schema.js";

export type Family = "general" | "factcheck" | "codesearch";

/** The 422 for a model name the registry does not hold: the same words before and after the model loads. */
export function unknownModel(name: string, names: readonly string[]): Error {
  return invalid(`unknown model "${name}"; available models: ${names.join(", ")}`, ["model"]);
}

function questionsError(err: Parameters<typeof zodIssues>[0]): Error {
  return new AssayError("INVALID_REQUEST", zodIssues(err, ["questions"]));
}

/** A general request's questions, parsed. */
export function generalRequest(env: Pick<RequestEnvelope, "questions">): Record<string, Question> {
  const parsed = generalQuestions().safeParse(env.questions);
  if (!parsed.success) throw questionsError(parsed.error);
  return parsed.data;
}

export interface FactCheckRequest {
  document: string;
  ids: string[];
  claims: string[];
}

export function factCheckRequest(env: Pick<RequestEnvelope, "state" | "questions">): FactCheckRequest {
  const qs = factCheckQuestions().safeParse(env.questions);
  if (!qs.success) throw questionsError(qs.error);
  if (typeof env.state !== "string") throw invalid("a fact check state is the document, as a string", ["state"]);
  if (env.state.trim().length === 0) throw invalid("the document is empty", ["state"]);
  const ids = Object.keys(qs.data);
  return { document: env.state, ids, claims: ids.map((id) => qs.data[id]!.instructions) };
}

export type CodeSearchItem = Extract<CodeSearchState, { items: unknown }>["items"][number];

/**
 * A code search request: the query and, per question, its instructions and
 * the item it is about (`q<i>` → `n<i>`), or no items when the state is a
 * string (the whole state is then each question's subject).
 */
export interface CodeSearchRequest {
  query: string;
  ids: string[];
  instructions: (string | undefined)[];
  items: CodeSearchItem[] | null;
}

export function codeSearchRequest(env: Pick<RequestEnvelope, "state" | "questions">): CodeSearchRequest {
  const qs = codeSearchQuestions().safeParse(env.questions);
  if (!qs.success) throw questionsError(qs.error);
  // A state that is not a string is checked as the object form alone, so the detail names the field
  // that broke it (state.items.0.kind) instead of the union's "Invalid input".
  const st = typeof env.state === "string" ? CodeSearchState.safeParse(env.state) : CodeSearchQuery.safeParse(env.state);
  if (!st.success) {
    const shape = "a code search state is {query, items: [{id, path, kind, filePreview?, childPreview?}]} or a string";
    throw new AssayError(
      "INVALID_REQUEST",
      zodIssues(st.error, ["state"]).map((i) => ({ ...i, msg: `${i.msg} (${shape})` })),
    );
  }
  const state = st.data;
  const chars = typeof state === "string" ? state.length : JSON.stringify(state).length;
  if (chars > LIMITS.codeSearchStateChars) {
    throw invalid(
      `${chars.toLocaleString("en-US")} characters; code search states are limited to ${LIMITS.codeSearchStateChars.toLocaleString("en-US")}`,
      ["state"],
      "too_big",
    );
  }
  const ids = Object.keys(qs.data);
  const instructions = ids.map((id) => qs.data[id]!.instructions);
  if (typeof state === "string") return { query: state, ids, instructions, items: null };
  const byId = new Map<string, CodeSearchItem>();
  for (const it of state.items) {
    if (byId.has(it.id)) throw invalid(`item id "${it.id}" appears more than once`, ["state", "items"]);
    byId.set(it.id, it);
  }
  const items = ids.map((id) => {
    const m = /^q(\d+)$/.exec(id);
    const item = m ? byId.get(`n${m[1]}`) : undefined;
    if (!item) {
      throw invalid(
        m
          ? `no item "n${m[1]}" in state.items (question q<i> is about item n<i>)`
          : `code search question ids are q0, q1, …, one per item n0, n1, …`,
        ["questions", id],
      );
    }
    return item;
  });
  return { query: state.query, ids, instructions, items };
}

/** Every check of `family` that needs no model: throws the 422 the family itself would. */
export function checkFamilyRequest(family: Family, env: Pick<RequestEnvelope, "state" | "questions">): void {
  if (family === "codesearch") codeSearchRequest(env);
  else if (family === "factcheck") factCheckRequest(env);
  else generalRequest(env);
}
