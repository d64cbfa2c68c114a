/**
 * The one error catalogue. Every failure the service reports is one entry
 * here; the HTTP layer maps `status` and `errorType` onto the wire, the batch
 * CLI writes the same `{status, code, detail}` into its output lines.
 *
 * The wire shape of `detail` follows what the official clients parse: a 422
 * carries a list of `{loc, msg, type}` (typesafe-sdk's `HTTPValidationError`,
 * FastAPI's shape), every other error `{error_type, message}`; both SDKs turn
 * either into their exception's message. `errorType` is that `error_type`.
 */
export const ERRORS = {
  UNAUTHORIZED: { status: 401, retryAfter: false, errorType: "authentication_error" },
  INSUFFICIENT_CREDIT: { status: 402, retryAfter: false, errorType: "insufficient_credit" },
  NOT_FOUND: { status: 404, retryAfter: false, errorType: "not_found" },
  METHOD_NOT_ALLOWED: { status: 405, retryAfter: false, errorType: "method_not_allowed" },
  BODY_TOO_LARGE: { status: 413, retryAfter: false, errorType: "request_too_large" },
  UNSUPPORTED_MEDIA_TYPE: { status: 415, retryAfter: false, errorType: "unsupported_media_type" },
  INVALID_REQUEST: { status: 422, retryAfter: false, errorType: "invalid_request_error" },
  TOO_MANY_REQUESTS: { status: 429, retryAfter: true, errorType: "rate_limit_error" },
  MODEL_FAILED: { status: 502, retryAfter: false, errorType: "model_error" },
  MODEL_STARTING: { status: 503, retryAfter: true, errorType: "model_starting" },
  UNAVAILABLE: { status: 503, retryAfter: true, errorType: "service_unavailable" },
  TIMEOUT: { status: 504, retryAfter: false, errorType: "timeout_error" },
  MODEL_BUSY: { status: 529, retryAfter: true, errorType: "overloaded_error" },
  INTERNAL: { status: 500, retryAfter: false, errorType: "internal_error" },
} as const;

export type ErrorCode = keyof typeof ERRORS;

/** One reason a request is not valid: where in the body (`loc`, from `"body"`), why, and a machine code. */
export interface ValidationIssue {
  loc: (string | number)[];
  msg: string;
  type: string;
}

/** The human sentence of a detail, as the SDKs compose it: `path: msg; path: msg` for issues, `message` otherwise. */
export function detailMessage(detail: unknown): string {
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail)) {
    return detail
      .map((d: Partial<ValidationIssue>) => {
        const path = (d.loc ?? []).filter((p) => p !== "body").join(".");
        return path ? `${path}: ${d.msg ?? ""}` : String(d.msg ?? "");
      })
      .join("; ");
  }
  if (detail && typeof detail === "object" && typeof (detail as { message?: unknown }).message === "string") {
    return (detail as { message: string }).message;
  }
  return JSON.stringify(detail);
}

export class AssayError extends Error {
  readonly status: number;
  constructor(
    readonly code: ErrorCode,
    /** A sentence, or for INVALID_REQUEST the issues; `wireDetail` gives either its wire shape. */
    readonly detail: string | ValidationIssue[],
    readonly retryAfterSeconds?: number,
  ) {
    super(detailMessage(detail));
    this.name = "AssayError";
    this.status = ERRORS[code].status;
  }
}

/** A 422 for the value at `loc` (a path within the body; empty for the body itself). */
export const invalid = (msg: string, loc: readonly (string | number)[] = [], type = "value_error") =>
  new AssayError("INVALID_REQUEST", [{ loc: ["body", ...loc], msg, type }]);

/** The body's `detail` for an error of `code`: issues for a 422, `{error_type, message}` for the rest. */
export function wireDetail(code: ErrorCode, detail: string | ValidationIssue[]): ValidationIssue[] | { error_type: string; message: string } {
  if (code === "INVALID_REQUEST") return typeof detail === "string" ? [{ loc: ["body"], msg: detail, type: "value_error" }] : detail;
  return { error_type: ERRORS[code].errorType, message: detailMessage(detail) };
}

/** Worker results cross a thread boundary as data, never as thrown classes. */
export interface WorkerFailure {
  ok: false;
  code: ErrorCode;
  message: string;
}

export function isAssayError(e: unknown): e is AssayError {
  return e instanceof AssayError;
}
