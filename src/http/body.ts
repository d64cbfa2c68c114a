/**
 * The request body, in the order the spec's checks go:
 *
 *   onRequest   Content-Length > 1 MiB  → 413, before a byte of the body is read
 *   parsing     Content-Type not JSON   → 415
 *               Content-Encoding not zstd, gzip, deflate, br, identity → 415
 *               body grows past 1 MiB   → 413 (chunked uploads; fastify bodyLimit)
 *               → keeps the raw bytes, does NOT decode or parse
 *   preValidation (route hooks, src/http/routes.ts, in this order)
 *               auth                    → 401   (src/http/auth.ts)
 *               concurrency slot        → 429   (src/accounts/admission.ts)
 *               bytes → decoded bytes   → 413 past 1 MiB decoded, 422 corrupt (content-encoding.ts)
 *               bytes → UTF-8 → JSON    → 422
 *   validation  JSON → RequestEnvelope  → 422   (the route's zod body schema; errors.ts formats it)
 *
 * Decoding and parsing after auth means an unauthenticated caller never gets
 * as far as a decompressor or the JSON parser, and a bad key is reported
 * before a bad body. The 1 MiB limit holds twice for a compressed body: for
 * the bytes sent and for the bytes they decode to.
 */
import type { FastifyInstance, FastifyRequest } from "fastify";
import { AssayError, invalid } from "../errors/catalogue.js";
import { LIMITS } from "../validate/schema.js";
import { decodeContent, parseContentEncoding, type Coding } from "./content-encoding.js";

export const BODY_LIMIT_DETAIL = `request body is larger than 1 MiB (${LIMITS.bodyBytes} bytes); send less`;

/** The unparsed body of an `application/json` request, as sent: still compressed when `codings` says so. */
export class RawJsonBody {
  constructor(
    readonly bytes: Buffer,
    readonly codings: readonly Coding[] = [],
  ) {}
}

/** 413 from the Content-Length header alone. A malformed header is left to Node and fastify. */
export function checkContentLength(request: FastifyRequest): void {
  const cl = request.headers["content-length"];
  if (typeof cl === "string" && /^\d+$/.test(cl) && Number(cl) > LIMITS.bodyBytes) {
    throw new AssayError("BODY_TOO_LARGE", BODY_LIMIT_DETAIL);
  }
}

function charsetOf(contentType: string | undefined): string | undefined {
  const m = /;\s*charset\s*=\s*"?([^";\s]+)"?/i.exec(contentType ?? "");
  return m?.[1]?.toLowerCase();
}

/**
 * Replace fastify's parsers with one: `application/json` (any parameters),
 * read as bytes up to the body limit, with a supported Content-Encoding.
 * Everything else is 415.
 */
export function registerJsonBody(app: FastifyInstance): void {
  app.removeAllContentTypeParsers();
  app.addContentTypeParser(
    "application/json",
    { parseAs: "buffer", bodyLimit: LIMITS.bodyBytes },
    (request, body, done) => {
      let codings: Coding[];
      try {
        codings = parseContentEncoding(request.headers["content-encoding"]);
      } catch (e) {
        done(e as AssayError, undefined);
        return;
      }
      const charset = charsetOf(request.headers["content-type"]);
      if (charset !== undefined && charset !== "utf-8" && charset !== "utf8") {
        done(new AssayError("UNSUPPORTED_MEDIA_TYPE", `request body must be UTF-8 JSON; got charset "${charset}"`), undefined);
        return;
      }
      done(null, new RawJsonBody(body as Buffer, codings));
    },
  );
}

const utf8 = new TextDecoder("utf-8", { fatal: true });

/**
 * Bytes → JSON value, or a 413/422 saying why not. A compressed body is
 * decoded first (413 past 1 MiB decoded, 422 corrupt). The JSON parser is
 * fastify's own (secure-json-parse), which refuses `__proto__` and
 * `constructor.prototype` keys instead of letting them reach zod's output.
 */
export function makeJsonDecoder(app: FastifyInstance): (request: FastifyRequest) => Promise<unknown> {
  const secureParse = app.getDefaultJsonParser("error", "error");
  return async (request) => {
    const body = request.body;
    if (body === undefined || body === null) {
      throw invalid("request body is required: a JSON object with `state` and `questions` (Content-Type: application/json)");
    }
    if (!(body instanceof RawJsonBody)) throw invalid("request body could not be read");
    let bytes = body.bytes;
    if (body.codings.length > 0) {
      bytes = await decodeContent(body.bytes, body.codings, LIMITS.bodyBytes);
      // Debug, next to the request's own line: what came over the wire and what it decoded to.
      request.log.debug({ contentEncoding: body.codings.join(", "), wireBytes: body.bytes.length, bodyBytes: bytes.length }, "request body decoded");
    }
    let text: string;
    try {
      text = utf8.decode(bytes); // also drops a leading BOM
    } catch {
      throw invalid("request body is not valid UTF-8");
    }
    if (text.trim().length === 0) {
      throw invalid("request body is empty: send a JSON object with `state` and `questions`");
    }
    // The default parser is synchronous: it calls `done` before returning.
    const box: { parsed: { ok: true; value: unknown } | { ok: false } } = { parsed: { ok: false } };
    void secureParse(request, text, (err, value) => {
      box.parsed = err ? { ok: false } : { ok: true, value };
    });
    if (box.parsed.ok) return box.parsed.value;
    throw invalid(jsonFailure(text));
  };
}

/** Error path only: say whether the text is not JSON at all or carries a forbidden key. */
function jsonFailure(text: string): string {
  try {
    JSON.parse(text);
    return "request body is not accepted: JSON keys `__proto__` and `constructor.prototype` are forbidden";
  } catch (e) {
    const why = e instanceof SyntaxError ? `: ${e.message.slice(0, 200)}` : "";
    return `request body is not valid JSON${why}`;
  }
}
