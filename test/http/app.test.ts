import { Readable } from "node:stream";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { AssayError, type ErrorCode } from "../../src/errors/catalogue.js";
import { LIMITS } from "../../src/validate/schema.js";
import { expectSpecError } from "./assertions.js";
import { ENVELOPE_CASES, QUESTION_CASES } from "./bad-requests.js";
import { makeTestApp, UUID, validBody, type TestApp } from "./helpers.js";

let t: TestApp;
beforeEach(async () => {
  t = await makeTestApp();
});
afterEach(async () => {
  await t.close();
});

const auth = () => ({ authorization: `Bearer ${t.key}` });
const post = (payload: unknown, headers: Record<string, string> = auth(), url = "/v1/systemone") =>
  t.app.inject({ method: "POST", url, headers, payload: payload as object });

describe("success path", () => {
  it("returns the pipeline's response with timing headers and passes org and request id", async () => {
    const res = await post(validBody, { ...auth(), "x-request-id": "abc-123" });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({ model: "judge-latest", answers: {}, usage: { input_tokens: 0, output_tokens: 0 } });
    expect(res.headers["x-request-id"]).toBe("abc-123");
    expect(res.headers["x-sdk-request-id"]).toBe("abc-123");
    for (const h of ["x-validate-time", "x-auth-time", "x-total-time"]) {
      expect(res.headers[h], h).toMatch(/^\d+\.\d$/);
    }
    expect(t.pipeline.calls).toHaveLength(1);
    const { ctx, envelope } = t.pipeline.calls[0]!;
    expect(ctx.requestId).toBe("abc-123");
    expect(ctx.orgId).toBe(t.orgId);
    expect(ctx.signal).toBeInstanceOf(AbortSignal);
    expect(envelope).toEqual(validBody);
  });

  it("defaults model to judge-latest", async () => {
    const { model: _omit, ...rest } = validBody;
    const res = await post(rest);
    expect(res.statusCode).toBe(200);
    expect(t.pipeline.calls[0]!.envelope.model).toBe("judge-latest");
  });

  it("accepts application/json with a charset and a BOM", async () => {
    const res = await post("\uFEFF" + JSON.stringify(validBody), {
      ...auth(),
      "content-type": "application/json; charset=UTF-8",
    });
    expect(res.statusCode, res.body).toBe(200);
  });

  it("both POST paths take the same requests and give the same answers", async () => {
    const a = await post(validBody, auth(), "/v1/systemone");
    const b = await post(validBody, auth(), "/v1/judge/systemone");
    expect(a.statusCode).toBe(200);
    expect(b.statusCode).toBe(200);
    expect(b.json()).toEqual(a.json());

    const bad = { state: 1, questions: {} };
    const ea = await post(bad, auth(), "/v1/systemone");
    const eb = await post(bad, auth(), "/v1/judge/systemone");
    expect(expectSpecError(eb, 422)).toBe(expectSpecError(ea, 422));

    const na = await post(validBody, {}, "/v1/systemone");
    const nb = await post(validBody, {}, "/v1/judge/systemone");
    expect(expectSpecError(nb, 401)).toBe(expectSpecError(na, 401));
  });
});

describe("what clients send that the contract allows", () => {
  it("unknown top-level fields are ignored (dropped before the pipeline), not refused", async () => {
    const res = await post({ ...validBody, x_trace_id: "trace-1", seed: 7, temperature: 0 });
    expect(res.statusCode, res.body).toBe(200);
    expect(t.pipeline.calls[0]!.envelope).toEqual(validBody);
  });

  it.each([
    ["criteria null", { type: "noul", instructions: "Asks for a refund.", criteria: null }],
    ["one-sided criteria (true)", { type: "noul", instructions: "Asks for a refund.", criteria: { true: "wants money back" } }],
    ["one-sided criteria (false)", { type: "noul", instructions: "Asks for a refund.", criteria: { false: "no request" } }],
    ["a null side", { type: "noul", instructions: "Asks for a refund.", criteria: { true: "wants money back", false: null } }],
    ["instructions null", { type: "noul", instructions: null }],
    ["structured instructions and sides", { type: "noul", instructions: { task: "refund?", include: ["chargebacks"] }, criteria: { true: { examples: ["refund me"] }, false: ["questions"] } }],
    ["structured choice descriptions", { type: "choice", instructions: ["Route it.", "One team."], criteria: { Billing: { owns: ["invoices"] }, Tech: ["bugs"], Sales: "Pricing", Other: null } }],
    ["structured score levels", { type: "score", instructions: { scale: "anger" }, criteria: [{ level: "calm" }, ["annoyed", "terse"], "furious"] }],
  ])("a question with %s is accepted", async (_name, q) => {
    const res = await post({ ...validBody, questions: { q } });
    expect(res.statusCode, res.body).toBe(200);
  });

  it.each([
    ["a number as instructions", { type: "noul", instructions: 3 }],
    ["a null score level", { type: "score", criteria: ["calm", null] }],
    ["a number as an option description", { type: "choice", criteria: { a: 1, b: null } }],
    ["an unknown criteria side", { type: "noul", criteria: { true: "yes", maybe: "perhaps" } }],
    ["an unknown question field", { type: "noul", instructions: "x", weight: 2 }],
  ])("still refused: %s", async (_name, q) => {
    const d = expectSpecError(await post({ ...validBody, questions: { q } }), 422);
    expect(d).toMatch(/^questions\.q/);
  });

  it("a 422 names each field by its path from the body, with zod's code as the type", async () => {
    const res = await post({ state: "x", questions: { q1: { type: "score", criteria: ["only"] }, q2: { type: "choice" } } });
    expectSpecError(res, 422);
    const detail = (res.json() as { detail: { loc: unknown[]; type: string }[] }).detail;
    expect(detail).toContainEqual(expect.objectContaining({ loc: ["body", "questions", "q1", "criteria"], type: "too_small" }));
    expect(detail).toContainEqual(expect.objectContaining({ loc: ["body", "questions", "q2", "criteria"], type: "missing" }));
  });

  it("a missing envelope field is `missing` at its location", async () => {
    const res = await post({ questions: { q: { type: "noul" } } });
    expectSpecError(res, 422);
    expect((res.json() as { detail: unknown[] }).detail).toContainEqual(expect.objectContaining({ loc: ["body", "state"], type: "missing" }));
  });

  it("a 401 carries error_type authentication_error, missing and wrong key alike", async () => {
    for (const headers of [{}, { authorization: `Bearer sk-assay-${"A".repeat(43)}` }]) {
      const res = await post(validBody, headers);
      expectSpecError(res, 401);
      expect((res.json() as { detail: { error_type: string } }).detail.error_type).toBe("authentication_error");
    }
  });
});

describe("request id", () => {
  it("echoes a sane x-request-id", async () => {
    const res = await t.app.inject({ method: "GET", url: "/healthz", headers: { "x-request-id": "trace:01.a_b-c" } });
    expect(res.headers["x-request-id"]).toBe("trace:01.a_b-c");
    expect(res.headers["x-sdk-request-id"]).toBe("trace:01.a_b-c");
  });

  it("generates a UUID when absent", async () => {
    const a = await t.app.inject({ method: "GET", url: "/healthz" });
    const b = await t.app.inject({ method: "GET", url: "/healthz" });
    expect(a.headers["x-request-id"]).toMatch(UUID);
    expect(a.headers["x-sdk-request-id"]).toBe(a.headers["x-request-id"]);
    expect(b.headers["x-request-id"]).not.toBe(a.headers["x-request-id"]);
  });

  it.each([
    ["too long", "a".repeat(129)],
    ["with spaces", "a b"],
    ["with a quote", 'a"b'],
    ["empty", ""],
  ])("replaces an id that is %s", async (_name, id) => {
    const res = await t.app.inject({ method: "GET", url: "/healthz", headers: { "x-request-id": id } });
    expect(res.headers["x-request-id"]).toMatch(UUID);
  });

  it("keeps a 128-character id", async () => {
    const id = "x".repeat(128);
    const res = await t.app.inject({ method: "GET", url: "/healthz", headers: { "x-request-id": id } });
    expect(res.headers["x-request-id"]).toBe(id);
  });

  it("uses the given id in error bodies", async () => {
    const res = await post(validBody, { "x-request-id": "mine-1" });
    expectSpecError(res, 401);
    expect(res.json().request_id).toBe("mine-1");
  });
});

describe("401 authentication", () => {
  it("missing header", async () => {
    const res = await post(validBody, {});
    expect(expectSpecError(res, 401)).toMatch(/missing Authorization header/);
    expect(res.headers["www-authenticate"]).toBe("Bearer");
  });

  it.each([
    ["another scheme", "Basic dXNlcjpwYXNz", /malformed Authorization header/],
    ["Bearer without a key", "Bearer", /malformed Authorization header/],
    ["two tokens", "Bearer a b", /malformed Authorization header/],
    ["a key of the wrong shape", "Bearer not-a-key", /malformed API key/],
  ])("malformed: %s", async (_name, header, detail) => {
    expect(expectSpecError(await post(validBody, { authorization: header }), 401)).toMatch(detail);
  });

  it("unknown key of the right shape", async () => {
    const other = "sk-assay-" + "A".repeat(43);
    expect(expectSpecError(await post(validBody, { authorization: `Bearer ${other}` }), 401)).toMatch(/not valid/);
  });

  it("revoked key", async () => {
    const { key, keyId } = t.accounts.createKey("acme");
    expect((await post(validBody, { authorization: `Bearer ${key}` })).statusCode).toBe(200);
    t.accounts.revokeKey(keyId);
    expect(expectSpecError(await post(validBody, { authorization: `Bearer ${key}` }), 401)).toMatch(/revoked/);
  });

  it("scheme is case-insensitive", async () => {
    expect((await post(validBody, { authorization: `bearer ${t.key}` })).statusCode).toBe(200);
  });

  it("GET /v1/models needs a key too", async () => {
    expectSpecError(await t.app.inject({ method: "GET", url: "/v1/models" }), 401);
  });

  it("runs before body validation: bad JSON with no key is 401", async () => {
    const res = await post("{not json", { "content-type": "application/json" });
    expectSpecError(res, 401);
    expect(t.pipeline.calls).toHaveLength(0);
  });
});

describe("413 body size", () => {
  const big = () => JSON.stringify({ state: "x".repeat(LIMITS.bodyBytes), questions: { q: { type: "noul" } } });

  it("refuses a body over 1 MiB", async () => {
    const res = await post(big(), { ...auth(), "content-type": "application/json" });
    expect(expectSpecError(res, 413)).toMatch(/1 MiB/);
    expect(res.headers.connection).toBe("close");
  });

  it("refuses a body over 1 MiB before auth", async () => {
    expectSpecError(await post(big(), { "content-type": "application/json" }), 413);
  });

  it("refuses on Content-Length alone, before reading or checking the content type", async () => {
    for (const contentType of ["application/json", "text/plain"]) {
      const res = await t.app.inject({
        method: "POST",
        url: "/v1/systemone",
        headers: { "content-type": contentType, "content-length": String(LIMITS.bodyBytes + 1) },
        payload: Readable.from([Buffer.from("{}")]),
      });
      expectSpecError(res, 413);
    }
    expect(t.pipeline.calls).toHaveLength(0);
  });

  it("refuses a chunked body that grows past 1 MiB", async () => {
    const chunk = Buffer.alloc(64 * 1024, 0x20);
    const chunks = Array.from({ length: 17 }, () => chunk); // 1.0625 MiB, no Content-Length
    const res = await t.app.inject({
      method: "POST",
      url: "/v1/systemone",
      headers: { ...auth(), "content-type": "application/json" },
      payload: Readable.from(chunks),
    });
    expectSpecError(res, 413);
  });

  it("accepts a body of exactly 1 MiB", async () => {
    const head = JSON.stringify({ ...validBody, state: "" });
    const pad = LIMITS.bodyBytes - Buffer.byteLength(head);
    const body = JSON.stringify({ ...validBody, state: "y".repeat(pad) });
    expect(Buffer.byteLength(body)).toBe(LIMITS.bodyBytes);
    expect((await post(body, { ...auth(), "content-type": "application/json" })).statusCode).toBe(200);
  });
});

describe("415 content type", () => {
  it.each([
    ["text/plain", /application\/json.*text\/plain/],
    ["application/x-www-form-urlencoded", /application\/json/],
    ["application/json; charset=latin1", /UTF-8/],
  ])("refuses %s", async (contentType, detail) => {
    const res = await post(JSON.stringify(validBody), { ...auth(), "content-type": contentType });
    expect(expectSpecError(res, 415)).toMatch(detail);
  });

  it("refuses a body without a content type", async () => {
    const res = await t.app.inject({
      method: "POST",
      url: "/v1/systemone",
      headers: auth(),
      payload: Buffer.from(JSON.stringify(validBody)),
    });
    expect(expectSpecError(res, 415)).toMatch(/has none/);
  });
});

describe("422 validation", () => {
  it("invalid JSON", async () => {
    const res = await post('{"state": "x", ', { ...auth(), "content-type": "application/json" });
    expect(expectSpecError(res, 422)).toMatch(/not valid JSON/);
    expect(t.pipeline.calls).toHaveLength(0);
  });

  it("empty body", async () => {
    const res = await post("", { ...auth(), "content-type": "application/json" });
    expect(expectSpecError(res, 422)).toMatch(/empty/);
  });

  it("no body and no content type", async () => {
    const res = await t.app.inject({ method: "POST", url: "/v1/systemone", headers: auth() });
    expect(expectSpecError(res, 422)).toMatch(/required/);
  });

  it("invalid UTF-8", async () => {
    const res = await t.app.inject({
      method: "POST",
      url: "/v1/systemone",
      headers: { ...auth(), "content-type": "application/json" },
      payload: Buffer.from([0x7b, 0x22, 0xff, 0x22, 0x7d]),
    });
    expect(expectSpecError(res, 422)).toMatch(/UTF-8/);
  });

  it("__proto__ keys are refused, not merged", async () => {
    const raw = `{"state":"x","questions":{"__proto__":{"type":"noul"}}}`;
    const res = await post(raw, { ...auth(), "content-type": "application/json" });
    expect(expectSpecError(res, 422)).toMatch(/__proto__/);
  });

  it.each(ENVELOPE_CASES)("envelope: $name", async ({ body, detail }) => {
    const res = await post(JSON.stringify(body), { ...auth(), "content-type": "application/json" });
    const d = expectSpecError(res, 422);
    if (typeof detail === "string") expect(d).toContain(detail);
    else expect(d).toMatch(detail);
    expect(t.pipeline.calls).toHaveLength(0);
  });

  // These rules are the pipeline's (per family); the fake applies the real
  // general-family schema, so this checks that they arrive as 422 + detail.
  it.each(QUESTION_CASES)("question: $name", async ({ body, detail }) => {
    const d = expectSpecError(await post(body), 422);
    if (typeof detail === "string") expect(d).toContain(detail);
    else expect(d).toMatch(detail);
  });
});

describe("errors thrown by the pipeline", () => {
  const cases: [ErrorCode, number, number | undefined, string | null][] = [
    ["INVALID_REQUEST", 422, undefined, null],
    ["INSUFFICIENT_CREDIT", 402, undefined, null],
    ["TOO_MANY_REQUESTS", 429, 3, "3"],
    ["TOO_MANY_REQUESTS", 429, undefined, "1"],
    ["MODEL_FAILED", 502, undefined, null],
    ["MODEL_STARTING", 503, 7, "7"],
    ["UNAVAILABLE", 503, undefined, "1"],
    ["TIMEOUT", 504, undefined, null],
    ["MODEL_BUSY", 529, undefined, "1"],
    ["MODEL_BUSY", 529, 2.2, "3"],
  ];
  it.each(cases)("%s → %i (Retry-After given %s)", async (code, status, retryAfter, header) => {
    t.pipeline.failWith = new AssayError(code, `failure ${code}`, retryAfter);
    const res = await post(validBody);
    expect(expectSpecError(res, status)).toBe(`failure ${code}`);
    expect(res.headers["retry-after"]).toBe(header ?? undefined);
  });

  it("an unknown error is a 500 with a generic detail that leaks nothing", async () => {
    t.pipeline.failWith = new Error("secret internal path /opt/x");
    const res = await post(validBody);
    const d = expectSpecError(res, 500);
    expect(d).not.toContain("secret");
    expect(res.headers["retry-after"]).toBeUndefined();
  });
});

describe("routes", () => {
  it("404 with the spec body for unknown routes", async () => {
    const res = await t.app.inject({ method: "GET", url: "/v2/nothing?key=secret" });
    const d = expectSpecError(res, 404);
    expect(d).toContain("/v2/nothing");
    expect(d).not.toContain("secret");
    expectSpecError(await post(validBody, auth(), "/v1/systemtwo"), 404);
  });

  it("405 with the spec body and Allow for a wrong method on a known path", async () => {
    const res = await t.app.inject({ method: "GET", url: "/v1/systemone" });
    expectSpecError(res, 405);
    expect(res.headers.allow).toBe("POST");
    const res2 = await t.app.inject({ method: "DELETE", url: "/v1/models" });
    expectSpecError(res2, 405);
    expect(res2.headers.allow).toBe("GET, HEAD");
  });

  it("a bad URL encoding is a 404 with the spec body", async () => {
    expectSpecError(await t.app.inject({ method: "GET", url: "/v1/%zz" }), 404);
  });

  it("GET /v1/models lists the pipeline's models", async () => {
    const res = await t.app.inject({ method: "GET", url: "/v1/models", headers: auth() });
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body.object).toBe("list");
    expect(body.data).toEqual(t.pipeline.listModels().map((m) => ({ object: "model", ...m })));
    expect(res.headers["x-request-id"]).toMatch(UUID);
  });

  it("/healthz is 200 even when not ready", async () => {
    t.pipeline.isReady = false;
    const res = await t.app.inject({ method: "GET", url: "/healthz" });
    expect(res.statusCode).toBe(200);
    expect(res.json()).toEqual({ status: "ok" });
  });

  it("/readyz follows pipeline.ready()", async () => {
    const ok = await t.app.inject({ method: "GET", url: "/readyz" });
    expect(ok.statusCode).toBe(200);
    t.pipeline.isReady = false;
    const res = await t.app.inject({ method: "GET", url: "/readyz" });
    expectSpecError(res, 503);
    expect(Number(res.headers["retry-after"])).toBeGreaterThan(0);
  });
});
