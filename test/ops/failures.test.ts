/**
 * Overload and failure semantics on the real model (EnginePipeline, the
 * default export), through the real app: 529 queue full, 504 deadline with
 * the queued task dropped, 502 when the worker throws or dies (and is
 * replaced), 503 while starting and while draining — none of them charged.
 *
 * The lane is held busy deterministically with the pool's test-only `stall`
 * fault (ASSAY_TEST_FAULTS=1): the stalled task waits on an Atomics flag in
 * the worker until the test releases it. No sleeps decide an outcome.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { StartingPipeline } from "../../src/http/starting.js";
import { testHooks } from "../../src/inference/test-hooks.js";
import { metrics } from "../../src/observability/metrics.js";
import type { EnginePipeline } from "../../src/pipeline/index.js";
import { expectSpecError } from "../http/assertions.js";
import { smallDeployment } from "../engine/engine.js";
import { body, makeOpsApp, startFaultyEngine, until, type OpsApp } from "./helpers.js";

let engine: EnginePipeline;
let t: OpsApp | null = null;
/** The stall armed by the running test: released after it whatever happens, so a failure cannot block the next test. */
let stalled: (() => void) | null = null;
const stall = () => {
  stalled = testHooks(engine.pool).injectFaultForTest("stall");
  return stalled;
};

beforeAll(async () => {
  engine = await startFaultyEngine(smallDeployment()); // ASSAY_QUEUE_MAX=1: one running + one waiting per lane
});
afterAll(async () => {
  await engine?.close();
});
afterEach(async () => {
  stalled?.();
  stalled = null;
  // A worker that died reloads both builds first: several seconds on a loaded machine.
  await until(() => engine.pool.running === 0 && engine.pool.queued === 0, "the lane to be idle", { ms: 60_000 });
  await t?.close();
  t = null;
});

const post = (payload: object = body(), headers: Record<string, string> = {}) =>
  t!.app.inject({ method: "POST", url: "/v1/systemone", headers: { authorization: `Bearer ${t!.key}`, ...headers }, payload });
const kinds = () => t!.accounts.ledger(t!.orgId).map((e) => [e.kind, e.note]);
const balance = () => t!.accounts.balance(t!.orgId, Date.now());

describe("529 when the inference queue is full", () => {
  it("is answered at once with Retry-After, not charged; the queued requests then succeed", async () => {
    t = await makeOpsApp(engine);
    const release = stall();
    const a = post(body("first"));
    await until(() => engine.pool.running === 1, "the first request to reach the worker", { pending: a });
    const b = post(body("second"));
    await until(() => engine.pool.queued === 1, "the second request to queue", { pending: b });
    const c = await post(body("third"));
    const detail = expectSpecError(c, 529);
    expect(detail).toMatch(/busy.*queue is full/);
    // The work ahead in whole seconds, at least 1: one on an idle machine, more on a loaded one.
    const retry = c.headers["retry-after"];
    expect(retry).toMatch(/^[1-9]\d*$/);
    expect(detail).toContain(`retry after about ${retry} second`);
    expect(c.json().request_id).toBe(c.headers["x-request-id"]);
    release();
    const [ra, rb] = await Promise.all([a, b]);
    expect(ra.statusCode, ra.body).toBe(200);
    expect(rb.statusCode, rb.body).toBe(200);
    // The 529 was refused by the work admission before any hold: charged are exactly the two answers.
    const entries = t.accounts.ledger(t.orgId);
    expect(entries.filter((e) => e.kind === "hold")).toHaveLength(2);
    expect(entries.filter((e) => e.kind === "release")).toEqual([]);
    const settled = entries.filter((e) => e.kind === "settle");
    expect(settled.map((e) => e.requestId).sort()).toEqual([ra.headers["x-request-id"], rb.headers["x-request-id"]].sort());
    expect(balance().creditMicro).toBe(1_000_000 - settled.reduce((s, e) => s + e.amountMicro, 0));
    expect(balance().heldMicro).toBe(0);
  });
});

describe("504 when a request exceeds its deadline", () => {
  it("the queued task is dropped at once, the running one is cut loose; nothing is charged; the lane recovers", async () => {
    // The cap keeps the deadline fixed (a slow machine's estimate for these small requests would raise it).
    // At least 6 s, and whole seconds with room for twice the queued request's estimated finish (the
    // stalled one's work and its own, at the headroom admission uses now): on a loaded 2-core machine a
    // fixed 6 s left the second request refused with 529 instead of queued.
    const finish = engine.pool.safety() * (engine.estimateGeneralMs(body("stalled in the worker")) + engine.estimateGeneralMs(body("waiting in the queue")));
    const deadline = Math.max(6000, Math.ceil((2 * finish) / 1000) * 1000);
    t = await makeOpsApp(engine, { ASSAY_REQUEST_TIMEOUT_MS: String(deadline), ASSAY_REQUEST_TIMEOUT_MAX_MS: String(deadline) });
    const release = stall();
    const a = post(body("stalled in the worker"));
    await until(() => engine.pool.running === 1, "the first request to reach the worker", { pending: a });
    const b = post(body("waiting in the queue"));
    await until(() => engine.pool.queued === 1, "the second request to queue", { pending: b });
    const [ra, rb] = await Promise.all([a, b]);
    for (const r of [ra, rb]) {
      expect(expectSpecError(r, 504)).toMatch(
        new RegExp(`exceeded its deadline of ${deadline / 1000} s \\(ASSAY_REQUEST_TIMEOUT_MS\\); its queued work was cancelled`),
      );
      expect(r.headers["retry-after"]).toBeUndefined();
      expect(r.headers["x-total-time"]).toMatch(/^\d+\.\d$/);
    }
    // The waiting task never reached the worker: it was dropped from the queue.
    expect(engine.pool.queued).toBe(0);
    expect(engine.pool.running).toBe(1);
    release();
    await until(() => t!.lifecycle.inFlightCount === 0, "both requests to release their holds");
    expect(kinds()).toEqual([
      ["grant", "starting grant"],
      ["hold", null],
      ["hold", null],
      ["release", "error 504 TIMEOUT"],
      ["release", "error 504 TIMEOUT"],
    ]);
    expect(balance()).toMatchObject({ creditMicro: 1_000_000, heldMicro: 0 });
    // The lane serves again (under the default deadline: a loaded machine may need more than 2.5 s).
    await t.close();
    t = await makeOpsApp(engine);
    const ok = await post();
    expect(ok.statusCode, ok.body).toBe(200);
  });
});

describe("502 when the model fails", () => {
  it("a worker that throws: 502 with a detail, not charged, the next request succeeds", async () => {
    t = await makeOpsApp(engine);
    testHooks(engine.pool).injectFaultForTest("throw");
    const res = await post();
    expect(expectSpecError(res, 502)).toMatch(/the model failed: injected test fault/);
    expect(kinds().at(-1)).toEqual(["release", "error 502 MODEL_FAILED"]);
    expect((await post()).statusCode).toBe(200);
  });

  it("a worker that dies mid-request is replaced: 502, not charged, restart counted, healthy again within seconds", async () => {
    t = await makeOpsApp(engine);
    const restartsBefore = engine.pool.restarts;
    const metricBefore = (await metrics.workerRestarts.get()).values[0]?.value ?? 0;
    const baseline = await post();
    expect(baseline.statusCode).toBe(200);
    testHooks(engine.pool).injectFaultForTest("exit");
    const res = await post();
    expect(expectSpecError(res, 502)).toMatch(/worker failed and was restarted: worker exited with code: 70/);
    expect(engine.pool.restarts).toBe(restartsBefore + 1);
    expect((await metrics.workerRestarts.get()).values[0]?.value).toBe(metricBefore + 1);
    expect(kinds().at(-1)).toEqual(["release", "error 502 MODEL_FAILED"]);
    const charged = t.accounts.ledger(t.orgId).filter((e) => e.kind === "settle").reduce((s, e) => s + e.amountMicro, 0);
    expect(balance()).toMatchObject({ creditMicro: 1_000_000 - charged, heldMicro: 0 });
    // The replacement thread reloads the model before it takes the next request. Admission counts that
    // reload at the loads it timed at boot, not at the size-based prior (3–5× too long: a CI run refused
    // this request with 529 on it).
    const loadSeconds = (await metrics.buildLoadSeconds.get()).values;
    expect(loadSeconds.length).toBeGreaterThan(0);
    for (const v of loadSeconds) expect(v.value).toBeGreaterThan(0);
    const t0 = performance.now();
    const next = await post();
    const seconds = (performance.now() - t0) / 1000;
    console.log(`[ops] first request after the worker died: ${next.statusCode} in ${seconds.toFixed(2)} s`);
    expect(next.statusCode, next.body).toBe(200);
    // "Healthy again within 5 s": 3.1–3.6 s on an idle 2-core machine, most of it the model reload,
    // 6.2 and 8.9 s under other test runs' load. A printed figure, not a timed assertion (issue 17):
    // the restart counter above and this 200 are the events that show the recovery.
    // The reloaded model gives the same answers as before the crash.
    const before = baseline.json().answers;
    const after = next.json().answers;
    expect(after.late.noul).toBeCloseTo(before.late.noul, 4);
    expect(after.topic.probabilities.delivery).toBeCloseTo(before.topic.probabilities.delivery, 4);
  });
});

describe("503 while the model is starting", () => {
  it("answers 503 MODEL_STARTING with Retry-After, readiness not ready, no charge; then serves once attached", async () => {
    const starting = new StartingPipeline(() => engine.listModels().map((m) => ({ ...m, ready: false })));
    t = await makeOpsApp(starting);
    const res = await post();
    expect(expectSpecError(res, 503)).toMatch(/model is starting/);
    expect(res.headers["retry-after"]).toBe("5");
    const ready = await t.app.inject({ method: "GET", url: "/readyz" });
    expectSpecError(ready, 503);
    expect(ready.headers["retry-after"]).toBe("5");
    expect((await t.app.inject({ method: "GET", url: "/healthz" })).statusCode).toBe(200);
    expect((await t.app.inject({ method: "GET", url: "/health" })).json()).toMatchObject({ status: "unavailable" });
    expect(kinds()).toEqual([["grant", "starting grant"]]);

    starting.attach(engine);
    expect((await t.app.inject({ method: "GET", url: "/readyz" })).statusCode).toBe(200);
    expect((await t.app.inject({ method: "GET", url: "/health" })).json()).toMatchObject({ status: "ok" });
    const ok = await post();
    expect(ok.statusCode, ok.body).toBe(200);
  });
});

describe("422 while the model is starting, for what the model would refuse", () => {
  it("tells a malformed request why now, with the words it gets once the model is up, and charges nothing", async () => {
    const starting = new StartingPipeline(() => engine.listModels().map((m) => ({ ...m, ready: false })));
    t = await makeOpsApp(starting);
    const bad: [object, string][] = [
      [{ ...body(), model: "judge-nothing" }, 'model: unknown model "judge-nothing"; available models: '],
      [{ ...body(), questions: { q: { type: "choice", criteria: { only: null } } } }, "questions.q.criteria: a choice question needs 2 to 255 options"],
      [{ ...body(), model: "judge-factcheck-lite", questions: { a: { type: "noul" } } }, "questions.a.instructions: a fact check question needs its claim in `instructions`"],
      [{ model: "judge-codegrep-lite", state: { query: "q", items: [] }, questions: { q0: { type: "noul" } } }, 'questions.q0: no item "n0" in state.items'],
    ];
    const details = async () => {
      const out: string[] = [];
      for (const [payload, expected] of bad) {
        const d = expectSpecError(await post(payload), 422) as string;
        expect(d.startsWith(expected), d).toBe(true);
        out.push(d);
      }
      return out;
    };
    const before = await details();
    expect(kinds()).toEqual([["grant", "starting grant"]]);
    expect(expectSpecError(await post(), 503)).toMatch(/model is starting/);
    starting.attach(engine);
    expect(await details()).toEqual(before);
    expect(kinds()).toEqual([["grant", "starting grant"]]);
  });
});

describe("503 while draining", () => {
  it("new requests get 503 + Retry-After at once; in-flight ones past the drain deadline are cancelled (503), not charged", async () => {
    t = await makeOpsApp(engine);
    const release = stall();
    const a = post(body("in flight at shutdown"));
    await until(() => engine.pool.running === 1, "the request to reach the worker", { pending: a });
    const drained = t.lifecycle.drain(300, 10_000);
    const refused = await post();
    expect(expectSpecError(refused, 503)).toMatch(/shutting down/);
    expect(refused.headers["retry-after"]).toBe("1");
    expect(refused.headers["connection"]).toBe("close");
    expect(expectSpecError(await t.app.inject({ method: "GET", url: "/readyz" }), 503)).toMatch(/shutting down/);
    expect((await t.app.inject({ method: "GET", url: "/healthz" })).statusCode).toBe(200);
    const ra = await a;
    expect(expectSpecError(ra, 503)).toMatch(/shut down before the request finished/);
    release();
    expect(await drained).toEqual({ cancelled: 1, stuck: 0 });
    expect(kinds()).toEqual([
      ["grant", "starting grant"],
      ["hold", null],
      ["release", "error 503 UNAVAILABLE"],
    ]);
    expect(balance()).toMatchObject({ creditMicro: 1_000_000, heldMicro: 0 });
  });
});
