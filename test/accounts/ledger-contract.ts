/**
 * The credit ledger's contract, run against every store (SQLite in
 * ledger.test.ts, PostgreSQL in replicas.test.ts). Times are passed in, so
 * expiry is tested without sleeping.
 */
import { afterEach, describe, expect, it } from "vitest";
import type { HoldRequest, Store } from "../../src/accounts/types.js";

export interface LedgerHarness {
  /** A fresh, empty store whose new organizations get `startingGrantMicro`. */
  open(startingGrantMicro: number): Promise<{ store: Store; exec(sql: string): Promise<unknown>; close(): Promise<void> }>;
}

const T = 1_800_000_000_000; // a fixed "now", ms

export function describeLedgerContract(name: string, harness: LedgerHarness): void {
  describe(`credit ledger contract: ${name}`, () => {
    let opened: Awaited<ReturnType<LedgerHarness["open"]>> | null = null;
    afterEach(async () => {
      await opened?.close();
      opened = null;
    });
    const open = async (grant: number) => {
      opened = await harness.open(grant);
      return opened;
    };
    const hold = (orgId: string, amountMicro: number, now = T, ttlMs = 60_000): HoldRequest => ({
      orgId,
      amountMicro,
      now,
      ttlMs,
      requestId: `req-${amountMicro}-${now}`,
      model: "judge-latest",
      inputTokens: amountMicro * 25,
      priceMicroPerMTok: 40_000,
    });
    const kinds = async (s: Store, orgId: string) => (await s.ledger(orgId)).map((e) => [e.kind, e.amountMicro]);

    it("a new organization gets the starting grant once; a grant is not a purchase", async () => {
      const { store } = await open(1_000_000);
      const org = await store.ensureOrg("acme");
      await store.ensureOrg("acme");
      await store.createKey("acme");
      expect(await store.balance(org.id, T)).toEqual({
        orgId: org.id,
        creditMicro: 1_000_000,
        heldMicro: 0,
        availableMicro: 1_000_000,
        hasPurchased: false,
      });
      expect(await kinds(store, org.id)).toEqual([["grant", 1_000_000]]);
      const [grant] = await store.ledger(org.id);
      expect(grant!.note).toBe("starting grant");
      // The first key's organization too (first start creates `local`).
      const first = await store.createFirstKey("local");
      expect(first).toBeNull(); // acme already has a key
    });

    it("createFirstKey creates a key only in an empty store, with the grant", async () => {
      const { store } = await open(7);
      const first = await store.createFirstKey("local");
      expect(first?.org.name).toBe("local");
      expect(await store.createFirstKey("local")).toBeNull();
      expect((await store.balance(first!.org.id, T)).creditMicro).toBe(7);
    });

    it("a grant of 0 writes nothing", async () => {
      const { store } = await open(0);
      const org = await store.ensureOrg("acme");
      expect(await kinds(store, org.id)).toEqual([]);
      expect((await store.balance(org.id, T)).availableMicro).toBe(0);
    });

    it("a purchase adds credit and marks the organization as having purchased", async () => {
      const { store } = await open(1_000_000);
      const org = await store.ensureOrg("acme");
      const { org: after, balance } = await store.addCredit("acme", "purchase", 25_000_000, "invoice 7", T);
      expect(after.hasPurchased).toBe(true);
      expect((await store.findOrg("acme"))?.hasPurchased).toBe(true);
      expect(balance.creditMicro).toBe(26_000_000);
      expect(balance.hasPurchased).toBe(true);
      expect(await kinds(store, org.id)).toEqual([
        ["grant", 1_000_000],
        ["purchase", 25_000_000],
      ]);
      await expect(Promise.resolve().then(() => store.addCredit("nobody", "purchase", 1, null, T))).rejects.toThrow(/no organization named "nobody"/);
      await expect(Promise.resolve().then(() => store.addCredit("acme", "purchase", 0, null, T))).rejects.toThrow(/more than zero/);
      await expect(Promise.resolve().then(() => store.addCredit("acme", "purchase", 1.5, null, T))).rejects.toThrow(/whole number/);
    });

    it("a hold fits exactly the available balance, and not one micro-USD more", async () => {
      const { store } = await open(40);
      const org = await store.ensureOrg("acme");
      const tooBig = await store.placeHold(hold(org.id, 41));
      expect(tooBig.ok).toBe(false);
      expect(tooBig.balance.availableMicro).toBe(40);
      expect(await kinds(store, org.id)).toEqual([["grant", 40]]); // a refused hold writes nothing
      const exact = await store.placeHold(hold(org.id, 40));
      expect(exact.ok).toBe(true);
      expect(exact.balance).toMatchObject({ creditMicro: 40, heldMicro: 40, availableMicro: 0 });
      expect((await store.placeHold(hold(org.id, 1))).ok).toBe(false);
      expect((await store.placeHold(hold(org.id, 0))).ok).toBe(true);
    });

    it("settle charges once; a second settle or release of the same hold changes nothing", async () => {
      const { store } = await open(40);
      const org = await store.ensureOrg("acme");
      const h = await store.placeHold(hold(org.id, 40));
      if (!h.ok) throw new Error("hold refused");
      const settle = { holdId: h.holdId, chargeMicro: 25, inputTokens: 625, priceMicroPerMTok: 40_000, now: T + 5 };
      expect(await store.settleHold(settle)).toBe(true);
      expect(await store.settleHold(settle)).toBe(false);
      expect(await store.releaseHold(h.holdId, "error", T + 6)).toBe(false);
      expect(await store.balance(org.id, T + 7)).toMatchObject({ creditMicro: 15, heldMicro: 0, availableMicro: 15 });
      const entries = await store.ledger(org.id);
      expect(entries.map((e) => e.kind)).toEqual(["grant", "hold", "settle"]);
      expect(entries[2]).toMatchObject({
        kind: "settle",
        amountMicro: 25,
        holdId: h.holdId,
        inputTokens: 625,
        priceMicroPerMTok: 40_000,
        requestId: "req-40-" + T,
        model: "judge-latest",
      });
      expect(entries[1]).toMatchObject({ kind: "hold", amountMicro: 40, expiresAt: T + 60_000 });
    });

    it("release returns the hold with no charge and records why", async () => {
      const { store } = await open(100);
      const org = await store.ensureOrg("acme");
      const h = await store.placeHold(hold(org.id, 60));
      if (!h.ok) throw new Error("hold refused");
      expect((await store.balance(org.id, T)).availableMicro).toBe(40);
      expect(await store.releaseHold(h.holdId, "error 503 MODEL_STARTING", T + 1)).toBe(true);
      expect(await store.releaseHold(h.holdId, "error", T + 2)).toBe(false);
      expect(await store.settleHold({ holdId: h.holdId, chargeMicro: 60, inputTokens: 1, priceMicroPerMTok: 1, now: T + 3 })).toBe(false);
      expect(await store.balance(org.id, T + 4)).toMatchObject({ creditMicro: 100, heldMicro: 0, availableMicro: 100 });
      const last = (await store.ledger(org.id)).at(-1)!;
      expect(last).toMatchObject({ kind: "release", amountMicro: 60, note: "error 503 MODEL_STARTING" });
    });

    it("an expired hold releases itself on the next read or admission, and renewing keeps it", async () => {
      const { store } = await open(100);
      const org = await store.ensureOrg("acme");
      const h = await store.placeHold(hold(org.id, 100, T, 1000));
      if (!h.ok) throw new Error("hold refused");
      expect(h.expiresAt).toBe(T + 1000);
      expect((await store.balance(org.id, T + 999)).heldMicro).toBe(100);
      expect(await store.renewHold(h.holdId, T + 5000)).toBe(true);
      expect(await store.renewHold(h.holdId, T + 10)).toBe(true); // never moves earlier
      expect((await store.balance(org.id, T + 4999)).heldMicro).toBe(100);
      // The next admission releases it first, so the full balance is available again.
      const next = await store.placeHold(hold(org.id, 100, T + 5000, 1000));
      expect(next.ok).toBe(true);
      const entries = await store.ledger(org.id);
      expect(entries.map((e) => [e.kind, e.note])).toEqual([
        ["grant", "starting grant"],
        ["hold", null],
        ["release", "expired"],
        ["hold", null],
      ]);
      // Too late to charge the released one: not charged, and never twice.
      expect(await store.settleHold({ holdId: h.holdId, chargeMicro: 100, inputTokens: 1, priceMicroPerMTok: 1, now: T + 5001 })).toBe(false);
      expect(await store.renewHold(h.holdId, T + 9000)).toBe(false);
      // A read releases too.
      expect((await store.balance(org.id, T + 6000)).heldMicro).toBe(0);
      expect((await store.balance(org.id, T + 6000)).creditMicro).toBe(100);
    });

    it("the sweep releases expired holds of every organization, and only those", async () => {
      const { store } = await open(100);
      const a = await store.ensureOrg("a");
      const b = await store.ensureOrg("b");
      await store.placeHold(hold(a.id, 10, T, 1000));
      await store.placeHold(hold(b.id, 20, T, 1000));
      await store.placeHold(hold(b.id, 30, T, 9000));
      expect(await store.releaseExpiredHolds(T + 999)).toBe(0);
      expect(await store.releaseExpiredHolds(T + 1000)).toBe(2);
      expect(await store.releaseExpiredHolds(T + 1000)).toBe(0);
      expect((await store.usage("b", T + 1000, 5))?.openHolds.map((h) => h.amountMicro)).toEqual([30]);
      expect((await store.usage("a", T + 1000, 5))?.openHolds).toEqual([]);
      expect(await store.releaseExpiredHolds(T + 9000, a.id)).toBe(0); // b's hold is not a's
      expect((await store.usage("b", T + 9000, 5))?.openHolds).toEqual([]); // read releases it
    });

    it("the ledger is append-only", async () => {
      const { store, exec } = await open(100);
      await store.ensureOrg("acme");
      await expect(exec("UPDATE ledger SET amount = 0")).rejects.toThrow(/append-only/);
      await expect(exec("DELETE FROM ledger")).rejects.toThrow(/append-only/);
    });

    it("concurrent holds never overdraw, and the kept balance equals the one derived from the ledger", async () => {
      const { store } = await open(1000);
      const org = await store.ensureOrg("acme");
      const results = await Promise.all(Array.from({ length: 30 }, (_, i) => store.placeHold(hold(org.id, 100, T + i))));
      const ok = results.filter((r) => r.ok);
      expect(ok).toHaveLength(10);
      expect((await store.balance(org.id, T + 100)).availableMicro).toBe(0);
      // Settle half, release the rest, concurrently.
      await Promise.all(
        ok.map((r, i) =>
          r.ok
            ? i % 2 === 0
              ? store.settleHold({ holdId: r.holdId, chargeMicro: 7 * i, inputTokens: i, priceMicroPerMTok: 1, now: T + 200 })
              : store.releaseHold(r.holdId, "error", T + 200)
            : null,
        ),
      );
      const charged = [0, 2, 4, 6, 8].reduce((s, i) => s + 7 * i, 0);
      const audit = await store.audit(org.id);
      expect(audit.kept).toEqual({ creditMicro: 1000 - charged, heldMicro: 0 });
      expect(audit.derived).toEqual(audit.kept);
    });

    it("usage reports balance, totals, open holds and recent charges newest first", async () => {
      const { store } = await open(1_000_000);
      const org = await store.ensureOrg("acme");
      await store.addCredit("acme", "purchase", 2_000_000, null, T);
      for (let i = 1; i <= 3; i++) {
        const h = await store.placeHold(hold(org.id, 100, T + i));
        if (!h.ok) throw new Error("refused");
        await store.settleHold({ holdId: h.holdId, chargeMicro: i * 10, inputTokens: i * 250, priceMicroPerMTok: 40_000, now: T + i });
      }
      await store.placeHold(hold(org.id, 55, T + 10));
      const u = (await store.usage("acme", T + 11, 2))!;
      expect(u.org.name).toBe("acme");
      expect(u.balance).toMatchObject({ creditMicro: 3_000_000 - 60, heldMicro: 55, availableMicro: 3_000_000 - 115, hasPurchased: true });
      expect(u.totals).toEqual({ grantsMicro: 1_000_000, purchasesMicro: 2_000_000, chargesMicro: 60, charges: 3 });
      expect(u.openHolds.map((h) => h.amountMicro)).toEqual([55]);
      expect(u.recentCharges.map((c) => c.amountMicro)).toEqual([30, 20]);
      expect(await store.usage("nobody", T, 5)).toBeNull();
    });
  });
}
