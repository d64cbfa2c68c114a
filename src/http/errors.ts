/**
 * The one place where an error becomes an HTTP response. Everything that
 * fails — catalogue errors thrown by the pipeline or the HTTP layer, fastify's
 * own errors, unknown bugs — comes through `sendError` and leaves as the
 * spec's body `{"detail": …, "request_id": …}` with the catalogue status,
 * both request-id headers, and `Retry-After` where the catalogue says so.
 */
import crypto from "node:crypto";
import http from "node:http";
import type { Socket } from "node:net";
import type { FastifyError, FastifyReply, FastifyRequest, FastifySchemaValidationError } from "fastify";
import { AssayError, ERRORS, type ErrorCode, type ValidationIssue, wireDetail } from "../errors/catalogue.js";
import { zodIssues } from "../validate/schema.js";
import { BODY_LIMIT_DETAIL } from "./body.js";
import { REQUEST_ID_HEADER, SDK_REQUEST_ID_HEADER, TYPESAFE_REQUEST_ID_HEADER, setRequestIdHeaders } from "./request-id.js";

export interface WireError {
  code: ErrorCode;
  status: number;
  /** As sent: issues for a 422, `{error_type, message}` otherwise (src/errors/catalogue.ts). */
  detail: ReturnType<typeof wireDetail>;
  /** Seconds for `Retry-After`, or null when the status does not carry it. */
  retryAfter: number | null;
}

const DEFAULT_RETRY_AFTER_S = 1;

function wire(code: ErrorCode, detail: string | ValidationIssue[], retryAfterSeconds?: number): WireError {
  const entry = ERRORS[code];
  let retryAfter: number | null = null;
  if (entry.retryAfter) {
    const s = retryAfterSeconds ?? DEFAULT_RETRY_AFTER_S;
    retryAfter = Number.isFinite(s) ? Math.max(0, Math.ceil(s)) : DEFAULT_RETRY_AFTER_S;
  }
  return { code, status: entry.status, detail: wireDetail(code, detail), retryAfter };
}

const isFastifyError = (e: unknown): e is FastifyError =>
  e instanceof Error && typeof (e as Partial<FastifyError>).code === "string" && (e as FastifyError).code.startsWith("FST_");

/** Error → catalogue entry and detail. Pure; `contentType` is only for the 415 detail. */
export function toWireError(err: unknown, contentType?: string): WireError {
  if (err instanceof AssayError) return wire(err.code, err.detail, err.retryAfterSeconds);
  if (isFastifyError(err)) {
    switch (err.code) {
      case "FST_ERR_CTP_BODY_TOO_LARGE":
        return wire("BODY_TOO_LARGE", BODY_LIMIT_DETAIL);
      case "FST_ERR_CTP_INVALID_MEDIA_TYPE":
        return wire(
          "UNSUPPORTED_MEDIA_TYPE",
          contentType
            ? `Content-Type must be application/json; got "${contentType.slice(0, 100)}"`
            : "Content-Type must be application/json; the request has none",
        );
      case "FST_ERR_CTP_INVALID_CONTENT_LENGTH":
        return wire("INVALID_REQUEST", "request body length does not match the Content-Length header");
      case "FST_ERR_CTP_EMPTY_JSON_BODY":
        return wire("INVALID_REQUEST", "request body is empty: send a JSON object with `state` and `questions`");
      case "FST_ERR_CTP_INVALID_JSON_BODY":
        return wire("INVALID_REQUEST", "request body is not valid JSON");
      case "FST_ERR_BAD_URL":
      case "FST_ERR_MAX_PARAM_LENGTH":
        return wire("NOT_FOUND", "the request URL is not valid");
    }
    // Any other client-side fastify error: the request was at fault, and
    // 422 is the spec's status for a request that is not valid.
    if (typeof err.statusCode === "number" && err.statusCode >= 400 && err.statusCode < 500) {
      return wire("INVALID_REQUEST", err.message);
    }
  }
  return wire("INTERNAL", "internal error; the request id identifies it in the server log");
}

export function sendError(err: unknown, request: FastifyRequest, reply: FastifyReply): FastifyReply {
  const w = toWireError(err, request.headers["content-type"]);
  const log = request.log;
  if (w.code === "INTERNAL") log.error({ err }, "unhandled error");
  else if (w.status >= 500) log.warn({ code: w.code, detail: w.detail }, "request failed");
  else log.info({ code: w.code, status: w.status }, "request refused");

  setRequestIdHeaders(reply, request.id);
  // Errors carry the timing headers too (a 504's x-queue-time says where the time went).
  if (request.timings) {
    request.timings.finish();
    reply.headers(request.timings.headers());
  }
  if (w.retryAfter !== null) reply.header("retry-after", String(w.retryAfter));
  if (w.status === 401) reply.header("www-authenticate", "Bearer");
  // An oversized body may still be arriving; do not keep reading it for the next request.
  if (w.status === 413) reply.header("connection", "close");
  return reply
    .code(w.status)
    .type("application/json; charset=utf-8")
    .send({ detail: w.detail, request_id: request.id });
}

/** fastify `setErrorHandler`. */
export function errorHandler(err: unknown, request: FastifyRequest, reply: FastifyReply): FastifyReply {
  return sendError(err, request, reply);
}

/**
 * A route's `schemaErrorFormatter`: a zod schema refused the request, so it
 * is the same 422 and the same `detail` as `zodIssues` gives for the
 * zod error itself. fastify-type-provider-zod reports each issue with its
 * message and its path as a JSON pointer; the request schemas name their
 * fields, so no path segment holds a "/" of its own.
 */
export function schemaErrorFormatter(errors: FastifySchemaValidationError[]): Error {
  return new AssayError(
    "INVALID_REQUEST",
    zodIssues({
      issues: errors.map((e) => ({
        path: e.instancePath === "/" ? [] : e.instancePath.slice(1).split("/"),
        message: e.message ?? "not valid",
        code: e.keyword,
      })),
    }),
  );
}

/** fastify `setNotFoundHandler`. The path is echoed, shortened; the query never is. */
export function notFoundHandler(request: FastifyRequest, reply: FastifyReply): FastifyReply {
  const path = (request.url.split("?")[0] ?? "").slice(0, 200);
  return sendError(new AssayError("NOT_FOUND", `no route for ${request.method} ${path}`), request, reply);
}

/** fastify `frameworkErrors`: router-level failures (bad URL encoding) that never reach a route's hooks. */
export function frameworkErrors(err: FastifyError, request: FastifyRequest, reply: FastifyReply): void {
  sendError(err, request, reply);
}

/**
 * fastify `clientErrorHandler`: the HTTP parser refused the bytes, so there
 * is no request object. Write the spec's body straight to the socket.
 */
export function clientErrorHandler(err: Error & { code?: string }, socket: Socket): void {
  if (err.code === "ECONNRESET" || socket.destroyed) return;
  let status = 400;
  let detail = { error_type: "bad_request", message: "malformed HTTP request" };
  if (err.code === "ERR_HTTP_REQUEST_TIMEOUT") {
    status = 408;
    detail = { error_type: "timeout_error", message: "the request took too long to arrive" };
  } else if (err.code === "HPE_HEADER_OVERFLOW") {
    status = 431;
    detail = { error_type: "request_too_large", message: "request headers are too large" };
  }
  const id = crypto.randomUUID();
  const body = JSON.stringify({ detail, request_id: id });
  if (socket.writable) {
    socket.write(
      `HTTP/1.1 ${status} ${http.STATUS_CODES[status] ?? ""}\r\n` +
        `Content-Type: application/json; charset=utf-8\r\n` +
        `Content-Length: ${Buffer.byteLength(body)}\r\n` +
        `${REQUEST_ID_HEADER}: ${id}\r\n${SDK_REQUEST_ID_HEADER}: ${id}\r\n${TYPESAFE_REQUEST_ID_HEADER}: ${id}\r\n` +
        `Connection: close\r\n\r\n${body}`,
    );
  }
  socket.destroy(err);
}
