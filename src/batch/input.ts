/**
 * Input lines → requests. A line that cannot become a request becomes an
 * error record with the status and detail the HTTP route would give the
 * same body (413 over 1 MiB, 422 for bad JSON or a bad envelope); it never
 * stops the run.
 */
import { detailMessage } from "../errors/catalogue.js";
import { LIMITS, RequestEnvelope, zodIssues } from "../validate/schema.js";
import { DUPLICATE_ID, ScoreError, idKey, type BatchId } from "./records.js";

export interface InputLine {
  /** 1-based line number in the input file. */
  line: number;
  id: BatchId;
  /** The request, when the line is a valid envelope. */
  request?: RequestEnvelope;
  /** Why the line is not a request. */
  error?: ScoreError;
}

const MAX_ID_CHARS = 256;

/** Keys the HTTP route's JSON parser refuses (prototype poisoning). */
function hasForbiddenKey(v: unknown): boolean {
  if (Array.isArray(v)) return v.some(hasForbiddenKey);
  if (v === null || typeof v !== "object") return false;
  for (const [k, child] of Object.entries(v)) {
    if (k === "__proto__") return true;
    if (k === "constructor" && child !== null && typeof child === "object" && "prototype" in child) return true;
    if (hasForbiddenKey(child)) return true;
  }
  return false;
}

/** One non-blank line → a request or an error; `defaultModel` fills a missing `model`. */
export function parseLine(text: string, line: number, defaultModel: string): InputLine {
  const fail = (status: number, detail: string, id: BatchId = line, code = "INVALID_REQUEST"): InputLine => ({
    line,
    id,
    error: new ScoreError(status, detail, code),
  });
  if (Buffer.byteLength(text, "utf8") > LIMITS.bodyBytes) {
    return fail(413, `line ${line} is larger than 1 MiB (${LIMITS.bodyBytes} bytes); send less`, line, "BODY_TOO_LARGE");
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    return fail(422, `line ${line} is not valid JSON: ${(e as Error).message.slice(0, 200)}`);
  }
  if (json === null || typeof json !== "object" || Array.isArray(json)) {
    return fail(422, `line ${line}: a request must be a JSON object with \`state\` and \`questions\``);
  }
  const { id: rawId, ...body } = json as Record<string, unknown>;
  let id: BatchId = line;
  if (rawId !== undefined) {
    if (typeof rawId === "string" && rawId.length > 0 && rawId.length <= MAX_ID_CHARS) id = rawId;
    else if (typeof rawId === "number" && Number.isSafeInteger(rawId)) id = rawId;
    else return fail(422, `line ${line}: id must be a non-empty string (at most ${MAX_ID_CHARS} characters) or an integer`);
  }
  if (hasForbiddenKey(body)) {
    return fail(422, "request body is not accepted: JSON keys `__proto__` and `constructor.prototype` are forbidden", id);
  }
  if (body.model === undefined) body.model = defaultModel;
  const parsed = RequestEnvelope.safeParse(body);
  if (!parsed.success) return fail(422, detailMessage(zodIssues(parsed.error)), id);
  return { line, id, request: parsed.data };
}

/**
 * Every non-blank line of a JSONL text. A second line with an id already
 * used gets a 422 `DUPLICATE_ID` error (its first use is scored normally).
 */
export function parseInput(text: string, defaultModel: string): InputLine[] {
  const out: InputLine[] = [];
  const firstLine = new Map<string, number>();
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const raw = lines[i]!.replace(/\r$/, "");
    if (raw.trim().length === 0) continue;
    const parsed = parseLine(i === 0 ? raw.replace(/^\uFEFF/, "") : raw, i + 1, defaultModel);
    const key = idKey(parsed.id);
    const first = firstLine.get(key);
    if (first !== undefined) {
      out.push({
        line: parsed.line,
        id: parsed.id,
        error: new ScoreError(422, `duplicate id ${JSON.stringify(parsed.id)}: already used on line ${first}`, DUPLICATE_ID),
      });
      continue;
    }
    firstLine.set(key, parsed.line);
    out.push(parsed);
  }
  return out;
}
