/**
 * The one error catalogue. Every failure the service reports is one entry
 * here; the HTTP layer maps `status` onto the wire, the batch CLI writes the
 * same `{status, code, detail}` into its output lines.
 */
export const ERRORS = {
  UNAUTHORIZED: { status: 401, retryAfter: false },
  INSUFFICIENT_CREDIT: { status: 402, retryAfter: false },
  NOT_FOUND: { status: 404, retryAfter: false },
  METHOD_NOT_ALLOWED: { status: 405, retryAfter: false },
  BODY_TOO_LARGE: { status: 413, retryAfter: false },
  UNSUPPORTED_MEDIA_TYPE: { status: 415, retryAfter: false },
  INVALID_REQUEST: { status: 422, retryAfter: false },
  TOO_MANY_REQUESTS: { status: 429, retryAfter: true },
  MODEL_FAILED: { status: 502, retryAfter: false },
  MODEL_STARTING: { status: 503, retryAfter: true },
  UNAVAILABLE: { status: 503, retryAfter: true },
  TIMEOUT: { status: 504, retryAfter: false },
  MODEL_BUSY: { status: 529, retryAfter: true },
  INTERNAL: { status: 500, retryAfter: false },
} as const;

export type ErrorCode = keyof typeof ERRORS;

export class AssayError extends Error {
  readonly status: number;
  constructor(
    readonly code: ErrorCode,
    readonly detail: unknown,
    readonly retryAfterSeconds?: number,
  ) {
    super(typeof detail === "string" ? detail : JSON.stringify(detail));
    this.name = "AssayError";
    this.status = ERRORS[code].status;
  }
}

export const invalid = (detail: string) => new AssayError("INVALID_REQUEST", detail);

/** Worker results cross a thread boundary as data, never as thrown classes. */
export interface WorkerFailure {
  ok: false;
  code: ErrorCode;
  message: string;
}

export function isAssayError(e: unknown): e is AssayError {
  return e instanceof AssayError;
}
