/**
 * The compose topology as processes: two real server processes
 * (`node dist/src/main.js`, the real model each) sharing PostgreSQL
 * (127.0.0.1:5432, database `test`, a schema of this run) and Redis
 * (127.0.0.1:6379, a key prefix of this run); the test is the load balancer.
 * Dropped at the end. ASSAY_TEST_DATABASE_URL / ASSAY_TEST_REDIS_URL point
 * elsewhere, as in test/accounts/replicas.test.ts.
 */
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Redis } from "ioredis";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PgAccountsStore } from "../../src/accounts/postgres.js";
import { smallDeployment } from "../engine/engine.js";
import { body, until } from "./helpers.js";
import { startServer, type ServerProcess } from "./server-process.js";
import { detailMessage } from "../../src/errors/catalogue.js";

const PG_URL = process.env.ASSAY_TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";
const REDIS_URL = process.env.ASSAY_TEST_REDIS_URL ?? "redis://127.0.0.1:6379";
const RUN = `${Date.now().toString(36)}_${crypto.randomBytes(3).toString("hex")}`;
const SCHEMA = `assay_ops_${RUN}`;
const PREFIX = `assay-ops-test:${RUN}:`;
const SMALL = smallDeployment();

let replicas: ServerProcess[] = [];
const dirs: string[] = [];
let store: PgAccountsStore;
let key = "";
let orgId = "";

beforeAll(async () => {
  const env = (n: number) => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), `assay-replica-${n}-`));
    dirs.push(dir);
    return {
      ...SMALL,
      ASSAY_DATA_DIR: dir,
      ASSAY_DATABASE_URL: PG_URL,
      ASSAY_DATABASE_SCHEMA: SCHEMA,
      ASSAY_REDIS_URL: REDIS_URL,
      ASSAY_REDIS_PREFIX: PREFIX,
      ASSAY_TEST_FAULTS: "1",
      ASSAY_INTRA_OP_THREADS: "1",
      ASSAY_CONCURRENCY_BEFORE_PURCHASE: "2",
      ASSAY_HOLD_SWEEP_SECONDS: "0",
    };
  };
  replicas = await Promise.all([startServer(env(1)), startServer(env(2))]);
  await Promise.all(replicas.map((r) => r.waitForLog(/default model ready/)));
  store = await PgAccountsStore.open({ connectionString: PG_URL, schema: SCHEMA, startingGrantMicro: 1_000_000, maxConnections: 2 });
  const created = await store.createKey("acme");
  key = created.key;
  orgId = created.org.id;
}, 300_000);

afterAll(async () => {
  for (const r of replicas) {
    if (r.proc.exitCode === null) {
      r.kill("SIGKILL");
      await r.exited;
    }
  }
  await store?.close();
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  await admin.query(`DROP SCHEMA IF EXISTS "${SCHEMA}" CASCADE`);
  await admin.end();
  const redis = new Redis(REDIS_URL, { maxRetriesPerRequest: 2 });
  const keys = await redis.keys(`${PREFIX}*`);
  if (keys.length > 0) await redis.del(...keys);
  await redis.quit();
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

const ask = (r: ServerProcess, state: string) =>
  fetch(`${r.url}/v1/systemone`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify(body(state)),
  });
const fault = async (r: ServerProcess, payload: object) =>
  (await (await fetch(`${r.url}/__test/faults`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(payload) })).json()) as { id: string };
const inFlight = async (r: ServerProcess) => Number(/^assay_requests_in_flight (\d+)/m.exec(await (await fetch(`${r.url}/metrics`)).text())?.[1] ?? -1);

describe("two replicas on PostgreSQL + Redis", () => {
  it("both serve the same organization from one ledger", async () => {
    const ids: string[] = [];
    for (let i = 0; i < 4; i++) {
      const res = await ask(replicas[i % 2]!, `request ${i}`);
      expect(res.status, await res.clone().text()).toBe(200);
      ids.push(res.headers.get("x-request-id")!);
    }
    const settled = (await store.ledger(orgId)).filter((e) => e.kind === "settle");
    expect(settled.map((e) => e.requestId).sort()).toEqual([...ids].sort());
    const audit = await store.audit(orgId);
    expect(audit.derived).toEqual(audit.kept);
    expect(audit.kept.heldMicro).toBe(0);
  });

  it("share the organization's concurrency limit through Redis (2 in flight across replicas → 429)", async () => {
    const stalls = await Promise.all(replicas.map((r) => fault(r, { kind: "stall" })));
    const a = ask(replicas[0]!, "held on replica 1");
    const b = ask(replicas[1]!, "held on replica 2");
    await until(async () => (await inFlight(replicas[0]!)) === 1 && (await inFlight(replicas[1]!)) === 1, "one request in flight on each replica", { ms: 30_000 });
    const c = await ask(replicas[0]!, "third");
    expect(c.status).toBe(429);
    expect(c.headers.get("retry-after")).toBe("1");
    expect(detailMessage(((await c.json()) as { detail: unknown }).detail)).toContain("already has 2 requests in flight");
    await Promise.all(replicas.map((r, i) => fault(r, { release: stalls[i]!.id })));
    expect((await a).status).toBe(200);
    expect((await b).status).toBe(200);
  });

  it("a replica that drains exits 0 while the other keeps serving", async () => {
    const [r1, r2] = replicas as [ServerProcess, ServerProcess];
    r1.kill("SIGTERM");
    expect(await r1.exited).toEqual({ code: 0, signal: null });
    const res = await ask(r2, "after replica 1 left");
    expect(res.status).toBe(200);
    const audit = await store.audit(orgId);
    expect(audit.derived).toEqual(audit.kept);
    expect(audit.kept.heldMicro).toBe(0);
  });
});
