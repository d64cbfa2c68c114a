/**
 * Observability on the real model: Prometheus /metrics, the per-request
 * timing headers (one Timings object feeds both), the JSON request log with
 * request id and organization and no credential in it, and /docs (the
 * document itself is checked against the routes in test/http/openapi.test.ts).
 */
import { Writable } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createLogger } from "../../src/observability/logger.js";
import type { EnginePipeline } from "../../src/pipeline/index.js";
import { smallDeployment } from "../engine/engine.js";
import { body, makeOpsApp, sample, startFaultyEngine, type OpsApp } from "./helpers.js";

let engine: EnginePipeline;
let t: OpsApp;
const lines: string[] = [];

beforeAll(async () => {
  engine = await startFaultyEngine(smallDeployment());
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      lines.push(...chunk.toString("utf8").split("\n").filter((l) => l.length > 0));
      done();
    },
  });
  t = await makeOpsApp(engine, {}, { logger: createLogger("debug", sink) });
});
afterAll(async () => {
  await t?.close();
  await engine?.close();
});

const post = (payload: object, headers: Record<string, string>) =>
  t.app.inject({ method: "POST", url: "/v1/systemone", headers, payload });
const scrape = async () => (await t.app.inject({ method: "GET", url: "/metrics" })).body;

describe("/metrics", () => {
  it("counts requests by model and status, stage latencies, tokens, holds and charges, queue depth and restarts", async () => {
    const before = await scrape();
    const ok = await post(body(), { authorization: `Bearer ${t.key}` });
    expect(ok.statusCode, ok.body).toBe(200);
    const bad = await post({ model: "judge-latest", state: "x", questions: { q: { type: "noul", bogus: 1 } } }, { authorization: `Bearer ${t.key}` });
    expect(bad.statusCode).toBe(422);
    const after = await scrape();
    const delta = (name: string, labels: Record<string, string> = {}) => sample(after, name, labels) - sample(before, name, labels);

    expect(delta("assay_requests_total", { model: "judge-latest", status: "200" })).toBe(1);
    expect(delta("assay_requests_total", { model: "judge-latest", status: "422" })).toBe(1);
    for (const stage of ["queue", "tokenize", "inference", "total"]) {
      expect(delta("assay_request_stage_seconds_count", { stage }), stage).toBeGreaterThanOrEqual(1);
    }
    const tokens: number = ok.json().usage.input_tokens;
    expect(delta("assay_input_tokens_total", { model: "judge-latest" })).toBe(tokens);
    expect(delta("assay_credit_holds_total", { event: "placed" })).toBe(1);
    expect(delta("assay_credit_holds_total", { event: "settled" })).toBe(1);
    const charged = t.accounts.ledger(t.orgId).filter((e) => e.kind === "settle").reduce((s, e) => s + e.amountMicro, 0);
    expect(charged).toBeGreaterThan(0);
    expect(delta("assay_credit_charged_micro_usd_total", { model: "judge-latest" })).toBe(charged);
    expect(after).toMatch(/^assay_inference_queue_depth 0$/m);
    expect(after).toMatch(/^# TYPE assay_worker_restarts_total counter$/m);
    expect(after).toMatch(/^assay_requests_in_flight 0$/m);
    expect(after).toMatch(/^assay_process_resident_memory_bytes \d+/m);
  });
});

describe("timing headers", () => {
  it("x-<stage>-time for every stage and server-timing, from the same Timings object", async () => {
    const res = await post(body(), { authorization: `Bearer ${t.key}` });
    expect(res.statusCode).toBe(200);
    const ms = (h: string) => Number(res.headers[h]);
    for (const h of ["x-auth-time", "x-admission-time", "x-validate-time", "x-prompt-time", "x-tokenize-time", "x-queue-time", "x-inference-time", "x-probability-time", "x-total-time"]) {
      expect(res.headers[h], h).toMatch(/^\d+\.\d$/);
    }
    expect(ms("x-inference-time")).toBeGreaterThan(0);
    expect(ms("x-total-time")).toBeGreaterThanOrEqual(ms("x-inference-time"));
    const st = String(res.headers["server-timing"]);
    expect(st).toContain(`inference;dur=${res.headers["x-inference-time"]}`);
    expect(st).toContain(`queue;dur=${res.headers["x-queue-time"]}`);
    console.log(`[ops] timing headers: ${st}`);
  });
});

describe("structured logs", () => {
  it("one JSON line per request with request id and organization; no key or authorization value ever appears", async () => {
    const start = lines.length;
    const res = await post(body(), { authorization: `Bearer ${t.key}`, "x-request-id": "log-test-1" });
    expect(res.statusCode).toBe(200);
    // The bespokelabs client's header, and a wrong key: neither may be logged either.
    const viaApiKey = await post(body(), { api_key: t.key, "x-request-id": "log-test-2" });
    expect(viaApiKey.statusCode, viaApiKey.body).toBe(200);
    const wrongKey = "sk-assay-" + "W".repeat(43);
    expect((await post(body(), { authorization: `Bearer ${wrongKey}`, "x-request-id": "log-test-3" })).statusCode).toBe(401);
    const mine = lines.slice(start).map((l) => JSON.parse(l) as Record<string, unknown>);
    expect(mine.length).toBeGreaterThan(0);

    const done = mine.find((l) => l.reqId === "log-test-1" && l.msg === "request completed");
    expect(done).toMatchObject({ level: "info", org: "acme", orgId: t.orgId, status: 200, model: "judge-latest", path: "/v1/systemone" });
    expect((done as { timings: Record<string, number> }).timings.inference).toBeGreaterThan(0);
    expect(mine.find((l) => l.reqId === "log-test-2" && l.msg === "request completed")).toMatchObject({ org: "acme", status: 200 });
    expect(mine.find((l) => l.reqId === "log-test-3" && l.msg === "request completed")).toMatchObject({ status: 401 });

    const text = lines.slice(start).join("\n");
    expect(text).not.toContain(t.key);
    expect(text).not.toContain(t.key.slice(9));
    expect(text).not.toContain(wrongKey.slice(9));
    expect(text).not.toMatch(/bearer/i);
  });

  it("redacts credential headers wherever a log object carries them", () => {
    const out: string[] = [];
    const log = createLogger("info", new Writable({ write: (c: Buffer, _e, d) => (out.push(c.toString()), d()) }));
    log.info({ req: { headers: { authorization: `Bearer ${t.key}`, api_key: t.key } }, headers: { authorization: "Bearer x" } }, "x");
    expect(out.join("")).not.toContain(t.key);
    expect(out.join("")).not.toMatch(/bearer/i);
    expect(out.join("")).toContain("[redacted]");
  });
});

describe("OpenAPI", () => {
  it("/docs renders the document (Swagger UI)", async () => {
    const page = await t.app.inject({ method: "GET", url: "/docs/" });
    expect(page.statusCode).toBe(200);
    expect(page.headers["content-type"]).toMatch(/text\/html/);
    expect(page.body).toMatch(/swagger/i);
    const json = await t.app.inject({ method: "GET", url: "/docs/json" });
    expect(json.json().paths["/v1/systemone"]).toBeDefined();
  });
});
