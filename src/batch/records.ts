/**
 * The batch file formats.
 *
 * Input (JSONL): one spec request body per line, optionally with an `id`
 * (a string or an integer); without one, the id is the 1-based line number.
 * A line without `model` gets the command's `--model`. Blank lines are
 * ignored (they are not requests).
 *
 * Output (JSONL), one line per input line, written as requests complete (not
 * in input order; join on `id`):
 *
 *   {"id": …, "line": N, "status": 200, "response": {model, answers, usage}}
 *   {"id": …, "line": N, "status": 4xx/5xx, "error": {"detail": "…", "code": "…"}}
 *
 * `status` and `error.detail` are what the HTTP route would answer for the
 * same body (`code` is the error catalogue's name; `DUPLICATE_ID` is the
 * batch's own, for a second line with an id already used).
 */
import type { SystemOneResponse } from "../validate/schema.js";

export type BatchId = string | number;

export interface OkRecord {
  id: BatchId;
  line: number;
  status: 200;
  response: SystemOneResponse;
}

export interface ErrorRecord {
  id: BatchId;
  line: number;
  status: number;
  error: { detail: string; code?: string };
}

export type OutRecord = OkRecord | ErrorRecord;

export const DUPLICATE_ID = "DUPLICATE_ID";

/** Map key of an id: 7 and "7" are different ids (JSON types differ). */
export function idKey(id: BatchId): string {
  return typeof id === "number" ? `n:${id}` : `s:${id}`;
}

export function isOk(r: OutRecord): r is OkRecord {
  return r.status === 200 && "response" in r;
}

/** A failure as the batch writes it: status + detail (+ catalogue code). */
export class ScoreError extends Error {
  constructor(
    readonly status: number,
    readonly detail: string,
    readonly code?: string,
    /** Seconds the server asked us to wait (Retry-After), when retrying makes sense. */
    readonly retryAfterSeconds?: number,
  ) {
    super(detail);
    this.name = "ScoreError";
  }
}
