/**
 * Load: one organization sends at twice its concurrency limit (8 senders,
 * limit 4 before its first purchase) for a fixed time (CI: 30 s; full form:
 * 10 minutes) against a real server process with the real model.
 *
 *   - no 5xx at all; every refusal is 429 with Retry-After
 *   - p99 of the accepted requests is reported (printed and recorded, never asserted)
 *   - afterwards the ledger's charges equal Σ chargeFor(usage.input_tokens, price)
 *     over the 200 responses, exactly, one settle per 200 and none for anything else
 *   - no hold stays open and no slot stays taken (the limit is whole again)
 *   - the prefix cache stays within its budget (16 MB here, so that every
 *     request's new state evicts an older one) and the process's resident
 *     memory is sampled throughout (recorded, not asserted: most of it is
 *     the models)
 *   - the server's log never shows the key
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chargeFor } from "../../src/accounts/money.js";
import { loadPrices } from "../../src/accounts/prices.js";
import { SqliteAccountsStore } from "../../src/accounts/sqlite.js";
import { ROOT } from "../../src/config/index.js";
import { FIGURES, FORM, ServerProcess, call, expectNoSecrets, percentile, recordFigures, sample, score, sleep, smallBody } from "./harness.js";
import { smallDeployment } from "../engine/engine.js";
import { detailMessage } from "../../src/errors/catalogue.js";

const LIMIT = 4;
const SENDERS = 2 * LIMIT;
/** A small prefix cache budget: a few states fit, so the load evicts all along. */
const CACHE_MB = 16;
const PRICE = loadPrices(path.join(ROOT, "models", "prices.json")).priceFor("judge-latest", "general");

let dir: string;
let server: ServerProcess | null = null;
let key: string;
let orgId: string;

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-reliability-load-"));
  // The key exists before the server starts, so the server creates (and prints) no first-start key.
  const store = new SqliteAccountsStore(dir, { startingGrantMicro: 1_000_000 });
  ({ key, org: { id: orgId } } = store.createKey("load"));
  store.close();
  server = await ServerProcess.start({ ...smallDeployment(), ASSAY_DATA_DIR: dir, ASSAY_CONCURRENCY_BEFORE_PURCHASE: String(LIMIT), ASSAY_PREFIX_CACHE_MB: String(CACHE_MB) });
});

afterAll(async () => {
  await server?.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

interface Outcome {
  id: string;
  status: number;
  ms: number;
  inputTokens: number | null;
  retryAfter: string | null;
  detail: unknown;
}

describe(`load at 2× the concurrency limit (${FORM} form: ${FIGURES.loadSeconds} s)`, () => {
  it(
    "zero 5xx, every refusal a 429 with Retry-After, charges = Σ usage × price of the 200s, no hold or slot left",
    async () => {
      const s = server!;
      const outcomes: Outcome[] = [];
      const transportErrors: string[] = [];
      let n = 0;
      const end = Date.now() + FIGURES.loadSeconds * 1000;
      const rss: number[] = [];
      const sampler = setInterval(() => rss.push(s.rssBytes()), 1000);
      const sender = async (w: number) => {
        while (Date.now() < end) {
          const i = n++;
          const id = `load-${w}-${i}`;
          try {
            // Every state new: each request misses the prefix cache and adds an entry.
            const sent = smallBody(i);
            const r = await score(s.url, key, { ...sent, state: `${sent.state} (message ${i})` }, { "x-request-id": id });
            const body = r.json as { usage?: { input_tokens: number }; detail?: unknown; model?: string } | null;
            outcomes.push({
              id,
              status: r.status,
              ms: r.ms,
              inputTokens: r.status === 200 ? body!.usage!.input_tokens : null,
              retryAfter: r.headers.get("retry-after"),
              detail: body?.detail,
            });
            if (r.status === 200) expect(body!.model).toBe("judge-latest");
            // A refused sender comes back soon, keeping 8 senders against 4 slots.
            if (r.status === 429) await sleep(20 + Math.random() * 30);
          } catch (e) {
            transportErrors.push(String(e));
          }
        }
      };
      const t0 = performance.now();
      await Promise.all(Array.from({ length: SENDERS }, (_, w) => sender(w)));
      const seconds = (performance.now() - t0) / 1000;
      clearInterval(sampler);

      const ok = outcomes.filter((o) => o.status === 200);
      const refused = outcomes.filter((o) => o.status === 429);
      const other = outcomes.filter((o) => o.status !== 200 && o.status !== 429);
      const latencies = ok.map((o) => o.ms);
      const figures = {
        seconds: Math.round(seconds),
        senders: SENDERS,
        limit: LIMIT,
        requests: outcomes.length,
        ok: ok.length,
        refused429: refused.length,
        other: other.length,
        status5xx: outcomes.filter((o) => o.status >= 500).length,
        transportErrors: transportErrors.length,
        acceptedPerSecond: Math.round((ok.length / seconds) * 100) / 100,
        p50ms: Math.round(percentile(latencies, 50)),
        p90ms: Math.round(percentile(latencies, 90)),
        p99ms: Math.round(percentile(latencies, 99)),
        maxms: Math.round(Math.max(...latencies)),
      };

      expect(transportErrors).toEqual([]);
      expect(other.map((o) => `${o.status} ${JSON.stringify(o.detail)}`)).toEqual([]);
      expect(ok.length).toBeGreaterThan(0);
      // Twice the limit really was sent: the limit refused some.
      expect(refused.length).toBeGreaterThan(0);
      for (const r of refused) {
        expect(r.retryAfter).toBe("1");
        expect(detailMessage(r.detail)).toContain(`already has ${LIMIT} requests in flight`);
      }

      // The ledger, read from the server's own SQLite file while it runs.
      const store = new SqliteAccountsStore(dir, { startingGrantMicro: 1_000_000 });
      try {
        const ledger = store.ledger(orgId);
        const settles = ledger.filter((e) => e.kind === "settle");
        const byRequest = new Map(settles.map((e) => [e.requestId, e]));
        expect(settles).toHaveLength(ok.length);
        let expected = 0;
        for (const o of ok) {
          const charge = chargeFor(o.inputTokens!, PRICE);
          expected += charge;
          const e = byRequest.get(o.id);
          expect(e, `no settle for ${o.id}`).toBeDefined();
          expect(e!.amountMicro).toBe(charge);
          expect(e!.inputTokens).toBe(o.inputTokens);
        }
        const charged = settles.reduce((sum, e) => sum + e.amountMicro, 0);
        expect(charged).toBe(expected);
        // A 429 is refused before any hold: holds are exactly the accepted requests.
        expect(ledger.filter((e) => e.kind === "hold")).toHaveLength(ok.length);
        expect(ledger.filter((e) => e.kind === "release")).toEqual([]);
        const usage = store.usage("load", Date.now(), 0)!;
        expect(usage.openHolds).toEqual([]);
        expect(usage.balance).toMatchObject({ creditMicro: 1_000_000 - expected, heldMicro: 0 });
        const audit = store.audit(orgId);
        expect(audit.derived).toEqual(audit.kept);
        Object.assign(figures, { chargedMicroUsd: charged, inputTokens: ok.reduce((sum, o) => sum + o.inputTokens!, 0) });
      } finally {
        store.close();
      }

      // No slot is left taken: the gauge reads 0, and LIMIT requests at once are all admitted.
      const metricsText = (await call(s.url, "/metrics", { method: "GET" })).text;
      expect(metricsText).toMatch(/^assay_requests_in_flight 0$/m);

      // The prefix cache held at most its budget while every request added a state, and it evicted to stay there.
      const cacheBytes = sample(metricsText, "assay_prefix_cache_bytes");
      const evictions = sample(metricsText, "assay_prefix_cache_evictions_total");
      expect(cacheBytes).toBeGreaterThan(0);
      expect(cacheBytes).toBeLessThanOrEqual(CACHE_MB * 2 ** 20);
      expect(evictions).toBeGreaterThan(0);
      const mib = (b: number) => Math.round(b / 2 ** 20);
      const quarter = Math.max(1, Math.floor(rss.length / 4));
      Object.assign(figures, {
        prefixCacheBudgetMiB: CACHE_MB,
        prefixCacheBytesAtEnd: cacheBytes,
        prefixCacheEvictions: evictions,
        prefixCacheMisses: sample(metricsText, 'assay_prefix_cache_lookups_total{result="miss"}'),
        rssMiBFirstQuarterMax: mib(Math.max(...rss.slice(0, quarter))),
        rssMiBLastQuarterMax: mib(Math.max(...rss.slice(-quarter))),
        rssMiBPeak: mib(Math.max(...rss)),
      });
      const again = await Promise.all(Array.from({ length: LIMIT }, (_, i) => score(s.url, key, smallBody(i))));
      expect(again.map((r) => r.status)).toEqual(Array(LIMIT).fill(200));

      recordFigures("load", figures);
      const lines = expectNoSecrets(s.output, [key]);
      expect(lines).toBeGreaterThan(ok.length); // one log line per request at least: the search covered them
    },
    FIGURES.loadSeconds * 1000 + 180_000,
  );
});
