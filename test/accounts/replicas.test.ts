/**
 * The replicas deployment against the real servers on this machine:
 * PostgreSQL (127.0.0.1:5432, database `test`) for accounts and the ledger,
 * Redis (127.0.0.1:6379) for concurrency slots. Every run uses schemas
 * `assay_test_<run>_<n>` and Redis keys under `assay-test:<run>:`, and drops
 * them at the end. ASSAY_TEST_DATABASE_URL / ASSAY_TEST_REDIS_URL point
 * elsewhere; ASSAY_TEST_SKIP_REPLICAS=1 skips this file (say so when you do).
 */
import { spawn, type ChildProcess } from "node:child_process";
import crypto from "node:crypto";
import path from "node:path";
import type { FastifyInstance } from "fastify";
import { Redis } from "ioredis";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chargeFor } from "../../src/accounts/money.js";
import { PgAccountsStore } from "../../src/accounts/postgres.js";
import { RedisLimiter } from "../../src/accounts/redis-limiter.js";
import { buildApp } from "../../src/app.js";
import { runCli } from "../../src/cli/index.js";
import { ROOT, loadConfig } from "../../src/config/index.js";
import { AssayError } from "../../src/errors/catalogue.js";
import { FakeTokenCountPipelineForBilling } from "../http/fake-pipeline.js";
import { validBody } from "../http/helpers.js";
import { describeLedgerContract } from "./ledger-contract.js";
import { detailMessage } from "../../src/errors/catalogue.js";

const PG_URL = process.env.ASSAY_TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";
const REDIS_URL = process.env.ASSAY_TEST_REDIS_URL ?? "redis://127.0.0.1:6379";
const SKIP = process.env.ASSAY_TEST_SKIP_REPLICAS === "1";
const RUN = `${Date.now().toString(36)}_${crypto.randomBytes(3).toString("hex")}`;
const PREFIX = `assay-test:${RUN}:`;
const PRICE = 40_000;

const schemas: string[] = [];
let admin: pg.Client;
let redis: Redis;
let n = 0;

function newSchema(): string {
  const s = `assay_test_${RUN}_${++n}`;
  schemas.push(s);
  return s;
}

async function openStore(schema: string, startingGrantMicro = 1_000_000): Promise<PgAccountsStore> {
  return PgAccountsStore.open({ connectionString: PG_URL, schema, startingGrantMicro, maxConnections: 5 });
}

const env = (schema: string, extra: Record<string, string> = {}) => ({
  LOG_LEVEL: "silent",
  ASSAY_DATABASE_URL: PG_URL,
  ASSAY_DATABASE_SCHEMA: schema,
  ASSAY_REDIS_URL: REDIS_URL,
  ASSAY_REDIS_PREFIX: PREFIX,
  ASSAY_HOLD_SWEEP_SECONDS: "0",
  ...extra,
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Polls `check` until it holds, for as long as the test's own timeout allows: a shorter cap of its own
 * would fail a test that a busy machine only slowed. Past 10 s it says once what it still waits for, so
 * that a test that then times out names it.
 */
async function eventually(check: () => Promise<boolean>, what: string): Promise<void> {
  const warnAt = Date.now() + 10_000;
  let warned = false;
  while (!(await check())) {
    if (!warned && Date.now() > warnAt) {
      warned = true;
      console.warn(`[replicas] still waiting for ${what}`);
    }
    await sleep(25);
  }
}

beforeAll(async () => {
  if (SKIP) return;
  admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  redis = new Redis(REDIS_URL, { maxRetriesPerRequest: 2 });
});

afterAll(async () => {
  if (SKIP) return;
  for (const s of schemas) await admin.query(`DROP SCHEMA IF EXISTS "${s}" CASCADE`);
  await admin.end();
  let cursor = "0";
  do {
    const [next, keys] = await redis.scan(cursor, "MATCH", `${PREFIX}*`, "COUNT", 1000);
    if (keys.length > 0) await redis.del(...keys);
    cursor = next;
  } while (cursor !== "0");
  expect(await redis.keys(`${PREFIX}*`)).toEqual([]);
  await redis.quit();
});

const suite = SKIP ? describe.skip : describe;

if (!SKIP) {
  describeLedgerContract("PostgreSQL", {
    async open(startingGrantMicro) {
      const schema = newSchema();
      const store = await openStore(schema, startingGrantMicro);
      return {
        store,
        async exec(sql) {
          const c = new pg.Client({ connectionString: PG_URL, options: `-c search_path=${schema}` });
          await c.connect();
          try {
            await c.query(sql);
          } finally {
            await c.end();
          }
        },
        close: () => store.close(),
      };
    },
  });
}

suite("PostgreSQL store: keys and migrations", () => {
  it("replicas opening a fresh database together apply each migration once", async () => {
    const schema = newSchema();
    const stores = await Promise.all([openStore(schema), openStore(schema), openStore(schema)]);
    try {
      const { rows } = await admin.query(`SELECT version FROM "${schema}".schema_migrations ORDER BY version`);
      expect(rows.map((r: { version: number }) => r.version)).toEqual([1, 2]);
      // Two replicas creating the first key at once: one key.
      const firsts = await Promise.all(stores.map((s) => s.createFirstKey("local")));
      expect(firsts.filter((k) => k !== null)).toHaveLength(1);
    } finally {
      await Promise.all(stores.map((s) => s.close()));
    }
  });

  it("keys: create, verify, revoke, list; only hashes are stored", async () => {
    const store = await openStore(newSchema());
    try {
      expect(await store.isEmpty()).toBe(true);
      const { key, keyId, org } = await store.createKey("acme");
      expect(await store.isEmpty()).toBe(false);
      expect((await store.verifyKey(key))?.id).toBe(org.id);
      expect(await store.checkKey("sk-assay-" + "Z".repeat(43))).toEqual({ state: "unknown" });
      expect((await store.listKeys("acme")).map((k) => k.id)).toEqual([keyId]);
      const { rows } = await admin.query(`SELECT hash, prefix FROM "${store.schema}".api_keys`);
      expect(JSON.stringify(rows)).not.toContain(key.slice(9));
      expect(await store.revokeKey(keyId)).toBe(true);
      expect(await store.revokeKey(keyId)).toBe(false);
      expect(await store.checkKey(key)).toEqual({ state: "revoked", keyId });
    } finally {
      await store.close();
    }
  });
});

suite("Redis limiter", () => {
  it("counts slots globally across limiters (replicas) and gives them back", async () => {
    const a = new RedisLimiter({ url: REDIS_URL, prefix: PREFIX, leaseMs: 5000 });
    const b = new RedisLimiter({ url: REDIS_URL, prefix: PREFIX, leaseMs: 5000 });
    try {
      const org = `org_${crypto.randomUUID()}`;
      const slots = [await a.acquire(org, 3), await b.acquire(org, 3), await a.acquire(org, 3)];
      expect(slots.every((s) => s !== null)).toBe(true);
      expect(await b.acquire(org, 3)).toBeNull();
      expect(await a.inFlight(org)).toBe(3);
      await slots[0]!.release();
      await slots[0]!.release(); // idempotent
      expect(await b.inFlight(org)).toBe(2);
      const again = await b.acquire(org, 3);
      expect(again).not.toBeNull();
      for (const s of [...slots.slice(1), again]) await s!.release();
      expect(await a.inFlight(org)).toBe(0);
      expect(await redis.exists(a.key(org))).toBe(0);
    } finally {
      await a.close();
      await b.close();
    }
  });

  it("a lease is renewed while its request runs, and a dead replica's slots free themselves", async () => {
    const live = new RedisLimiter({ url: REDIS_URL, prefix: PREFIX, leaseMs: 600 });
    const doomed = new RedisLimiter({ url: REDIS_URL, prefix: PREFIX, leaseMs: 600 });
    try {
      const org = `org_${crypto.randomUUID()}`;
      const kept = await live.acquire(org, 4);
      const lost = [await doomed.acquire(org, 4), await doomed.acquire(org, 4), await doomed.acquire(org, 4)];
      expect(lost.every((s) => s !== null)).toBe(true);
      expect(await live.acquire(org, 4)).toBeNull();
      // The "dead" replica stops renewing and never releases.
      await doomed.close();
      await sleep(1500); // > 2 leases
      expect(await live.inFlight(org)).toBe(1); // only the renewed one is left
      const s = await live.acquire(org, 4);
      expect(s).not.toBeNull();
      await s!.release();
      await kept!.release();
      expect(await live.inFlight(org)).toBe(0);
    } finally {
      await live.close();
      await doomed.close();
    }
  });
});

interface Replica {
  app: FastifyInstance;
  pipeline: FakeTokenCountPipelineForBilling;
  store: PgAccountsStore;
}

async function startReplica(schema: string, extra: Record<string, string> = {}): Promise<Replica> {
  const config = loadConfig(env(schema, extra));
  const store = await openStore(schema, config.startingGrantMicro);
  const pipeline = new FakeTokenCountPipelineForBilling();
  const app = buildApp({ config, pipeline, accounts: store }); // admission from the config: Redis limiter
  await app.ready();
  return { app, pipeline, store };
}

async function stopReplica(r: Replica): Promise<void> {
  await r.app.close();
  await r.store.close();
}

const post = (r: Replica, key: string, body: unknown = validBody) =>
  r.app.inject({ method: "POST", url: "/v1/systemone", headers: { authorization: `Bearer ${key}` }, payload: body as object });

async function cli(schema: string, ...args: string[]) {
  let stdout = "";
  let stderr = "";
  const code = await runCli(["node", "assay", ...args], {
    stdout: (t) => (stdout += t),
    stderr: (t) => (stderr += t),
    env: env(schema),
  });
  return { code, stdout, stderr };
}

suite("two replicas sharing PostgreSQL and Redis", () => {
  it("enforce one global limit: 4 in flight across both, the 5th gets 429 on either; a purchase lifts it to 100", async () => {
    const schema = newSchema();
    const a = await startReplica(schema);
    const b = await startReplica(schema);
    try {
      const created = await cli(schema, "key", "create", "--org", "acme");
      expect(created.code, created.stderr).toBe(0);
      const key = created.stdout.trim();
      const openA = a.pipeline.pause();
      const openB = b.pipeline.pause();
      const inFlight = [post(a, key), post(b, key), post(a, key), post(b, key)];
      await a.pipeline.untilInModel(2);
      await b.pipeline.untilInModel(2);
      for (const r of [a, b]) {
        const res = await post(r, key);
        expect(res.statusCode, res.body).toBe(429);
        expect(res.headers["retry-after"]).toBe("1");
        expect(detailMessage(res.json().detail)).toContain("already has 4 requests in flight");
      }
      // A purchase, recorded by the CLI against the shared database, lifts the limit everywhere.
      const bought = await cli(schema, "credit", "add", "--org", "acme", "--usd", "10");
      expect(bought.code, bought.stderr).toBe(0);
      expect(bought.stdout).toContain("concurrency limit 100 requests in flight");
      const more = [post(a, key), post(b, key), post(a, key)];
      await a.pipeline.untilInModel(4);
      await b.pipeline.untilInModel(3);
      openA();
      openB();
      const all = await Promise.all([...inFlight, ...more]);
      expect(all.map((r) => r.statusCode)).toEqual(Array(7).fill(200));
      const org = (await a.store.findOrg("acme"))!;
      expect(await a.store.balance(org.id, Date.now())).toMatchObject({ creditMicro: 11_000_000 - 7 * 40, heldMicro: 0 });
      const usage = await cli(schema, "usage", "--org", "acme");
      expect(usage.stdout).toContain("charged $0.000280 over 7 requests");
    } finally {
      await stopReplica(a);
      await stopReplica(b);
    }
  });

  it("under concurrent load on both, the sum of charges equals the sum of usage.input_tokens × price exactly", async () => {
    const schema = newSchema();
    const a = await startReplica(schema);
    const b = await startReplica(schema);
    try {
      const { key, org } = await a.store.createKey("acme");
      await b.store.addCredit("acme", "purchase", 2_000_000, null, Date.now());
      for (const r of [a, b]) {
        r.pipeline.inputTokensFor = (e) => Number((e.state as string).slice(2));
        r.pipeline.failAfterAdmitWith = (e) => (Number((e.state as string).slice(2)) % 5 === 0 ? new AssayError("MODEL_FAILED", "x") : null);
      }
      // 100 at once: the limit after a purchase, shared by both replicas.
      const tokens = Array.from({ length: 100 }, (_, i) => 1 + ((i * 7919) % 20_000));
      const results = await Promise.all(
        tokens.map(async (t, i) => {
          for (;;) {
            const res = await post(i % 2 ? a : b, key, { ...validBody, state: `n=${t}` });
            if (res.statusCode !== 429) return res;
            await sleep(10);
          }
        }),
      );
      let expected = 0;
      let ok = 0;
      for (const res of results) {
        if (res.statusCode === 200) {
          ok++;
          expected += chargeFor(res.json().usage.input_tokens, PRICE);
        } else expect(res.statusCode).toBe(502);
      }
      const ledger = await a.store.ledger(org.id);
      const settles = ledger.filter((e) => e.kind === "settle");
      expect(settles).toHaveLength(ok);
      expect(settles.reduce((s, e) => s + e.amountMicro, 0)).toBe(expected);
      expect(ledger.filter((e) => e.kind === "release")).toHaveLength(100 - ok);
      const audit = await b.store.audit(org.id);
      expect(audit.kept).toEqual({ creditMicro: 3_000_000 - expected, heldMicro: 0 });
      expect(audit.derived).toEqual(audit.kept);
    } finally {
      await stopReplica(a);
      await stopReplica(b);
    }
  });

  it("a replica process killed with slots and holds outstanding leaves none behind after expiry", async () => {
    const schema = newSchema();
    const store = await openStore(schema);
    const limiter = new RedisLimiter({ url: REDIS_URL, prefix: PREFIX, leaseMs: 1000 });
    let child: ChildProcess | null = null;
    try {
      const { key, org } = await store.createKey("acme");
      // The Node running the tests, not whichever `node` is first on PATH (the bin's shebang).
      child = spawn(process.execPath, [path.join(ROOT, "node_modules", "vite-node", "dist", "cli.mjs"), path.join(ROOT, "test/accounts/fixtures/replica.ts")], {
        cwd: ROOT,
        env: { ...process.env, ...env(schema, { ASSAY_SLOT_LEASE_SECONDS: "1", ASSAY_HOLD_TTL_SECONDS: "2" }) },
        stdio: ["ignore", "pipe", "pipe"],
      });
      let stderr = "";
      child.stderr!.on("data", (d: Buffer) => (stderr += d.toString()));
      const port = await new Promise<number>((resolve, reject) => {
        let out = "";
        child!.stdout!.on("data", (d: Buffer) => {
          out += d.toString();
          const m = /READY (\d+)/.exec(out);
          if (m) resolve(Number(m[1]));
        });
        child!.once("exit", (code) => reject(new Error(`replica exited (${code}): ${stderr}`)));
      });
      const pending = Array.from({ length: 3 }, () =>
        fetch(`http://127.0.0.1:${port}/v1/systemone`, {
          method: "POST",
          headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
          body: JSON.stringify(validBody),
        }).catch((e: unknown) => e),
      );
      await eventually(async () => (await store.usage("acme", Date.now(), 0))!.openHolds.length === 3, "3 holds");
      expect(await limiter.inFlight(org.id)).toBe(3);
      expect((await store.balance(org.id, Date.now())).heldMicro).toBe(120);

      child.kill("SIGKILL");
      await new Promise((r) => child!.once("exit", r));
      await Promise.all(pending);
      // Dead, but its slots and holds are still there until they expire.
      expect(await limiter.inFlight(org.id)).toBeGreaterThan(0);

      await eventually(async () => (await limiter.inFlight(org.id)) === 0, "slot leases to expire");
      await sleep(2100); // hold TTL
      expect(await store.releaseExpiredHolds(Date.now())).toBe(3); // the sweep
      expect(await store.balance(org.id, Date.now())).toMatchObject({ creditMicro: 1_000_000, heldMicro: 0 });
      const entries = await store.ledger(org.id);
      expect(entries.map((e) => e.kind)).toEqual(["grant", "hold", "hold", "hold", "release", "release", "release"]);
      expect(entries.filter((e) => e.kind === "release").every((e) => e.note === "expired")).toBe(true);
      expect(await redis.exists(limiter.key(org.id))).toBe(0);
    } finally {
      if (child && child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
      await limiter.close();
      await store.close();
    }
  });
});
