/**
 * Admission by estimated work, deadlines by work, fair queues and
 * cancellation, on the real engine behind the real app. The lane is held busy
 * with the pool's test-only `stall` fault; what a test needs to be refused is
 * derived from the engine's own live estimate, so no outcome depends on how
 * fast this machine is, nor on which build reads: the small deployment
 * (test/engine/engine.ts, every name on the 0.5B), whose passes are about a
 * third as long on 2 cores as the 1.5B's. Little model work runs: refused
 * and cancelled requests never reach the worker.
 */
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { testHooks } from "../../src/inference/test-hooks.js";
import { DEADLINE_MARGIN } from "../../src/inference/work.js";
import type { EnginePipeline } from "../../src/pipeline/index.js";
import { expectSpecError } from "../http/assertions.js";
import { smallDeployment } from "../engine/engine.js";
import { makeOpsApp, sample, startFaultyEngine, until, type OpsApp } from "./helpers.js";

let engine: EnginePipeline;
let t: OpsApp | null = null;
let stalled: (() => void) | null = null;
const stall = () => {
  stalled = testHooks(engine.pool).injectFaultForTest("stall");
  return stalled;
};

beforeAll(async () => {
  // A queue bound well above what these tests queue: here the work decides.
  engine = await startFaultyEngine({ ...smallDeployment(), ASSAY_QUEUE_MAX: "64", ASSAY_MODEL_SCHEDULE: "never", ASSAY_MAX_PACKED_TOKENS: "512" });
});
afterAll(async () => {
  await engine?.close();
});
afterEach(async () => {
  stalled?.();
  stalled = null;
  await until(() => engine.pool.running === 0 && engine.pool.queued === 0, "the lane to be idle", { ms: 60_000 });
  if (t) await until(() => t!.lifecycle.inFlightCount === 0, "every request to release its hold", { ms: 60_000 });
  await t?.close();
  t = null;
});

const SHORT = "The parcel arrived two weeks late.";
/** A state of about `words` words: enough tokens that its estimate dwarfs a one-line request's. */
const longState = (words: number) =>
  Array.from({ length: words }, (_, i) => ["the", "parcel", "arrived", "late", "and", "the", "box", "was", "crushed"][i % 9]).join(" ");
const noul = (state: string) => ({ model: "judge-latest", state, questions: { late: { type: "noul", instructions: "The delivery was late." } } });

const post = (payload: object, key = t!.key, headers: Record<string, string> = {}) =>
  t!.app.inject({ method: "POST", url: "/v1/systemone", headers: { authorization: `Bearer ${key}`, ...headers }, payload });
const metricsText = async () => (await t!.app.inject({ method: "GET", url: "/metrics" })).body;

describe("529 by estimated work", () => {
  it("a request that would not finish by its deadline is refused at once: Retry-After, the wait and the deadline in the detail, no hold", async () => {
    const big = noul(longState(180));
    const est = engine.estimateGeneralMs(big);
    // Room for one such request behind the stalled one, not for two, at the headroom admission uses now
    // (above SAFETY after passes slowed by a loaded machine overran their estimates). The stalled
    // request's own estimate counts: on a loaded 2-core machine a one-line request's fixed cost per
    // pass made it 0.6 of the long one's, more than a deadline derived from the long one alone allowed.
    const deadline = Math.ceil(engine.pool.safety() * (engine.estimateGeneralMs(noul(SHORT)) + 1.5 * est));
    t = await makeOpsApp(engine, { ASSAY_REQUEST_TIMEOUT_MS: String(deadline), ASSAY_REQUEST_TIMEOUT_MAX_MS: String(deadline) });
    const refusedBefore = sample(await metricsText(), "assay_admission_refused_total", { reason: "deadline" });
    const release = stall();
    const a = post(noul(SHORT));
    await until(() => engine.pool.running === 1, "the first request to reach the worker", { pending: a });
    const b = post(big);
    await until(() => engine.pool.queued === 1, "the second request to queue", { pending: b });
    expect(engine.pool.pending().tokens).toBeGreaterThan(150);
    const c = await post(big);
    const detail = expectSpecError(c, 529);
    expect(detail).toMatch(/the model is busy: about \d+(\.\d)? s of queued work would run before this request finished/);
    expect(detail).toMatch(/needs about \d+(\.\d)? s; it would not finish within its deadline of \d+(\.\d)? s \(ASSAY_REQUEST_TIMEOUT_MS\)/);
    expect(detail).toContain("nothing was charged");
    expect(Number(c.headers["retry-after"])).toBeGreaterThanOrEqual(1);
    expect(Number.isInteger(Number(c.headers["retry-after"]))).toBe(true);
    expect(sample(await metricsText(), "assay_admission_refused_total", { reason: "deadline" })).toBe(refusedBefore + 1);
    // Refused before any hold: the ledger holds exactly the two admitted requests.
    expect(t.accounts.ledger(t.orgId).filter((e) => e.kind === "hold")).toHaveLength(2);
    // The admitted ones are cancelled by the drain, so nothing more runs here.
    const drained = t.lifecycle.drain(0, 10_000);
    release();
    const [ra, rb] = await Promise.all([a, b]);
    // The stalled one may have passed its own (short) deadline by now.
    expect([503, 504]).toContain(ra.statusCode);
    expect(rb.statusCode).toBe(503);
    expect(await drained).toMatchObject({ stuck: 0 });
    expect(t.accounts.ledger(t.orgId).filter((e) => e.kind === "settle")).toEqual([]);
    expect(t.accounts.balance(t.orgId, Date.now())).toMatchObject({ creditMicro: 1_000_000, heldMicro: 0 });
    expect(engine.pool.admitted).toBe(0);
  });
});

describe("deadlines by work", () => {
  it("a request whose own work needs more than the default deadline gets a later one, and is answered", async () => {
    const payload = noul(longState(120));
    const est = engine.estimateGeneralMs(payload);
    // A default deadline the request could never meet: without deadlines by work it would be a 504.
    const short = Math.max(20, Math.floor(est / 4));
    t = await makeOpsApp(engine, { ASSAY_REQUEST_TIMEOUT_MS: String(short) });
    const res = await post(payload);
    expect(res.statusCode, res.body).toBe(200);
    const given = Number(res.headers["x-deadline-time"]);
    expect(given).toBeGreaterThan(short);
    expect(given).toBeCloseTo(Math.ceil(est * DEADLINE_MARGIN), -2);
    expect(Number(res.headers["x-estimated-time"])).toBeGreaterThan(0);
    expect(Number(res.headers["x-total-time"])).toBeGreaterThan(short);
  });

  it("work beyond ASSAY_REQUEST_TIMEOUT_MAX_MS is refused up front with 422 naming it; no hold, nothing run", async () => {
    const payload = noul(longState(120));
    const est = engine.estimateGeneralMs(payload);
    const cap = Math.max(2, Math.floor(est / 2));
    t = await makeOpsApp(engine, { ASSAY_REQUEST_TIMEOUT_MS: String(Math.max(1, Math.floor(cap / 2))), ASSAY_REQUEST_TIMEOUT_MAX_MS: String(cap) });
    const before = sample(await metricsText(), "assay_admission_refused_total", { reason: "too_large" });
    const res = await post(payload);
    expect(expectSpecError(res, 422)).toMatch(/request too large for this server: its model work is estimated at .* \(ASSAY_REQUEST_TIMEOUT_MAX_MS\)/);
    expect(engine.pool.running + engine.pool.queued).toBe(0);
    expect(t.accounts.ledger(t.orgId).map((e) => e.kind)).toEqual(["grant"]);
    expect(sample(await metricsText(), "assay_admission_refused_total", { reason: "too_large" })).toBe(before + 1);
  });
});

describe("replanning an admitted request", () => {
  it("more escalated work than planned raises the deadline (never above the cap, never lowers it); release drops the plan", () => {
    const model = engine.build("judge-latest").build.onnxPath;
    const pass = { model, shape: { tokens: 4000, prefix: 100, branches: 30, width: 130 } };
    const one = engine.pool.estimate([pass]);
    const calls: { deadlineMs: number; ownMs: number }[] = [];
    const deadline = { arrivedAt: performance.now(), defaultMs: 1, maxMs: Math.ceil(one * 20), admitted: (a: { deadlineMs: number; ownMs: number }) => calls.push(a) };
    const ctl = new AbortController();
    const work = engine.pool.admit([pass], { org: "replan", signal: ctl.signal, deadline });
    expect(calls).toHaveLength(1);
    expect(calls[0]!.deadlineMs).toBeCloseTo(one * DEADLINE_MARGIN, 0);
    expect(engine.pool.pending().tokens).toBe(4000);
    work.replan([pass, pass, pass]);
    expect(calls).toHaveLength(2);
    expect(calls[1]!.deadlineMs).toBeCloseTo(3 * one * DEADLINE_MARGIN, 0);
    expect(engine.pool.pending().tokens).toBe(12000);
    work.replan([pass]);
    expect(calls).toHaveLength(2);
    work.replan(Array(40).fill(pass));
    expect(calls.at(-1)!.deadlineMs).toBe(Math.ceil(one * 20));
    // A cancelled request's plan is no longer work ahead of anyone.
    ctl.abort();
    expect(engine.pool.pending().tokens).toBe(0);
    expect(engine.pool.admitted).toBe(0);
    work.release();
  });
});

describe("fair between organizations", () => {
  it("one organization's queue does not delay another's single request: it runs next", async () => {
    t = await makeOpsApp(engine);
    const other = t.accounts.createKey("beta");
    // With the express worker ready (as it is once any test here has loaded it), a request's later
    // passes could go beside the main worker's: after the stalled pass the four waiting ones run as one
    // batch, and the express worker must not serve an organization with a pass in that batch.
    await engine.pool.preloadExpress(engine.build("judge-latest").build.onnxPath);
    const release = stall();
    const finished: string[] = [];
    const track = (name: string, p: ReturnType<typeof post>) => p.then((r) => (finished.push(name), r));
    const first = track("acme-0", post(noul(SHORT)));
    await until(() => engine.pool.running === 1, "the first request to reach the worker", { pending: first });
    // Three more: the organization's limit before a purchase is 4 in flight. Each asks its own question:
    // requests of one organization asking the same new question read its content-free prior once (the
    // first one's reading, Engine.prior), so the later ones would need a pass less than the other
    // organization's request and finish before it on less work, not by going ahead of it.
    const flood = Array.from({ length: 3 }, (_, i) =>
      track(`acme-${i + 1}`, post({ ...noul(`${SHORT} Case ${i}.`), questions: { late: { type: "noul", instructions: `The delivery of case ${i} was late.` } } })),
    );
    await until(() => engine.pool.queued === 3, "the organization's requests to queue");
    const single = track("beta", post(noul("Thanks, the refund came through."), other.key));
    await until(() => engine.pool.queued === 4, "the other organization's request to queue", { pending: single });
    release();
    const all = await Promise.all([first, ...flood, single]);
    expect(all.map((r) => r.statusCode)).toEqual(Array(5).fill(200));
    // The stalled request first, then the other organization's, then the rest in order.
    expect(finished).toEqual(["acme-0", "beta", "acme-1", "acme-2", "acme-3"]);
  });
});

describe("a short pass beside a long one (the express worker)", () => {
  const expressPasses = async () => sample(await metricsText(), "assay_express_passes_total", {});

  it("another organization's one-line request runs beside a long pass and is answered before it", async () => {
    t = await makeOpsApp(engine);
    const other = t.accounts.createKey("gamma");
    const long = noul(longState(300));
    expect(engine.estimateGeneralMs(long)).toBeGreaterThan(2 * engine.estimateGeneralMs(noul(SHORT)));
    // The express worker loads a model the first time a short pass could go beside a long one, so the
    // first rounds may run in order (loading a build takes a few long passes on 2 cores); within ten
    // rounds the short request must overtake.
    const rounds: { order: string[]; beside: number }[] = [];
    for (let round = 0; round < 10 && !rounds.some((r) => r.beside > 0); round++) {
      const before = await expressPasses();
      const order: string[] = [];
      // A new state each round, different from its first token: the prefix cache must not turn the long pass into a short one.
      const a = post({ ...long, state: `(${round}) ${long.state}` }).then((r) => (order.push("long"), r));
      await until(() => engine.pool.running === 1, "the long request to reach the worker");
      const b = post(noul(`${SHORT} Round ${round}.`), other.key).then((r) => (order.push("short"), r));
      const [ra, rb] = await Promise.all([a, b]);
      expect([ra.statusCode, rb.statusCode]).toEqual([200, 200]);
      rounds.push({ order, beside: (await expressPasses()) - before });
    }
    const overtaken = rounds.find((r) => r.beside > 0);
    expect(overtaken, JSON.stringify(rounds)).toBeDefined();
    expect(overtaken!.order).toEqual(["short", "long"]);
  });

  it("admission counts it: a short request is admitted on the express worker's wait, not the long pass's rest", async () => {
    // A deadline far shorter than the stalled long pass's rest (with the headroom): judged on the main
    // worker's wait the short request would be refused; the express worker answers it while the long
    // pass still holds the main one. (On the default 1.5B build a large request's pass outlasts the
    // default deadline: without this, the overload test's small organization got 529s.)
    const lb = engine.build("judge-latest");
    await engine.pool.preloadExpress(lb.build.onnxPath);
    const long = noul(longState(1_500));
    const shortEst = engine.estimateGeneralMs(noul(SHORT));
    const longEst = engine.estimateGeneralMs(long);
    expect(longEst, `long ${longEst} ms, short ${shortEst} ms`).toBeGreaterThan(12 * shortEst);
    const deadline = Math.ceil(engine.pool.safety() * 0.2 * longEst);
    // Admission counts the work the earlier tests' organizations will keep sending at their recent share
    // of the lane (decaying over 30 s). On a slow machine those shares refused the long request itself
    // (529: "about 70 s of queued work" ahead of its 39 s, with the lane idle), so they must fade first.
    await until(() => Math.max(0, ...engine.pool.recentShares().values()) < 0.05, "the earlier organizations' recent shares of the lane to fade", { ms: 240_000 });
    t = await makeOpsApp(engine, { ASSAY_REQUEST_TIMEOUT_MS: String(deadline) });
    const other = t.accounts.createKey("delta");
    const before = await expressPasses();
    const release = stall();
    const a = post({ ...long, state: `(beside) ${long.state}` });
    await until(() => engine.pool.running === 1, "the long request to reach the worker", { pending: a });
    const b = await post(noul(`${SHORT} Beside a stalled pass.`), other.key);
    expect(b.statusCode, b.body).toBe(200);
    expect(await expressPasses()).toBeGreaterThan(before);
    release();
    expect((await a).statusCode).toBe(200);
  });

  it("not for the organization whose pass holds the main worker: its own short request waits its turn", async () => {
    t = await makeOpsApp(engine);
    const before = await expressPasses();
    const order: string[] = [];
    const a = post(noul(longState(300))).then((r) => (order.push("long"), r));
    await until(() => engine.pool.running === 1, "the long request to reach the worker");
    const b = post(noul(`${SHORT} Same organization.`)).then((r) => (order.push("short"), r));
    const [ra, rb] = await Promise.all([a, b]);
    expect([ra.statusCode, rb.statusCode]).toEqual([200, 200]);
    expect(order).toEqual(["long", "short"]);
    expect(await expressPasses()).toBe(before);
  });
});

describe("cancellation of a request split into several passes", () => {
  it("a deadline that passes while the first pass runs starts none of the others; nothing is charged", async () => {
    // Code search items longer than the 512-token pass limit allows together: one pass per few items.
    const filler = longState(60);
    const items = Array.from({ length: 6 }, (_, i) => ({ id: `n${i}`, path: `src/mod${i}.py`, kind: "file", filePreview: { text: `${filler} ${i}` } }));
    const payload = {
      model: "judge-codegrep-lite",
      state: { query: "Where is the parcel delay handled?", items },
      questions: Object.fromEntries(items.map((_, i) => [`q${i}`, { type: "noul" }])),
    };
    // Room to be admitted on a loaded 2-core machine: the wait admission predicts counts the earlier
    // tests' organizations too (their recent share of the lane, decaying over 30 s), up to this request's
    // own work each; 4 s was refused (529: 3.2 s ahead, 1.4 s its own) beside two busy processes. The
    // stall holds the first pass until the test releases it, so the deadline always passes first.
    t = await makeOpsApp(engine, { ASSAY_REQUEST_TIMEOUT_MS: "12000" });
    const small = engine.pool.costModel(engine.build("judge-codegrep-lite").build.onnxPath);
    const passesBefore = small.passes;
    const release = stall();
    const res = post(payload);
    await until(() => engine.pool.running === 1, "the first pass to reach the worker", { pending: res });
    // Its other passes are planned (admitted work), not queued: they start only when this one ends.
    expect(engine.pool.admitted).toBe(1);
    expect(engine.pool.queued).toBe(0);
    expect(engine.pool.pending().tokens).toBeGreaterThan(0);
    const r = await res;
    expect(expectSpecError(r, 504)).toMatch(/exceeded its deadline/);
    // The request's planned passes are no longer work ahead of anyone.
    expect(engine.pool.admitted).toBe(0);
    expect(engine.pool.pending().tokens).toBe(0);
    release();
    await until(() => engine.pool.running === 0, "the stalled pass to finish");
    await until(() => t!.lifecycle.inFlightCount === 0, "the hold to be released");
    // Only the pass that was running when the deadline passed ran.
    expect(small.passes).toBe(passesBefore + 1);
    expect(engine.pool.queued).toBe(0);
    expect(t.accounts.ledger(t.orgId).map((e) => [e.kind, e.note])).toEqual([
      ["grant", "starting grant"],
      ["hold", null],
      ["release", "error 504 TIMEOUT"],
    ]);
  });
});

describe("the families go through the same admission", () => {
  it("fact check and code search requests are admitted with a deadline and answered; nothing stays planned", async () => {
    t = await makeOpsApp(engine);
    const fc = await post({
      model: "judge-factcheck-lite",
      state: "The parcel left the warehouse on Monday and arrived on Friday, with the box crushed.",
      questions: { c0: { type: "noul", instructions: "The parcel arrived on Friday." } },
    });
    expect(fc.statusCode, fc.body).toBe(200);
    expect(Number(fc.headers["x-deadline-time"])).toBeGreaterThanOrEqual(60_000);
    const cs = await post({
      model: "judge-codegrep-lite",
      state: { query: "Where is the delivery date parsed?", items: [{ id: "n0", path: "src/delivery.py", kind: "file", filePreview: { text: "def parse_date(s): ..." } }] },
      questions: { q0: { type: "noul" } },
    });
    expect(cs.statusCode, cs.body).toBe(200);
    expect(Number(cs.headers["x-estimated-time"])).toBeGreaterThan(0);
    expect(engine.pool.admitted).toBe(0);
    expect(engine.pool.pending()).toEqual({ tokens: 0, ms: 0 });
  });
});

describe("metrics", () => {
  it("the estimate in use per build and the queued work in tokens", async () => {
    t = await makeOpsApp(engine);
    const text = await metricsText();
    expect(sample(text, "assay_build_ms_per_token", { build: "qwen2.5-coder-0.5b-instruct" })).toBeGreaterThan(0);
    expect(text).toMatch(/^assay_build_ms_per_attention_pair\{build="qwen2\.5-coder-0\.5b-instruct"\} \S+$/m);
    expect(text).toMatch(/^assay_inference_queue_tokens 0$/m);
    expect(text).toMatch(/^# TYPE assay_admission_refused_total counter$/m);
  });
});
