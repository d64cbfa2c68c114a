/**
 * Faults, each against a real server process with the real model:
 *
 *   - an inference worker killed mid-request (the test-only fault hook,
 *     ASSAY_TEST_FAULTS=1, driven over HTTP): that request 502 and not charged,
 *     the requests around it answered, the pool serving again within 5 s;
 *   - the server SIGKILLed under load (PostgreSQL + Redis, short leases) and
 *     restarted: after expiry no slot and no hold is left, every charge belongs
 *     to a request that was answered or cut off, the balances audit clean;
 *   - the database unreachable (a TCP proxy this test owns between the server
 *     and PostgreSQL, stopped and started again): 503 with Retry-After, never
 *     500, nothing charged, service back once the database is.
 */
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { Redis } from "ioredis";
import pg from "pg";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { chargeFor } from "../../src/accounts/money.js";
import { PgAccountsStore } from "../../src/accounts/postgres.js";
import { loadPrices } from "../../src/accounts/prices.js";
import { RedisLimiter } from "../../src/accounts/redis-limiter.js";
import { SqliteAccountsStore } from "../../src/accounts/sqlite.js";
import { ROOT } from "../../src/config/index.js";
import type { LedgerEntry } from "../../src/accounts/types.js";
import {
  FIGURES,
  FULL,
  PG_URL,
  REDIS_URL,
  RUN,
  ServerProcess,
  call,
  expectNoSecrets,
  recordFigures,
  sample,
  score,
  sleep,
  smallBody,
  until,
} from "./harness.js";
import { smallDeployment } from "../engine/engine.js";
import { detailMessage } from "../../src/errors/catalogue.js";

const PRICE = loadPrices(path.join(ROOT, "models", "prices.json")).priceFor("judge-latest", "general");
const PREFIX = `assay-reliability:${RUN}:`;
const SMALL = smallDeployment();
const schemas: string[] = [];
const servers: ServerProcess[] = [];
const keys: string[] = [];
let admin: pg.Client;
let redis: Redis;

const newSchema = (what: string) => {
  const s = `assay_rel_${RUN}_${what}`;
  schemas.push(s);
  return s;
};

async function start(env: Record<string, string>): Promise<ServerProcess> {
  const s = await ServerProcess.start({ ...SMALL, ...env });
  servers.push(s);
  return s;
}

beforeAll(async () => {
  admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  redis = new Redis(REDIS_URL, { maxRetriesPerRequest: 2 });
});

afterEach(async () => {
  for (const s of servers) await s.stop();
});

afterAll(async () => {
  // Every server of this file, whatever it went through, never logged a key.
  if (keys.length > 0) expectNoSecrets(servers.map((s) => s.output).join("\n"), keys);
  for (const s of schemas) await admin.query(`DROP SCHEMA IF EXISTS "${s}" CASCADE`);
  await admin.end();
  const left = await redis.keys(`${PREFIX}*`);
  if (left.length > 0) await redis.del(...left);
  await redis.quit();
});

/** Every hold is closed exactly once; the kept balance equals the one recomputed from the ledger. */
function expectClosedHolds(ledger: LedgerEntry[]): void {
  const holds = ledger.filter((e) => e.kind === "hold").map((e) => e.holdId);
  const closes = ledger.filter((e) => e.kind === "settle" || e.kind === "release").map((e) => e.holdId);
  expect(new Set(holds).size).toBe(holds.length);
  expect([...closes].sort()).toEqual([...holds].sort());
}

describe("an inference worker killed mid-request", () => {
  it("that request is 502 and not charged, the requests queued around it succeed, and the pool serves again within 5 s", async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-reliability-worker-"));
    try {
      const store = new SqliteAccountsStore(dir, { startingGrantMicro: 1_000_000 });
      const { key, org } = store.createKey("acme");
      keys.push(key);
      store.close();
      const s = await start({ ASSAY_DATA_DIR: dir, ASSAY_TEST_FAULTS: "1" });
      const metrics = async () => (await call(s.url, "/metrics", { method: "GET" })).text;
      const fault = async (payload: object) => {
        const r = await call(s.url, "/__test/faults", { headers: { "content-type": "application/json" }, body: JSON.stringify(payload) });
        expect(r.status, r.text).toBe(200);
        return r.json as { id: string };
      };

      // S stalls inside the worker (deterministically, on an Atomics flag), so A and B queue behind it.
      const dispatched = sample(await metrics(), "assay_inference_queue_wait_seconds_count");
      const stall = await fault({ kind: "stall" });
      const S = score(s.url, key, smallBody(0), { "x-request-id": "worker-S" });
      await until(async () => sample(await metrics(), "assay_inference_queue_wait_seconds_count") === dispatched + 1, "S to reach the worker", { ms: 30_000 });
      await fault({ kind: "exit" }); // the next task to ask for the model: A, whose worker thread will exit under it
      const A = score(s.url, key, smallBody(1), { "x-request-id": "worker-A" });
      await until(async () => sample(await metrics(), "assay_inference_queue_depth") === 1, "A to queue", { ms: 30_000 });
      const B = score(s.url, key, smallBody(2), { "x-request-id": "worker-B" });
      await until(async () => sample(await metrics(), "assay_inference_queue_depth") === 2, "B to queue", { ms: 30_000 });
      await fault({ release: stall.id });

      const [rs, ra] = await Promise.all([S, A]);
      const diedAt = performance.now();
      expect(rs.status, rs.text).toBe(200);
      expect(ra.status, ra.text).toBe(502);
      expect(detailMessage((ra.json as { detail: unknown }).detail)).toMatch(/worker failed and was restarted/);
      expect(ra.headers.get("x-request-id")).toBe("worker-A");
      // B waited in the queue while the replacement thread reloaded the model.
      const rb = await B;
      const recoveredMs = performance.now() - diedAt;
      recordFigures("worker-killed", { recoveredMs: Math.round(recoveredMs) });
      // The recovery time is a recorded figure, not an assertion: on a loaded 2-core machine it races
      // the clock (issue 17). What is asserted is the order of events: B answered after the restart.
      expect(rb.status, rb.text).toBe(200);
      const rc = await score(s.url, key, smallBody(3));
      expect(rc.status, rc.text).toBe(200);
      expect(sample(await metrics(), "assay_worker_restarts_total")).toBe(1);

      const check = new SqliteAccountsStore(dir, { startingGrantMicro: 1_000_000 });
      try {
        const ledger = check.ledger(org.id);
        expectClosedHolds(ledger);
        const released = ledger.filter((e) => e.kind === "release");
        expect(released.map((e) => [e.requestId, e.note])).toEqual([["worker-A", "error 502 MODEL_FAILED"]]);
        const settled = ledger.filter((e) => e.kind === "settle");
        const answered = [rs, rb, rc];
        expect(settled).toHaveLength(3);
        const expected = answered.reduce((sum, r) => sum + chargeFor((r.json as { usage: { input_tokens: number } }).usage.input_tokens, PRICE), 0);
        expect(settled.reduce((sum, e) => sum + e.amountMicro, 0)).toBe(expected);
        expect(check.balance(org.id, Date.now())).toMatchObject({ creditMicro: 1_000_000 - expected, heldMicro: 0 });
        const audit = check.audit(org.id);
        expect(audit.derived).toEqual(audit.kept);
      } finally {
        check.close();
      }
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("the server process SIGKILLed under load and restarted (PostgreSQL + Redis)", () => {
  it("leaves no slot and no hold after expiry; every charge is a request answered or cut off; balances audit clean", async () => {
    const schema = newSchema("kill");
    const env = {
      ASSAY_DATABASE_URL: PG_URL,
      ASSAY_DATABASE_SCHEMA: schema,
      ASSAY_REDIS_URL: REDIS_URL,
      ASSAY_REDIS_PREFIX: PREFIX,
      ASSAY_SLOT_LEASE_SECONDS: "1",
      ASSAY_HOLD_TTL_SECONDS: "3",
    };
    const store = await PgAccountsStore.open({ connectionString: PG_URL, schema, startingGrantMicro: 1_000_000, maxConnections: 3 });
    const limiter = new RedisLimiter({ url: REDIS_URL, prefix: PREFIX, leaseMs: 1000 });
    try {
      const { key, org } = await store.createKey("acme");
      keys.push(key);
      const first = await start(env);

      // 8 senders against a limit of 4 until the process dies under them.
      const answered = new Map<string, { status: number; inputTokens: number | null }>();
      const cutOff = new Set<string>();
      let n = 0;
      let killed = false;
      const sender = async (w: number) => {
        while (!killed) {
          const id = `kill-${w}-${n++}`;
          try {
            const r = await score(first.url, key, smallBody(n), { "x-request-id": id });
            const body = r.json as { usage?: { input_tokens: number } } | null;
            answered.set(id, { status: r.status, inputTokens: r.status === 200 ? body!.usage!.input_tokens : null });
            if (r.status === 429) await sleep(25);
          } catch {
            cutOff.add(id);
          }
        }
      };
      const senders = Array.from({ length: 8 }, (_, w) => sender(w));
      await sleep(FIGURES.loadBeforeKillSeconds * 1000);
      // Kill it while it holds credit for requests in the model.
      const openHolds = async () => Number((await admin.query(`SELECT count(*) AS n FROM "${schema}".open_holds`)).rows[0].n);
      await until(async () => (await openHolds()) > 0, "a credit hold to be open", { ms: 30_000 });
      await first.kill("SIGKILL");
      killed = true;
      await Promise.all(senders);
      const holdsAtKill = await openHolds();
      const slotsAtKill = await redis.zcard(limiter.key(org.id));
      expect(holdsAtKill).toBeGreaterThan(0);
      expect(cutOff.size).toBeGreaterThan(0);
      for (const r of answered.values()) expect([200, 429]).toContain(r.status);

      // Restarted (same database, same Redis) with a 1 s sweep. Leases (1 s) and holds (3 s) expire on their own.
      const second = await start({ ...env, ASSAY_HOLD_SWEEP_SECONDS: "1" });
      await until(async () => (await redis.exists(limiter.key(org.id))) === 0, "the dead process's slot leases to expire", { ms: 10_000 });
      await until(async () => (await openHolds()) === 0, "the dead process's holds to expire and be swept", { ms: 15_000 });
      // The limit is whole again: 4 at once are all admitted.
      const after = await Promise.all(Array.from({ length: 4 }, (_, i) => score(second.url, key, smallBody(i), { "x-request-id": `after-${i}` })));
      expect(after.map((r) => r.status)).toEqual([200, 200, 200, 200]);
      after.forEach((r, i) => answered.set(`after-${i}`, { status: 200, inputTokens: (r.json as { usage: { input_tokens: number } }).usage.input_tokens }));
      expect(await redis.exists(limiter.key(org.id))).toBe(0);

      const ledger = await store.ledger(org.id);
      expectClosedHolds(ledger);
      const settles = ledger.filter((e) => e.kind === "settle");
      const ok = [...answered].filter(([, r]) => r.status === 200);
      // Every 200 was charged exactly its usage × price.
      const byRequest = new Map(settles.map((e) => [e.requestId, e]));
      for (const [id, r] of ok) expect(byRequest.get(id)?.amountMicro, id).toBe(chargeFor(r.inputTokens!, PRICE));
      // A charge without a 200 can only be a request whose connection the kill cut (settled, then killed before the reply left).
      for (const e of settles) if (!ok.some(([id]) => id === e.requestId)) expect(cutOff.has(e.requestId!), e.requestId!).toBe(true);
      // The holds the dead process left were released as expired: no charge.
      const expired = ledger.filter((e) => e.kind === "release" && e.note === "expired");
      expect(expired.length).toBeGreaterThanOrEqual(1);
      for (const e of expired) expect(cutOff.has(e.requestId!), e.requestId!).toBe(true);
      const charged = settles.reduce((sum, e) => sum + e.amountMicro, 0);
      expect(await store.balance(org.id, Date.now())).toMatchObject({ creditMicro: 1_000_000 - charged, heldMicro: 0 });
      const audit = await store.audit(org.id);
      expect(audit.derived).toEqual(audit.kept);
      recordFigures("sigkill-restart", {
        answered200: ok.length - 4,
        cutOff: cutOff.size,
        holdsOpenAtKill: holdsAtKill,
        slotsTakenAtKill: slotsAtKill,
        releasedExpired: expired.length,
        chargedWithoutReply: settles.filter((e) => cutOff.has(e.requestId!)).length,
      });
    } finally {
      await limiter.close();
      await store.close();
    }
  });
});

/**
 * A TCP proxy between the server and PostgreSQL that the test can cut
 * (connections refused and reset) or freeze (connections stay open, nothing
 * comes back: a network partition), and restore.
 */
class CuttableProxy {
  private server: net.Server | null = null;
  private readonly sockets = new Set<net.Socket>();
  private frozen = false;
  port = 0;

  constructor(
    private readonly targetHost: string,
    private readonly targetPort: number,
  ) {}

  async up(): Promise<void> {
    const server = net.createServer((client) => {
      this.sockets.add(client);
      client.on("close", () => this.sockets.delete(client));
      client.on("error", () => {});
      if (this.frozen) return; // accepted, never answered
      const upstream = net.connect(this.targetPort, this.targetHost);
      for (const s of [client, upstream]) {
        this.sockets.add(s);
        s.on("close", () => this.sockets.delete(s));
        s.on("error", () => {});
      }
      client.pipe(upstream);
      upstream.pipe(client);
      client.on("close", () => upstream.destroy());
      upstream.on("close", () => client.destroy());
    });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(this.port, "127.0.0.1", () => resolve());
    });
    this.frozen = false;
    this.port = (server.address() as net.AddressInfo).port;
    this.server = server;
  }

  /** The database stops answering: open connections and new ones hang, with no error and no reset. */
  freeze(): void {
    this.frozen = true;
    for (const s of this.sockets) {
      s.unpipe();
      s.pause();
    }
  }

  /** The partition heals: the hung connections are reset, new ones are forwarded again. */
  thaw(): void {
    this.frozen = false;
    for (const s of this.sockets) s.destroy();
  }

  /** The database vanishes: no new connections, and every open one is cut. */
  async down(): Promise<void> {
    const server = this.server;
    this.server = null;
    for (const s of this.sockets) s.destroy();
    if (server) await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

describe("the database unavailable (PostgreSQL mode)", () => {
  it("503 with Retry-After, never 500, nothing charged — including a request whose settle fails — and recovery when it returns", async () => {
    const target = new URL(PG_URL);
    const proxy = new CuttableProxy(target.hostname, Number(target.port || 5432));
    await proxy.up();
    const viaProxy = new URL(PG_URL);
    viaProxy.port = String(proxy.port);
    const schema = newSchema("dbdown");
    const store = await PgAccountsStore.open({ connectionString: PG_URL, schema, startingGrantMicro: 1_000_000, maxConnections: 2 });
    try {
      const { key, org } = await store.createKey("acme");
      keys.push(key);
      const s = await start({
        ASSAY_DATABASE_URL: viaProxy.toString(),
        ASSAY_DATABASE_SCHEMA: schema,
        ASSAY_REDIS_URL: REDIS_URL,
        ASSAY_REDIS_PREFIX: PREFIX,
        ASSAY_TEST_FAULTS: "1",
        ASSAY_HOLD_TTL_SECONDS: "2",
        ASSAY_HOLD_SWEEP_SECONDS: "1",
      });
      const fault = async (payload: object) =>
        (await call(s.url, "/__test/faults", { headers: { "content-type": "application/json" }, body: JSON.stringify(payload) })).json as { id: string };

      const before = await score(s.url, key, smallBody(0), { "x-request-id": "db-before" });
      expect(before.status, before.text).toBe(200);
      const refusedMs: number[] = [];

      // In flight when the database goes: held, in the model (stalled), then it cannot settle.
      const stall = await fault({ kind: "stall" });
      const mid = score(s.url, key, smallBody(1), { "x-request-id": "db-mid" });
      await until(async () => Number((await admin.query(`SELECT count(*) AS n FROM "${schema}".open_holds`)).rows[0].n) === 1, "the hold of the request in flight", { ms: 30_000 });
      await proxy.down();
      await fault({ release: stall.id });
      const rmid = await mid;
      expect(rmid.status, rmid.text).toBe(503);
      expect(rmid.headers.get("retry-after")).toBe("1");
      expect(detailMessage((rmid.json as { detail: unknown }).detail)).toMatch(/not charged|retry/);

      // While it is down: every request is refused with 503 + Retry-After, at once or after the connect timeout.
      const during: number[] = [];
      for (let i = 0; i < 5; i++) {
        const r = await score(s.url, key, smallBody(i), { "x-request-id": `db-down-${i}` });
        during.push(r.status);
        refusedMs.push(Math.round(r.ms));
        expect(r.status, r.text).toBe(503);
        expect(r.headers.get("retry-after")).toBe("1");
        expect((r.json as { detail: unknown }).detail).toEqual({ error_type: "service_unavailable", message: expect.any(String) });
      }
      // Probes stay up: the process is alive, it is the store that is not.
      expect((await call(s.url, "/healthz", { method: "GET" })).status).toBe(200);

      await proxy.up();
      let recovered: Awaited<ReturnType<typeof score>> | null = null;
      await until(async () => {
        const r = await score(s.url, key, smallBody(2), { "x-request-id": `db-back-${Date.now()}` });
        expect([200, 503]).toContain(r.status);
        if (r.status === 200) recovered = r;
        return r.status === 200;
      }, "the service to recover once the database is back", { ms: 60_000 });
      expect(recovered).not.toBeNull();

      // The mid-request hold could not be settled nor released while the database was away: it expires, no charge.
      await until(async () => Number((await admin.query(`SELECT count(*) AS n FROM "${schema}".open_holds`)).rows[0].n) === 0, "the orphaned hold to expire", { ms: 30_000 });
      const ledger = await store.ledger(org.id);
      expectClosedHolds(ledger);
      const settles = ledger.filter((e) => e.kind === "settle");
      expect(settles.map((e) => e.requestId)).toEqual(["db-before", recovered!.headers.get("x-request-id")]);
      const mids = ledger.filter((e) => e.requestId === "db-mid").map((e) => [e.kind, e.note]);
      expect(mids).toEqual([["hold", null], ["release", "expired"]]);
      recordFigures("database-cut", { refused503: during.length + 1, refusedMs, inFlightSettleFailed: "503, hold expired unclaimed" });
      const charged = [before, recovered!].reduce((sum, r) => sum + chargeFor((r.json as { usage: { input_tokens: number } }).usage.input_tokens, PRICE), 0);
      expect(await store.balance(org.id, Date.now())).toMatchObject({ creditMicro: 1_000_000 - charged, heldMicro: 0 });
      const audit = await store.audit(org.id);
      expect(audit.derived).toEqual(audit.kept);
    } finally {
      await proxy.down();
      await store.close();
    }
  });
});

describe("the database stops answering (PostgreSQL mode, connections hang)", () => {
  it("requests get 503 with Retry-After after the store's timeouts instead of hanging; nothing charged; recovery when it answers again", async () => {
    const target = new URL(PG_URL);
    const proxy = new CuttableProxy(target.hostname, Number(target.port || 5432));
    await proxy.up();
    const viaProxy = new URL(PG_URL);
    viaProxy.port = String(proxy.port);
    const schema = newSchema("dbhang");
    const store = await PgAccountsStore.open({ connectionString: PG_URL, schema, startingGrantMicro: 1_000_000, maxConnections: 2 });
    try {
      const { key, org } = await store.createKey("acme");
      keys.push(key);
      const s = await start({ ASSAY_DATABASE_URL: viaProxy.toString(), ASSAY_DATABASE_SCHEMA: schema, ASSAY_REDIS_URL: REDIS_URL, ASSAY_REDIS_PREFIX: PREFIX });
      const before = await score(s.url, key, smallBody(0), { "x-request-id": "hang-before" });
      expect(before.status, before.text).toBe(200);

      proxy.freeze();
      // Not a timing assertion: a bound far above the store's timeouts, so a hung request fails the test instead of stalling it.
      const refusedMs: number[] = [];
      for (let i = 0; i < (FULL ? 3 : 1); i++) {
        const r = await score(s.url, key, smallBody(i), { "x-request-id": `hang-${i}` }, AbortSignal.timeout(45_000));
        refusedMs.push(Math.round(r.ms));
        expect(r.status, r.text).toBe(503);
        expect(r.headers.get("retry-after")).toBe("1");
      }
      recordFigures("database-frozen", { refusedMs });

      proxy.thaw();
      let recovered: Awaited<ReturnType<typeof score>> | null = null;
      await until(async () => {
        const r = await score(s.url, key, smallBody(1), { "x-request-id": `hang-back-${Date.now()}` }, AbortSignal.timeout(45_000));
        expect([200, 503]).toContain(r.status);
        if (r.status === 200) recovered = r;
        return r.status === 200;
      }, "the service to recover once the database answers", { ms: 60_000 });

      const ledger = await store.ledger(org.id);
      expectClosedHolds(ledger);
      const settles = ledger.filter((e) => e.kind === "settle");
      expect(settles.map((e) => e.requestId)).toEqual(["hang-before", recovered!.headers.get("x-request-id")]);
      const audit = await store.audit(org.id);
      expect(audit.derived).toEqual(audit.kept);
      expect(audit.kept.heldMicro).toBe(0);
    } finally {
      await proxy.down();
      await store.close();
    }
  });
});

describe("Redis (the concurrency slots) stops answering, then goes away", () => {
  it("503 with Retry-After in both cases instead of a hang, nothing charged; recovery when it is back", async () => {
    const target = new URL(REDIS_URL);
    const proxy = new CuttableProxy(target.hostname, Number(target.port || 6379));
    await proxy.up();
    const viaProxy = new URL(REDIS_URL);
    viaProxy.port = String(proxy.port);
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-reliability-redis-"));
    try {
      const store = new SqliteAccountsStore(dir, { startingGrantMicro: 1_000_000 });
      const { key, org } = store.createKey("acme");
      keys.push(key);
      store.close();
      const s = await start({ ASSAY_DATA_DIR: dir, ASSAY_REDIS_URL: viaProxy.toString(), ASSAY_REDIS_PREFIX: PREFIX });
      const ok = async (id: string) => {
        let got: Awaited<ReturnType<typeof score>> | null = null;
        await until(async () => {
          const r = await score(s.url, key, smallBody(1), { "x-request-id": `${id}-${Date.now()}` }, AbortSignal.timeout(45_000));
          expect([200, 503]).toContain(r.status);
          if (r.status === 200) got = r;
          return r.status === 200;
        }, "a 200 with Redis reachable", { ms: 60_000 });
        return got!;
      };
      const answered = [await ok("redis-before")];
      const refusedMs: Record<string, number[]> = {};
      const refused = async (phase: string) => {
        for (let i = 0; i < (FULL ? 3 : 1); i++) {
          const r = await score(s.url, key, smallBody(i), { "x-request-id": `${phase}-${i}` }, AbortSignal.timeout(45_000));
          (refusedMs[phase] ??= []).push(Math.round(r.ms));
          expect(r.status, `${phase}: ${r.text}`).toBe(503);
          expect(r.headers.get("retry-after")).toBe("1");
        }
      };
      proxy.freeze();
      await refused("redis-frozen");
      proxy.thaw();
      answered.push(await ok("redis-thawed"));
      await proxy.down();
      await refused("redis-down");
      await proxy.up();
      answered.push(await ok("redis-back"));
      recordFigures("redis-frozen-then-cut", { refusedMs });

      const check = new SqliteAccountsStore(dir, { startingGrantMicro: 1_000_000 });
      try {
        const ledger = check.ledger(org.id);
        expectClosedHolds(ledger);
        expect(ledger.filter((e) => e.kind === "settle").map((e) => e.requestId)).toEqual(answered.map((r) => r.headers.get("x-request-id")));
        const audit = check.audit(org.id);
        expect(audit.derived).toEqual(audit.kept);
        expect(audit.kept.heldMicro).toBe(0);
      } finally {
        check.close();
      }
    } finally {
      await proxy.down();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
