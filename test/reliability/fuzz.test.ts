/**
 * Bad input, property-based (fast-check): request bodies, headers and content
 * types that are each wrong in at least one way, thrown at the real app
 * (buildApp + the real engine, the default exported model, an SQLite store)
 * through `app.inject()`. Every case must be answered 4xx with the spec's
 * error body (`detail` + `request_id`), never 5xx, never a crash, and nothing
 * may be charged. CI form: a few hundred cases; full form: 10,000.
 *
 * Compressed bodies (Content-Encoding zstd, gzip, deflate, br) are fuzzed the
 * same way: random bytes under each coding (bare, or behind the coding's magic
 * bytes), valid compression of a bad request, valid compression cut short,
 * a body compressed one way and labelled another, stacked and unknown codings,
 * and decompression bombs (64 MiB of zeros or text in a few KB) — all 4xx,
 * bombs 413, never charged.
 *
 * Then, over a real socket against a server process: bodies over 1 MiB are
 * refused (413) without being read whole — a chunked upload of 64 MiB (256 MiB
 * in the full form) is cut off early and the server's peak memory does not
 * grow by anything like the body's size; nor does it for a bomb of that size
 * sent compressed.
 */
import fs from "node:fs";
import http from "node:http";
import os from "node:os";
import path from "node:path";
import zlib from "node:zlib";
import fc from "fast-check";
import type { FastifyInstance } from "fastify";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SqliteAccountsStore } from "../../src/accounts/sqlite.js";
import { buildApp } from "../../src/app.js";
import { loadConfig } from "../../src/config/index.js";
import { createLogger } from "../../src/observability/logger.js";
import { EnginePipeline } from "../../src/pipeline/index.js";
import { TEXT_BOMB_ZSTD, compress, zstdZeros } from "../http/compressed.js";
import { BASE_ENV, FIGURES, FORM, ServerProcess, expectNoSecrets, recordFigures, smallBody, until } from "./harness.js";
import { smallDeployment } from "../engine/engine.js";
import { detailMessage } from "../../src/errors/catalogue.js";

let dir: string;
let engine: EnginePipeline;
let accounts: SqliteAccountsStore;
let app: FastifyInstance;
let key: string;
let orgId: string;
let logs = "";
/** Every credential-looking string a case sent: none may reach the log. */
const sentKeys = new Set<string>();

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-reliability-fuzz-"));
  const env = { ...process.env, ...BASE_ENV, ...smallDeployment(), ASSAY_DATA_DIR: dir };
  const config = loadConfig(env);
  engine = await EnginePipeline.create(config);
  accounts = new SqliteAccountsStore(dir, { startingGrantMicro: 1_000_000 });
  ({ key, org: { id: orgId } } = accounts.createKey("fuzz"));
  sentKeys.add(key);
  // The app's own structured log at its most verbose, captured whole.
  const logger = createLogger("trace", { write: (line: string) => void (logs += line) });
  app = buildApp({ config, pipeline: engine, accounts, logger });
  await app.ready();
});

afterAll(async () => {
  await app?.close();
  accounts?.close();
  await engine?.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

// ---------------------------------------------------------------- arbitraries

const VALID = smallBody(1); // one choice question
const validText = () => JSON.stringify(VALID);
const printable = (max: number) => fc.string({ unit: fc.integer({ min: 0x20, max: 0x7e }).map((c) => String.fromCharCode(c)), maxLength: max });
const anyJson = fc.jsonValue({ maxDepth: 4 });

/** One way a request body is wrong (each yields text that can never be a valid request). */
const badBody: fc.Arbitrary<{ what: string; body: string | Buffer }> = fc.oneof(
  // Not JSON, or not an object: random text and bytes (mutations of a valid request, below, weigh most).
  fc.string({ maxLength: 200 }).map((s) => ({ what: "text", body: s })),
  fc.uint8Array({ maxLength: 300 }).map((b) => ({ what: "bytes", body: Buffer.from(b) })),
  anyJson.map((v) => ({ what: "json-value", body: JSON.stringify(v) ?? "null" })),
  // A valid request cut short: never valid JSON.
  fc.integer({ min: 0, max: validText().length - 1 }).map((n) => ({ what: "truncated", body: validText().slice(0, n) })),
  // A valid request with invalid UTF-8 inside a string.
  fc.constantFrom(Buffer.from([0xff]), Buffer.from([0xc3, 0x28]), Buffer.from([0xed, 0xa0, 0x80]), Buffer.from([0xf8, 0x88, 0x80, 0x80, 0x80])).map((bad) => {
    const [a, b] = validText().split('"state":"', 2) as [string, string];
    return { what: "bad-utf8", body: Buffer.concat([Buffer.from(a + '"state":"'), bad, Buffer.from(b)]) };
  }),
  // The valid request with one field made wrong.
  { weight: 6, arbitrary: fc
    .tuple(
      fc.constantFrom(
        "no-state",
        "no-questions",
        "state-type",
        "questions-type",
        "questions-empty",
        "too-many-questions",
        "state-type",
        "model",
        "question-type",
        "question-extra",
        "instructions-type",
        "choice-few",
        "choice-value",
        "choice-empty-key",
        "score-few",
        "score-item",
        "noul-criteria",
        "proto",
      ),
      anyJson,
      printable(30),
    )
    .map(([how, junk, word]) => {
      const b: Record<string, unknown> = structuredClone(VALID);
      const q = (b.questions as Record<string, Record<string, unknown>>).topic!;
      switch (how) {
        case "no-state":
          delete b.state;
          break;
        case "no-questions":
          delete b.questions;
          break;
        case "state-type":
          b.state = typeof junk === "string" || (typeof junk === "object" && junk !== null) ? 42 : junk;
          break;
        case "questions-type":
          b.questions = Array.isArray(junk) || typeof junk !== "object" || junk === null ? junk : [junk];
          break;
        case "questions-empty":
          b.questions = {};
          break;
        case "too-many-questions":
          b.questions = Object.fromEntries(Array.from({ length: 65 + word.length }, (_, i) => [`q${i}`, { type: "noul" }]));
          break;
        case "state-type":
          // Unknown top-level fields are ignored (clients add their own); a state that is not text or JSON is refused.
          b[`x_${word}`] = junk;
          b.state = typeof junk === "number" || typeof junk === "boolean" ? junk : null;
          break;
        case "model":
          b.model = `nope-${word}`;
          break;
        case "question-type":
          q.type = ["noul", "choice", "score"].includes(word) ? `${word}!` : word;
          break;
        case "question-extra":
          q[`extra_${word}`] = junk;
          break;
        case "instructions-type":
          // Instructions are a string, an object, an array or null (absent): anything else is refused.
          q.instructions = typeof junk === "number" || typeof junk === "boolean" ? junk : 7;
          break;
        case "choice-few":
          q.criteria = word.length % 2 ? {} : { only: null };
          break;
        case "choice-value":
          // A description is a string, an object, an array or null: anything else is refused.
          q.criteria = { a: null, b: typeof junk === "number" || typeof junk === "boolean" ? junk : 1 };
          break;
        case "choice-empty-key":
          q.criteria = { "": word, b: null };
          break;
        case "score-few":
          Object.assign(q, { type: "score", criteria: word.length % 2 ? [] : [word] });
          break;
        case "score-item":
          Object.assign(q, { type: "score", criteria: ["low", typeof junk === "number" || typeof junk === "boolean" ? junk : null, "high"] });
          break;
        case "noul-criteria":
          Object.assign(q, { type: "noul", criteria: { true: "yes", [`maybe_${word}`]: word } });
          break;
        case "proto":
          return { what: how, body: validText().replace('"state"', `"__proto__":{"polluted":${JSON.stringify(word)}},"state"`) };
      }
      return { what: how, body: JSON.stringify(b) };
    }) },
);

const goodContentType = fc.constantFrom("application/json", "application/json; charset=utf-8", "Application/JSON", "application/json;charset=UTF-8");
const badContentType = fc.oneof(
  fc.constantFrom(
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=xyz",
    "application/json; charset=latin1",
    "application/json; charset=utf-16",
    "application/xml",
    "application/jsonx",
    "json",
    "*/*",
  ),
  printable(40).filter((s) => !/^\s*application\/json\s*(;|$)/i.test(s)),
);
const badAuth = fc.oneof(
  fc.constant(undefined),
  fc.constantFrom("", "Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "Token abc", "bearer"),
  printable(80),
  // Well-formed keys that do not exist (also searched for in the log afterwards).
  fc.stringMatching(/^[A-Za-z0-9_-]{43}$/).map((r) => `Bearer sk-assay-${r}`),
  fc.constant(null).map(() => `Bearer ${key.slice(0, -1)}${key.endsWith("A") ? "B" : "A"}`),
  fc.stringMatching(/^[A-Za-z0-9_-]{43}$/).map((r) => `bearer\tsk-assay-${r}  `),
);
const extraHeaders = fc.dictionary(
  fc.stringMatching(/^x-[a-z0-9-]{1,20}$/),
  printable(60).map((s) => s.trim()),
  { maxKeys: 4 },
);

interface Case {
  what: string;
  method: "POST" | "GET" | "PUT";
  url: string;
  headers: Record<string, string>;
  body: string | Buffer | undefined;
}

// --------------------------------------------------------- compressed bodies

const CODINGS = ["zstd", "gzip", "deflate", "deflate-raw", "br"] as const;
type FuzzCoding = (typeof CODINGS)[number];
const headerOf = (c: FuzzCoding) => (c === "deflate-raw" ? "deflate" : c);
/** What each coding's data starts with: random bytes behind it get past the first check of the decoder. */
const MAGIC: Record<FuzzCoding, Buffer> = {
  zstd: Buffer.from([0x28, 0xb5, 0x2f, 0xfd]),
  gzip: Buffer.from([0x1f, 0x8b, 0x08, 0x00]),
  deflate: Buffer.from([0x78, 0x9c]),
  "deflate-raw": Buffer.alloc(0),
  br: Buffer.alloc(0),
};
/**
 * Decompression bombs, made once: FIGURES.oversizedBytes (64 MiB; 256 MiB in the full
 * form) of zeros under each zlib coding, the same as zstd RLE blocks, and 8 frames of
 * 8 MiB of text (zstd, compressed blocks, sizes not declared: only the decoder can tell).
 */
const BOMB_BYTES = FIGURES.oversizedBytes;
const BOMBS: { coding: string; body: Buffer }[] = (() => {
  const zeros = Buffer.alloc(BOMB_BYTES);
  return [
    { coding: "gzip", body: zlib.gzipSync(zeros, { level: 1 }) },
    { coding: "deflate", body: zlib.deflateSync(zeros, { level: 1 }) },
    { coding: "br", body: zlib.brotliCompressSync(zeros, { params: { [zlib.constants.BROTLI_PARAM_QUALITY]: 1 } }) },
    { coding: "zstd", body: zstdZeros(BOMB_BYTES) },
    { coding: "zstd", body: Buffer.concat(Array.from({ length: 8 }, () => TEXT_BOMB_ZSTD)) },
  ];
})();

const coding = fc.constantFrom(...CODINGS);
const compressedBad: fc.Arbitrary<{ what: string; encoding: string; body: Buffer }> = fc.oneof(
  // Random bytes under a coding, bare or behind its magic bytes.
  fc.record({ c: coding, bytes: fc.uint8Array({ maxLength: 400 }), magic: fc.boolean() }).map(({ c, bytes, magic }) => ({
    what: "random-bytes",
    encoding: headerOf(c),
    body: Buffer.concat([magic ? MAGIC[c] : Buffer.alloc(0), Buffer.from(bytes)]),
  })),
  // A bad request, validly compressed: the JSON / envelope 422s behind the decoder.
  { weight: 2, arbitrary: fc.record({ c: coding, b: badBody }).map(({ c, b }) => ({ what: "compressed-bad-body", encoding: headerOf(c), body: compress(c, Buffer.from(b.body)) })) },
  // A valid request, validly compressed, cut short (at least one byte gone).
  fc.record({ c: coding, cut: fc.double({ min: 0, max: 1, noNaN: true, maxExcluded: true }) }).map(({ c, cut }) => {
    const full = compress(c, Buffer.from(validText()));
    return { what: "truncated", encoding: headerOf(c), body: full.subarray(0, Math.floor(cut * full.length)) };
  }),
  // A valid request compressed one way and labelled another (or identity).
  fc
    .tuple(coding, fc.constantFrom("zstd", "gzip", "deflate", "br", "identity"))
    .filter(([a, b]) => headerOf(a) !== b)
    .map(([a, b]) => ({ what: "mismatched", encoding: b, body: compress(a, Buffer.from(validText())) })),
  // Bombs.
  fc.constantFrom(...BOMBS).map((b) => ({ what: "bomb", encoding: b.coding, body: b.body })),
  // Stacked codings (the valid request under two, undone in the wrong order, or three) and unknown ones.
  fc.constantFrom(
    { encoding: "br, gzip", body: zlib.brotliCompressSync(zlib.gzipSync(validText())) },
    { encoding: "gzip, gzip, gzip", body: zlib.gzipSync(zlib.gzipSync(zlib.gzipSync(validText()))) },
    { encoding: "compress", body: Buffer.from(validText()) },
    { encoding: "zstd;q=1", body: compress("zstd", Buffer.from(validText())) },
    { encoding: "lz4", body: Buffer.from(validText()) },
  ).map((c) => ({ what: "stacked-or-unknown", ...c })),
);

const URLS = ["/v1/systemone", "/v1/judge/systemone", "/v1/nimble/systemone"];
const url = fc.constantFrom(...URLS);
const auth = () => ({ authorization: `Bearer ${key}` });

/** A request wrong in at least one way: the body, the content type, the encoding, the key, the method or the path. */
const badRequest: fc.Arbitrary<Case> = fc.oneof(
  { weight: 6, arbitrary: fc.record({ url, ct: goodContentType, b: badBody, x: extraHeaders }).map(({ url, ct, b, x }) => ({ what: `body:${b.what}`, method: "POST" as const, url, headers: { ...x, ...auth(), "content-type": ct }, body: b.body })) },
  { weight: 2, arbitrary: fc.record({ url, ct: badContentType, x: extraHeaders, valid: fc.boolean() }).map(({ url, ct, x, valid }) => ({ what: "content-type", method: "POST" as const, url, headers: { ...x, ...auth(), "content-type": ct }, body: valid ? validText() : "{}" })) },
  { weight: 1, arbitrary: fc.record({ url, x: extraHeaders }).map(({ url, x }) => ({ what: "no-content-type", method: "POST" as const, url, headers: { ...x, ...auth() }, body: undefined })) },
  { weight: 1, arbitrary: fc.record({ url, enc: fc.constantFrom("gzip", "br", "deflate", "zstd", "compress", "x-gzip", "gzip, identity") }).map(({ url, enc }) => ({ what: "content-encoding", method: "POST" as const, url, headers: { ...auth(), "content-type": "application/json", "content-encoding": enc }, body: validText() })) },
  { weight: 4, arbitrary: fc.record({ url, c: compressedBad, x: extraHeaders }).map(({ url, c, x }) => ({ what: `encoding:${c.what}`, method: "POST" as const, url, headers: { ...x, ...auth(), "content-type": "application/json", "content-encoding": c.encoding }, body: c.body })) },
  { weight: 2, arbitrary: fc.record({ url, a: badAuth, x: extraHeaders }).map(({ url, a, x }) => ({ what: "auth", method: "POST" as const, url, headers: { ...x, "content-type": "application/json", ...(a === undefined ? {} : { authorization: a }) }, body: validText() })) },
  { weight: 1, arbitrary: fc.record({ url, m: fc.constantFrom("GET" as const, "PUT" as const) }).map(({ url, m }) => ({ what: "method", method: m, url, headers: { ...auth(), "content-type": "application/json" }, body: m === "PUT" ? validText() : undefined })) },
  { weight: 1, arbitrary: fc.stringMatching(/^\/[a-zA-Z0-9/_.%-]{0,40}$/).filter((p) => !URLS.includes(p) && !p.startsWith("/docs") && !p.startsWith("/__")).map((p) => ({ what: "path", method: "POST" as const, url: p, headers: { ...auth(), "content-type": "application/json" }, body: validText() })) },
  { weight: 1, arbitrary: fc.integer({ min: 1, max: 64 * 1024 }).map((extra) => ({ what: "oversize", method: "POST" as const, url: "/v1/systemone", headers: { ...auth(), "content-type": "application/json" }, body: `{"state":"${"x".repeat(1024 * 1024 + extra)}"}` })) },
);

describe(`fuzzing bodies, headers and content types (${FORM} form: ${FIGURES.fuzzCases} cases)`, () => {
  it("every case is a 4xx with a detail and the request id; never a 5xx or a crash; nothing is charged", async () => {
    const statuses = new Map<string, number>();
    const kinds = new Map<string, number>();
    const t0 = performance.now();
    await fc.assert(
      fc.asyncProperty(badRequest, async (c) => {
        for (const m of Object.values(c.headers).join(" ").matchAll(/sk-assay-[A-Za-z0-9_-]{43}/g)) sentKeys.add(m[0]);
        const res = await app.inject({
          method: c.method,
          url: c.url,
          headers: c.headers,
          ...(c.body !== undefined ? { payload: c.body } : {}),
        });
        statuses.set(String(res.statusCode), (statuses.get(String(res.statusCode)) ?? 0) + 1);
        kinds.set(c.what, (kinds.get(c.what) ?? 0) + 1);
        const where = `${c.what} ${c.method} ${c.url} → ${res.statusCode} ${res.body.slice(0, 300)}`;
        expect(res.statusCode, where).toBeGreaterThanOrEqual(400);
        expect(res.statusCode, where).toBeLessThan(500);
        const body = JSON.parse(res.body) as { detail?: unknown; request_id?: unknown };
        expect(Object.keys(body).sort(), where).toEqual(["detail", "request_id"]);
        expect(detailMessage(body.detail).length > 0 && typeof body.detail === "object", where).toBe(true);
        expect(body.request_id).toBe(res.headers["x-request-id"]);
        expect(res.headers["x-sdk-request-id"]).toBe(body.request_id);
      }),
      { numRuns: FIGURES.fuzzCases, endOnFailure: true },
    );
    const seconds = (performance.now() - t0) / 1000;

    // Nothing was charged, and nothing is held.
    const ledger = accounts.ledger(orgId);
    expect(ledger.filter((e) => e.kind === "settle")).toEqual([]);
    expect(accounts.balance(orgId, Date.now())).toMatchObject({ creditMicro: 1_000_000, heldMicro: 0 });
    const audit = accounts.audit(orgId);
    expect(audit.derived).toEqual(audit.kept);
    // The engine is unharmed: a valid request is still answered.
    const ok = await app.inject({ method: "POST", url: "/v1/systemone", headers: auth(), payload: VALID });
    expect(ok.statusCode, ok.body).toBe(200);
    // No credential it was sent, valid or not, reached the log.
    expectNoSecrets(logs, [...sentKeys]);
    recordFigures("fuzz", {
      cases: FIGURES.fuzzCases,
      seconds: Math.round(seconds),
      statuses: Object.fromEntries([...statuses].sort()),
      kinds: Object.fromEntries([...kinds].sort()),
      keysSearchedInLog: sentKeys.size,
    });
  }, 1_800_000);

  it("every bomb is 413 and every coding's random bytes 422, by name; nothing charged", async () => {
    const settled = () => accounts.ledger(orgId).filter((e) => e.kind === "settle").length;
    const [settledBefore, creditBefore] = [settled(), accounts.balance(orgId, Date.now()).creditMicro];
    const post = (encoding: string, body: Buffer) =>
      app.inject({ method: "POST", url: "/v1/systemone", headers: { ...auth(), "content-type": "application/json", "content-encoding": encoding }, payload: body });
    for (const bomb of BOMBS) {
      const res = await post(bomb.coding, bomb.body);
      expect(res.statusCode, `${bomb.coding} bomb of ${bomb.body.length} bytes: ${res.body}`).toBe(413);
      expect(detailMessage(JSON.parse(res.body).detail)).toMatch(new RegExp(`once decoded \\(Content-Encoding ${bomb.coding}\\)`));
    }
    const noise = Buffer.from(Array.from({ length: 300 }, (_, i) => (i * 131 + 17) & 0xff));
    for (const c of CODINGS) {
      const res = await post(headerOf(c), Buffer.concat([MAGIC[c], noise]));
      expect(res.statusCode, `${c}: ${res.body}`).toBe(422);
      expect(detailMessage(JSON.parse(res.body).detail)).toMatch(new RegExp(`could not be decoded as ${headerOf(c)}`));
    }
    expect(settled()).toBe(settledBefore);
    expect(accounts.balance(orgId, Date.now())).toMatchObject({ creditMicro: creditBefore, heldMicro: 0 });
  });

  // Found by this suite: a state nested ~10,000 deep (40 KB) made JSON.stringify overflow the stack → 500.
  it("a deeply nested JSON state, otherwise valid, is refused with 422 (not a 500) past 512 levels; 512 levels are answered", async () => {
    const send = (state: string) =>
      app.inject({
        method: "POST",
        url: "/v1/systemone",
        headers: { ...auth(), "content-type": "application/json" },
        payload: `{"state":${state},"questions":{"q":{"type":"noul","instructions":"Is it empty?"}}}`,
      });
    for (const depth of [513, 10_000, 400_000]) {
      const res = await send("[".repeat(depth) + "]".repeat(depth));
      expect(res.statusCode, `depth ${depth}: ${res.body.slice(0, 300)}`).toBe(422);
      expect(detailMessage(JSON.parse(res.body).detail)).toMatch(/state: a JSON state may nest objects and arrays at most 512 levels deep/);
      const d = Math.min(depth, 150_000); // 6 bytes a level: stays under 1 MiB
      const objects = await send('{"a":'.repeat(d) + "1" + "}".repeat(d));
      expect(objects.statusCode, `objects, depth ${depth}`).toBe(422);
    }
    const ok = await send("[".repeat(512) + "]".repeat(512));
    expect(ok.statusCode, ok.body.slice(0, 300)).toBe(200);
  });
});

describe("a body over 1 MiB, over a real socket", () => {
  let server: ServerProcess | null = null;
  let serverKey: string;
  let serverDir: string;

  beforeAll(async () => {
    serverDir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-reliability-413-"));
    const store = new SqliteAccountsStore(serverDir, { startingGrantMicro: 1_000_000 });
    serverKey = store.createKey("big").key;
    store.close();
    server = await ServerProcess.start({ ...smallDeployment(), ASSAY_DATA_DIR: serverDir });
  });

  afterAll(async () => {
    await server?.stop();
    if (server) expectNoSecrets(server.output, [serverKey]);
    fs.rmSync(serverDir, { recursive: true, force: true });
  });

  /** Stream `total` bytes of a JSON-looking body in 64 KiB chunks; resolve with the status and how much was written. */
  function upload(total: number, headers: Record<string, string>): Promise<{ status: number | null; written: number; detail: unknown }> {
    return new Promise((resolve) => {
      const req = http.request(`${server!.url}/v1/systemone`, {
        method: "POST",
        headers: { authorization: `Bearer ${serverKey}`, "content-type": "application/json", ...headers },
      });
      let written = 0;
      let status: number | null = null;
      let detail: unknown = null;
      let finished = false;
      const finish = () => {
        if (finished) return;
        finished = true;
        resolve({ status, written, detail });
      };
      req.on("response", (res) => {
        status = res.statusCode ?? null;
        let text = "";
        res.on("data", (d: Buffer) => (text += d.toString()));
        res.on("end", () => {
          try {
            detail = JSON.parse(text).detail;
          } catch {
            detail = text;
          }
          req.destroy();
          finish();
        });
      });
      req.on("error", () => finish()); // the server closed the socket on us: also a refusal
      req.on("close", () => setTimeout(finish, 50));
      const chunk = Buffer.alloc(64 * 1024, "x");
      const pump = () => {
        while (written < total && status === null && !req.destroyed) {
          const piece = written === 0 ? Buffer.concat([Buffer.from('{"state":"'), chunk.subarray(10)]) : chunk;
          written += piece.length;
          if (!req.write(piece)) {
            req.once("drain", pump);
            return;
          }
        }
        if (written >= total && status === null) req.end();
      };
      // total 0: only the headers go out, and the server answers from them.
      if (total === 0) req.flushHeaders();
      else pump();
    });
  }

  it("a chunked upload is answered 413 (or cut off) long before it ends, and the server's peak memory does not grow by its size", async () => {
    const s = server!;
    // The server's resident memory, sampled through the upload (its all-time peak is the model load, so VmHWM would hide a buffered body).
    const before = s.rssBytes();
    let highest = before;
    const sampler = setInterval(() => (highest = Math.max(highest, s.rssBytes())), 5);
    const total = FIGURES.oversizedBytes;
    const r = await upload(total, {}); // no Content-Length: Transfer-Encoding: chunked
    clearInterval(sampler);
    highest = Math.max(highest, s.rssBytes());
    const grew = highest - before;
    expect(s.alive).toBe(true);
    if (r.status !== null) {
      expect(r.status).toBe(413);
      expect(detailMessage(r.detail)).toMatch(/larger than 1 MiB/);
    }
    // Whether or not the reply reached us before the socket was cut, the server logged its 413.
    await until(() => /"path":"\/v1\/systemone","status":413/.test(s.output), "the 413 in the server's log", { ms: 10_000 });
    // The server stopped taking the body: far less than all of it went out.
    expect(r.written).toBeLessThan(total / 2);
    expect(grew).toBeLessThan(total / 4);

    // Declared too large: 413 from the header alone, before a byte of the body is sent.
    const declared = await upload(0, { "content-length": String(total) });
    expect(declared.status).toBe(413);
    expect(declared.written).toBe(0);
    // And the server still serves.
    const ok = await fetch(`${s.url}/v1/systemone`, {
      method: "POST",
      headers: { authorization: `Bearer ${serverKey}`, "content-type": "application/json" },
      body: JSON.stringify(smallBody(0)),
    });
    expect(ok.status).toBe(200);
    recordFigures("oversized-body", { streamedMiB: total / 2 ** 20, status: r.status, writtenKiB: Math.round(r.written / 1024), rssGrowthMiB: Math.round((grew / 2 ** 20) * 10) / 10 });
  }, 300_000);

  it("a decompression bomb of the same size, sent compressed under each coding, is 413 and the server's memory does not grow by its size", async () => {
    const s = server!;
    const before = s.rssBytes();
    let highest = before;
    const sampler = setInterval(() => (highest = Math.max(highest, s.rssBytes())), 5);
    const statuses: Record<string, number> = {};
    for (const bomb of BOMBS) {
      const res = await fetch(`${s.url}/v1/systemone`, {
        method: "POST",
        headers: { authorization: `Bearer ${serverKey}`, "content-type": "application/json", "content-encoding": bomb.coding },
        body: new Uint8Array(bomb.body),
      });
      const body = (await res.json()) as { detail: unknown };
      expect(res.status, `${bomb.coding}: ${detailMessage(body.detail)}`).toBe(413);
      expect(detailMessage(body.detail)).toMatch(/once decoded/);
      statuses[`${bomb.coding}:${bomb.body.length}B`] = res.status;
    }
    clearInterval(sampler);
    highest = Math.max(highest, s.rssBytes());
    const grew = highest - before;
    expect(s.alive).toBe(true);
    expect(grew).toBeLessThan(BOMB_BYTES / 4);
    recordFigures("compressed-bombs", { decodedMiB: BOMB_BYTES / 2 ** 20, statuses, rssGrowthMiB: Math.round((grew / 2 ** 20) * 10) / 10 });
  }, 300_000);
});
