/**
 * Admission and billing through HTTP (embedded deployment: SQLite store,
 * in-process limiter). The model is irrelevant here, so the pipeline is
 * FakeTokenCountPipelineForBilling, which reports a token count the test
 * chooses, through `admit` and usage, as the real pipeline does; the real
 * engine's charge is tested in test/engine/billing.test.ts.
 */
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import type { ConcurrencyLimiter } from "../../src/accounts/limiter.js";
import { chargeFor } from "../../src/accounts/money.js";
import { AssayError, type ErrorCode } from "../../src/errors/catalogue.js";
import { expectSpecError } from "./assertions.js";
import { FakeTokenCountPipelineForBilling } from "./fake-pipeline.js";
import { makeTestApp, validBody, type TestApp, type TestAppOptions } from "./helpers.js";

const PRICE = 40_000; // judge-latest: $0.04 per million input tokens, in µUSD
let t: TestApp<FakeTokenCountPipelineForBilling>;

async function start(options: Omit<TestAppOptions<FakeTokenCountPipelineForBilling>, "pipeline"> = {}) {
  t = await makeTestApp({ ...options, pipeline: new FakeTokenCountPipelineForBilling() });
  return t;
}
afterEach(async () => {
  await t?.close();
});

const post = (body: unknown = validBody, key = t.key) =>
  t.app.inject({ method: "POST", url: "/v1/systemone", headers: { authorization: `Bearer ${key}` }, payload: body as object });
const balance = () => t.accounts.balance(t.orgId, Date.now());
const ledgerKinds = () => t.accounts.ledger(t.orgId).map((e) => e.kind);

/**
 * Resolves once the next slot `limiter` hands out is given back: the last step of a request's end (its
 * hold is released first), which a hang-up reaches some time after the client's socket has gone.
 */
function nextSlotReturned(limiter: ConcurrencyLimiter): Promise<void> {
  const acquire = limiter.acquire.bind(limiter);
  return new Promise((resolve) => {
    limiter.acquire = async (orgId, limit) => {
      limiter.acquire = acquire;
      const slot = await acquire(orgId, limit);
      return slot && { id: slot.id, release: () => slot.release().then(resolve) };
    };
  });
}

describe("charging a successful request", () => {
  it("holds the tokenized cost before model work, then settles to usage.input_tokens × price", async () => {
    await start();
    t.pipeline.inputTokensFor = () => 1187;
    const res = await post(validBody);
    expect(res.statusCode, res.body).toBe(200);
    expect(res.json().usage.input_tokens).toBe(1187);
    const charge = chargeFor(1187, PRICE); // ceil(47.48) = 48
    expect(charge).toBe(48);
    expect(balance()).toMatchObject({ creditMicro: 1_000_000 - charge, heldMicro: 0 });
    const entries = t.accounts.ledger(t.orgId);
    expect(entries.map((e) => [e.kind, e.amountMicro])).toEqual([
      ["grant", 1_000_000],
      ["hold", charge],
      ["settle", charge],
    ]);
    const requestId = res.headers["x-request-id"];
    expect(entries[1]).toMatchObject({ requestId, model: "judge-latest", inputTokens: 1187, priceMicroPerMTok: PRICE });
    expect(entries[2]).toMatchObject({ requestId, inputTokens: 1187, priceMicroPerMTok: PRICE });
    expect(await t.admission.limiter.inFlight(t.orgId)).toBe(0);
  });

  it("a pipeline that answers without calling admit is still charged its usage", async () => {
    await start();
    const fake = t.pipeline;
    const run = fake.run.bind(fake);
    fake.run = async (env, ctx) => run(env, { ...ctx, admit: () => {} }); // swallows the hold
    t.pipeline.inputTokensFor = () => 1000;
    expect((await post()).statusCode).toBe(200);
    expect(balance().creditMicro).toBe(1_000_000 - 40);
  });
});

describe("402 insufficient credit", () => {
  it("exact balance passes; one micro-USD short fails, naming the shortfall", async () => {
    // 1000 tokens × $0.04/M = 40 µUSD.
    await start({ startingGrantMicro: 39 });
    const res = await post();
    const detail = expectSpecError(res, 402);
    expect(detail).toContain("needs $0.000040");
    expect(detail).toContain("1,000 input tokens × $0.04/M for judge-latest");
    expect(detail).toContain("$0.000039 available");
    expect(detail).toContain("short by $0.000001");
    expect(detail).toContain('"acme"');
    expect(res.headers["retry-after"]).toBeUndefined();
    // Refused before any model work, nothing held, nothing charged.
    expect(t.pipeline.inModel).toBe(0);
    expect(ledgerKinds()).toEqual(["grant"]);
    expect(balance()).toMatchObject({ creditMicro: 39, heldMicro: 0 });

    t.accounts.addCredit("acme", "grant", 1, "top up to exactly 40", Date.now());
    const ok = await post();
    expect(ok.statusCode, ok.body).toBe(200);
    expect(balance()).toMatchObject({ creditMicro: 0, heldMicro: 0, availableMicro: 0 });
    // And now empty: 402 again, short by the whole cost.
    expect(expectSpecError(await post(), 402)).toContain("short by $0.000040");
  });

  it("counts money held by requests in flight", async () => {
    await start({ startingGrantMicro: 100 });
    t.pipeline.inputTokensFor = () => 1500; // 60 µUSD each
    const open = t.pipeline.pause();
    const first = post();
    await t.pipeline.untilInModel(1);
    const detail = expectSpecError(await post(), 402);
    expect(detail).toContain("$0.000040 available (balance $0.000100, of which $0.000060 is held by requests in flight)");
    expect(detail).toContain("short by $0.000020");
    open();
    expect((await first).statusCode).toBe(200);
    expect(balance()).toMatchObject({ creditMicro: 40, heldMicro: 0 });
  });
});

describe("no charge for any error", () => {
  const failures: [ErrorCode, number][] = [
    ["INVALID_REQUEST", 422],
    ["INSUFFICIENT_CREDIT", 402],
    ["TOO_MANY_REQUESTS", 429],
    ["MODEL_FAILED", 502],
    ["MODEL_STARTING", 503],
    ["UNAVAILABLE", 503],
    ["TIMEOUT", 504],
    ["MODEL_BUSY", 529],
    ["INTERNAL", 500],
  ];

  it.each(failures)("%s (%i) after the hold: released to zero, slot given back", async (code, status) => {
    await start();
    t.pipeline.failAfterAdmitWith = new AssayError(code, `failed with ${code}`);
    const res = await post();
    expectSpecError(res, status);
    expect(balance()).toMatchObject({ creditMicro: 1_000_000, heldMicro: 0 });
    const entries = t.accounts.ledger(t.orgId);
    expect(entries.map((e) => e.kind)).toEqual(["grant", "hold", "release"]);
    expect(entries[2]!.note).toBe(`error ${status} ${code}`);
    expect(await t.admission.limiter.inFlight(t.orgId)).toBe(0);
  });

  it("an unexpected exception (500) after the hold: released", async () => {
    await start();
    t.pipeline.failAfterAdmitWith = new Error("boom");
    expectSpecError(await post(), 500);
    expect(ledgerKinds()).toEqual(["grant", "hold", "release"]);
    expect(t.accounts.ledger(t.orgId)[2]!.note).toBe("error 500 INTERNAL");
    expect(balance().creditMicro).toBe(1_000_000);
  });

  it("errors before the hold (401, 413, 415, 422 envelope, 422 questions) write nothing and free the slot", async () => {
    await start();
    expectSpecError(await post(validBody, "sk-assay-" + "A".repeat(43)), 401);
    expectSpecError(await post({ state: 1, questions: {} }), 422);
    expectSpecError(await post({ ...validBody, questions: { q: { type: "choice", criteria: {} } } }), 422);
    expectSpecError(
      await t.app.inject({ method: "POST", url: "/v1/systemone", headers: { authorization: `Bearer ${t.key}`, "content-type": "text/plain" }, payload: "x" }),
      415,
    );
    t.pipeline.failWith = new AssayError("MODEL_STARTING", "loading", 5);
    expectSpecError(await post(), 503);
    expect(ledgerKinds()).toEqual(["grant"]);
    expect(await t.admission.limiter.inFlight(t.orgId)).toBe(0);
  });

  it("a client that hangs up mid-request is not charged (real socket)", async () => {
    await start();
    await t.app.listen({ port: 0, host: "127.0.0.1" });
    const { port } = t.app.server.address() as AddressInfo;
    t.pipeline.pause(); // never opened: only the hang-up ends the request
    const returned = nextSlotReturned(t.admission.limiter);
    const abort = new AbortController();
    const pending = fetch(`http://127.0.0.1:${port}/v1/systemone`, {
      method: "POST",
      headers: { authorization: `Bearer ${t.key}`, "content-type": "application/json" },
      body: JSON.stringify(validBody),
      signal: abort.signal,
    }).catch((e: unknown) => e);
    await t.pipeline.untilInModel(1);
    expect(balance().heldMicro).toBe(40);
    abort.abort();
    await pending;
    await returned;
    expect(await t.admission.limiter.inFlight(t.orgId)).toBe(0);
    expect(balance()).toMatchObject({ creditMicro: 1_000_000, heldMicro: 0 });
    expect(t.accounts.ledger(t.orgId).at(-1)).toMatchObject({ kind: "release", note: "error 504 TIMEOUT" });
    // Node keeps the aborted socket counted for a few seconds; do not wait for it at close.
    t.app.server.closeAllConnections();
  });
});

describe("429 concurrency", () => {
  it("the 5th simultaneous request of a new organization gets 429 with Retry-After; the first purchase lifts the limit to 100", async () => {
    await start({ startingGrantMicro: 10_000_000 });
    const open = t.pipeline.pause();
    const first4 = Array.from({ length: 4 }, () => post());
    await t.pipeline.untilInModel(4);
    const fifth = await post();
    const detail = expectSpecError(fifth, 429);
    expect(fifth.headers["retry-after"]).toBe("1");
    expect(detail).toContain('organization "acme" already has 4 requests in flight');
    expect(detail).toContain("raises it to 100");
    expect(detail).toContain("retry after 1 second");
    // The refused one wrote nothing: the four holds are all there is.
    expect(ledgerKinds()).toEqual(["grant", "hold", "hold", "hold", "hold"]);

    // A purchase while the four are still in flight: the limit is now 100.
    t.accounts.addCredit("acme", "purchase", 5_000_000, null, Date.now());
    const more = Array.from({ length: 96 }, () => post());
    await t.pipeline.untilInModel(100);
    expect(await t.admission.limiter.inFlight(t.orgId)).toBe(100);
    const over = await post();
    expect(expectSpecError(over, 429)).toContain("already has 100 requests in flight");
    open();
    const all = await Promise.all([...first4, ...more]);
    expect(all.every((r) => r.statusCode === 200)).toBe(true);
    expect(await t.admission.limiter.inFlight(t.orgId)).toBe(0);
    expect(balance()).toMatchObject({ creditMicro: 15_000_000 - 100 * 40, heldMicro: 0 });
  });

  it("slots come back after requests end, and the limits are configurable", async () => {
    await start({ env: { ASSAY_CONCURRENCY_BEFORE_PURCHASE: "2", ASSAY_RETRY_AFTER_SECONDS: "3" } });
    const open = t.pipeline.pause();
    const two = [post(), post()];
    await t.pipeline.untilInModel(2);
    const third = await post();
    expectSpecError(third, 429);
    expect(third.headers["retry-after"]).toBe("3");
    open();
    await Promise.all(two);
    expect((await post()).statusCode).toBe(200);
  });

  it("organizations are limited separately", async () => {
    await start();
    const other = t.accounts.createKey("globex").key;
    const open = t.pipeline.pause();
    const mine = Array.from({ length: 4 }, () => post());
    await t.pipeline.untilInModel(4);
    const theirs = post(validBody, other);
    await t.pipeline.untilInModel(5);
    open();
    expect((await theirs).statusCode).toBe(200);
    await Promise.all(mine);
  });
});

describe("holds left behind", () => {
  it("an expired hold releases itself at the next admission and at the sweep; nothing is lost or charged twice", async () => {
    let now = Date.now();
    await start({ startingGrantMicro: 100, clock: () => now, env: { ASSAY_HOLD_TTL_SECONDS: "60" } });
    // A "crashed" request: a hold that no settle or release will ever close.
    const crashed = t.accounts.placeHold({
      orgId: t.orgId, amountMicro: 80, now, ttlMs: 60_000, requestId: "crashed", model: "judge-latest", inputTokens: 2000, priceMicroPerMTok: PRICE,
    });
    expect(crashed.ok).toBe(true);
    // While it lives it blocks the money: 40 µUSD needed, 20 available.
    expect(expectSpecError(await post(), 402)).toContain("short by $0.000020");
    now += 60_000;
    // Expired: the next admission releases it first and the request fits.
    expect((await post()).statusCode).toBe(200);
    const entries = t.accounts.ledger(t.orgId);
    expect(entries.map((e) => [e.kind, e.amountMicro, e.note])).toEqual([
      ["grant", 100, "starting grant"],
      ["hold", 80, null],
      ["release", 80, "expired"],
      ["hold", 40, null],
      ["settle", 40, null],
    ]);

    // The periodic sweep does the same for organizations that send nothing.
    t.accounts.placeHold({ orgId: t.orgId, amountMicro: 60, now, ttlMs: 1000, requestId: "crashed-2", model: null, inputTokens: null, priceMicroPerMTok: null });
    now += 1000;
    expect(await t.admission.sweep()).toBe(1);
    expect(t.accounts.audit(t.orgId)).toEqual({ derived: { creditMicro: 60, heldMicro: 0 }, kept: { creditMicro: 60, heldMicro: 0 } });
  });
});

describe("ledger sums under concurrent load", () => {
  it("sum of charges = sum of usage.input_tokens × price, exactly, with failures mixed in", async () => {
    await start({ startingGrantMicro: 0 });
    t.accounts.addCredit("acme", "purchase", 50_000_000, null, Date.now());
    // Token counts that exercise the rounding: 1 … 10,000, odd ones included.
    t.pipeline.inputTokensFor = (env) => Number((env.state as string).slice(2));
    t.pipeline.failAfterAdmitWith = (env) => (Number((env.state as string).slice(2)) % 7 === 0 ? new AssayError("MODEL_BUSY", "busy") : null);
    const tokens = Array.from({ length: 300 }, (_, i) => 1 + ((i * 7919) % 10_000));
    const results = await Promise.all(
      tokens.map(async (n) => {
        // At most 100 at a time are admitted; retry the 429s.
        for (;;) {
          const res = await post({ ...validBody, state: `n=${n}` });
          if (res.statusCode !== 429) return res;
          await new Promise((r) => setTimeout(r, 5));
        }
      }),
    );
    let expected = 0;
    let ok = 0;
    for (const res of results) {
      if (res.statusCode === 200) {
        expected += chargeFor(res.json().usage.input_tokens, PRICE);
        ok++;
      } else expect(res.statusCode).toBe(529);
    }
    expect(ok).toBeGreaterThan(200);
    const settled = t.accounts.ledger(t.orgId).filter((e) => e.kind === "settle");
    expect(settled).toHaveLength(ok);
    expect(settled.reduce((s, e) => s + e.amountMicro, 0)).toBe(expected);
    expect(balance()).toMatchObject({ creditMicro: 50_000_000 - expected, heldMicro: 0 });
    const audit = t.accounts.audit(t.orgId);
    expect(audit.derived).toEqual(audit.kept);
  });
});

describe("store or limiter unreachable (PostgreSQL / Redis down)", () => {
  it("503 with Retry-After, never an unchecked admission, and the slot comes back", async () => {
    await start();
    const store = t.accounts;
    const realPlace = store.placeHold.bind(store);
    store.placeHold = () => {
      throw new Error("connection refused");
    };
    const res = await post();
    expect(expectSpecError(res, 503)).toMatch(/cannot check credit/);
    expect(res.headers["retry-after"]).toBe("1");
    expect(t.pipeline.inModel).toBe(0);
    expect(await t.admission.limiter.inFlight(t.orgId)).toBe(0);
    store.placeHold = realPlace;

    const limiter = t.admission.limiter;
    const realAcquire = limiter.acquire.bind(limiter);
    limiter.acquire = async () => {
      throw new Error("redis down");
    };
    const res2 = await post();
    expect(expectSpecError(res2, 503)).toMatch(/concurrency limit/);
    limiter.acquire = realAcquire;

    const realCheck = store.checkKey.bind(store);
    store.checkKey = () => {
      throw new Error("connection refused");
    };
    const res3 = await post();
    expect(expectSpecError(res3, 503)).toMatch(/cannot check API keys/);
    store.checkKey = realCheck;

    expect(ledgerKinds()).toEqual(["grant"]);
    expect((await post()).statusCode).toBe(200);
  });

  it("a settle that cannot be written is a 503 and no charge: the hold is released", async () => {
    await start();
    const store = t.accounts;
    store.settleHold = () => {
      throw new Error("connection lost");
    };
    expect(expectSpecError(await post(), 503)).toMatch(/not charged/);
    expect(balance()).toMatchObject({ creditMicro: 1_000_000, heldMicro: 0 });
    expect(ledgerKinds()).toEqual(["grant", "hold", "release"]);
  });
});
