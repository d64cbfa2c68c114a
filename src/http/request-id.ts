/**
 * Request ids. Every response (errors, 404s and transport errors included)
 * carries the id twice: `x-request-id`, and `x-sdk-request-id` which client
 * libraries read. A caller's own `x-request-id` is kept when it is a sane
 * token, so ids can be followed across services; anything else is replaced.
 */
import crypto from "node:crypto";
import type { IncomingMessage } from "node:http";
import type { FastifyReply } from "fastify";

export const REQUEST_ID_HEADER = "x-request-id";
export const SDK_REQUEST_ID_HEADER = "x-sdk-request-id";
/** The same id again under the name typesafe-sdk reads (`error.request_id`, `response.request_id`). */
export const TYPESAFE_REQUEST_ID_HEADER = "x-typesafe-request-id";

const SANE_ID = /^[A-Za-z0-9._:-]{1,128}$/;

export function isSaneRequestId(v: unknown): v is string {
  return typeof v === "string" && SANE_ID.test(v);
}

/** fastify `genReqId`: the caller's id when sane, else a fresh UUID. */
export function requestIdFor(req: Pick<IncomingMessage, "headers">): string {
  const given = req.headers[REQUEST_ID_HEADER];
  return isSaneRequestId(given) ? given : crypto.randomUUID();
}

export function setRequestIdHeaders(reply: FastifyReply, id: string): void {
  reply.header(REQUEST_ID_HEADER, id);
  reply.header(SDK_REQUEST_ID_HEADER, id);
  reply.header(TYPESAFE_REQUEST_ID_HEADER, id);
}
