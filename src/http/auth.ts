/**
 * `Authorization: Bearer <key>` → organization. Runs as a route hook
 * (preValidation on the scoring routes, preHandler on the others), after the
 * body size and content type checks and before the body is decoded, parsed
 * or validated. A refused key gets 401 with a detail saying which check failed;
 * saying "revoked" leaks nothing, since only the key's holder can learn it.
 */
import type { FastifyReply, FastifyRequest } from "fastify";
import type { AccountsStore, KeyCheck } from "../accounts/types.js";
import { isWellFormedKey } from "../accounts/keys.js";
import { AssayError } from "../errors/catalogue.js";

const unauthorized = (detail: string) => new AssayError("UNAUTHORIZED", detail);

/** Parse the header; throws 401 for missing or malformed. */
export function bearerToken(header: string | undefined): string {
  if (header === undefined || header.trim() === "") {
    throw unauthorized("missing Authorization header: send `Authorization: Bearer <API key>`");
  }
  const m = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(header);
  if (!m?.[1]) {
    throw unauthorized("malformed Authorization header: expected `Bearer <API key>`");
  }
  if (!isWellFormedKey(m[1])) {
    throw unauthorized("malformed API key: keys look like `sk-assay-` followed by 43 characters");
  }
  return m[1];
}

/**
 * The credential a request presents: `Authorization: Bearer <key>` (the
 * spec's), or, when that header is absent, an `api_key: <key>` header — what
 * the Stainless-generated `bespokelabs` client sends.
 */
export function presentedKey(headers: FastifyRequest["headers"]): string {
  const apiKey = headers["api_key"];
  if (headers.authorization === undefined && typeof apiKey === "string") {
    const key = apiKey.trim();
    if (!isWellFormedKey(key)) {
      throw unauthorized("malformed API key: keys look like `sk-assay-` followed by 43 characters");
    }
    return key;
  }
  return bearerToken(headers.authorization);
}

export function makeAuthenticate(accounts: AccountsStore) {
  return async function authenticate(request: FastifyRequest, reply: FastifyReply): Promise<void> {
    const t = performance.now();
    try {
      const key = presentedKey(request.headers);
      let check: KeyCheck;
      try {
        check = await accounts.checkKey(key);
      } catch (err) {
        // The store (PostgreSQL for replicas) is unreachable: not the caller's fault.
        request.log.error({ err }, "accounts store unreachable");
        throw new AssayError("UNAVAILABLE", "the service cannot check API keys right now; retry shortly", 1);
      }
      if (check.state === "revoked") throw unauthorized("API key has been revoked: create a new one");
      if (check.state === "unknown") throw unauthorized("API key is not valid: no such key");
      request.org = check.org;
      // Every later log line of this request names its organization (never the key).
      request.log = request.log.child({ org: check.org.name, orgId: check.org.id });
      reply.log = request.log;
      request.log.debug({ keyId: check.keyId }, "authenticated");
    } finally {
      request.timings.add("auth", performance.now() - t);
    }
  };
}
