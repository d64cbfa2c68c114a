/**
 * Security, against a real server process (SQLite) and the PostgreSQL store:
 *
 *   - keys are stored only as hashes (every row of every table, and the raw
 *     database files, searched for each key);
 *   - the key check ends in a constant-time comparison of equal-length hashes
 *     (crypto.timingSafeEqual, observed on the real store; plus a reading of the
 *     code path — no timing is measured);
 *   - a key of organization A can neither spend nor read organization B;
 *   - a revoked key fails at once (the next request, no cache);
 *   - the server's whole stdout/stderr (LOG_LEVEL=debug) never contains a key
 *     or an authorization header, whatever path the request took (200, 401,
 *     402, 404, 405, 413, 415, 422, 429, a malformed HTTP request, compressed
 *     bodies decoded, too large once decoded and corrupt, shutdown).
 */
import crypto from "node:crypto";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import zlib from "node:zlib";
import Database from "better-sqlite3";
import pg from "pg";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { hashKey, hashesEqual } from "../../src/accounts/keys.js";
import { PgAccountsStore } from "../../src/accounts/postgres.js";
import { DB_FILE, SqliteAccountsStore } from "../../src/accounts/sqlite.js";
import { runCli } from "../../src/cli/index.js";
import { ROOT } from "../../src/config/index.js";
import { PG_URL, RUN, ServerProcess, call, expectNoSecrets, score, smallBody } from "./harness.js";
import { smallDeployment } from "../engine/engine.js";
import { detailMessage } from "../../src/errors/catalogue.js";

let dir: string;
let server: ServerProcess;
const K: Record<"alpha" | "alpha2" | "beta" | "poor", { key: string; keyId: string; orgId: string }> = {} as never;
/** Every key-like string sent to the server in this file. */
const sent = new Set<string>();

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-reliability-security-"));
  const store = new SqliteAccountsStore(dir, { startingGrantMicro: 1_000_000 });
  for (const [name, org] of [["alpha", "alpha"], ["alpha2", "alpha"], ["beta", "beta"]] as const) {
    const c = store.createKey(org);
    K[name] = { key: c.key, keyId: c.keyId, orgId: c.org.id };
  }
  store.close();
  // An organization created with no free credit at all.
  const broke = new SqliteAccountsStore(dir, { startingGrantMicro: 0 });
  const c = broke.createKey("poor");
  K.poor = { key: c.key, keyId: c.keyId, orgId: c.org.id };
  broke.close();
  for (const k of Object.values(K)) sent.add(k.key);
  server = await ServerProcess.start({ ...smallDeployment(), ASSAY_DATA_DIR: dir });
});

afterAll(async () => {
  await server?.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

const cli = async (...args: string[]) => {
  let stdout = "";
  let stderr = "";
  const code = await runCli(["node", "assay", ...args], {
    stdout: (t) => (stdout += t),
    stderr: (t) => (stderr += t),
    env: { ...process.env, ASSAY_DATA_DIR: dir, LOG_LEVEL: "silent" },
  });
  return { code, stdout, stderr };
};

const readStore = <T>(fn: (s: SqliteAccountsStore) => T): T => {
  const s = new SqliteAccountsStore(dir, { startingGrantMicro: 1_000_000 });
  try {
    return fn(s);
  } finally {
    s.close();
  }
};

describe("keys are stored only as hashes", () => {
  it("SQLite: no row of any table and no byte of the database files holds a key; api_keys holds its SHA-256", () => {
    const db = new Database(path.join(dir, DB_FILE), { readonly: true, fileMustExist: true });
    try {
      const tables = db.prepare("SELECT name FROM sqlite_master WHERE type = 'table'").all() as { name: string }[];
      expect(tables.map((t) => t.name)).toContain("api_keys");
      const dump = tables.map((t) => JSON.stringify(db.prepare(`SELECT * FROM "${t.name}"`).all())).join("\n");
      for (const { key } of Object.values(K)) {
        expect(dump).not.toContain(key.slice("sk-assay-".length, "sk-assay-".length + 12));
      }
      const rows = db.prepare("SELECT id, hash, prefix FROM api_keys").all() as { id: string; hash: string; prefix: string }[];
      for (const { key, keyId } of Object.values(K)) {
        const row = rows.find((r) => r.id === keyId)!;
        expect(row.hash).toBe(crypto.createHash("sha256").update(key).digest("hex"));
        expect(row.prefix).toBe(key.slice(0, 13)); // `sk-assay-` + 4 characters, for display
      }
    } finally {
      db.close();
    }
    // The raw files too (WAL included): a key is nowhere on disk.
    for (const f of fs.readdirSync(dir).filter((f) => f.startsWith(DB_FILE))) {
      const bytes = fs.readFileSync(path.join(dir, f));
      for (const { key } of Object.values(K)) expect(bytes.includes(key.slice(9, 30)), `${f} holds a key`).toBe(false);
    }
  });

  it("PostgreSQL: no row of any table in the store's schema holds a key; api_keys holds its SHA-256", async () => {
    const schema = `assay_rel_${RUN}_keys`;
    const admin = new pg.Client({ connectionString: PG_URL });
    await admin.connect();
    const store = await PgAccountsStore.open({ connectionString: PG_URL, schema, startingGrantMicro: 1_000_000, maxConnections: 2 });
    try {
      const made = [await store.createKey("alpha"), await store.createKey("beta"), await store.createKey("alpha")];
      await store.revokeKey(made[2]!.keyId);
      const { rows: tables } = await admin.query<{ table_name: string }>(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = $1",
        [schema],
      );
      expect(tables.map((t) => t.table_name)).toContain("api_keys");
      let dump = "";
      for (const t of tables) dump += JSON.stringify((await admin.query(`SELECT * FROM "${schema}"."${t.table_name}"`)).rows);
      for (const m of made) {
        expect(dump).not.toContain(m.key.slice(9, 21));
        const { rows } = await admin.query<{ hash: string }>(`SELECT hash FROM "${schema}".api_keys WHERE id = $1`, [m.keyId]);
        expect(rows[0]!.hash).toBe(hashKey(m.key));
      }
    } finally {
      await store.close();
      await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await admin.end();
    }
  });
});

describe("the key comparison is constant-time", () => {
  it("a valid key is accepted through crypto.timingSafeEqual on two 32-byte hashes; unequal lengths never compare", () => {
    const spy = vi.spyOn(crypto, "timingSafeEqual");
    try {
      const check = readStore((s) => s.checkKey(K.beta.key));
      expect(check).toMatchObject({ state: "valid", org: { name: "beta" } });
      expect(spy).toHaveBeenCalledTimes(1);
      const [a, b] = spy.mock.calls[0]! as [Buffer, Buffer];
      expect([a.length, b.length]).toEqual([32, 32]);
      expect(Buffer.compare(a, b)).toBe(0);
      // hashesEqual refuses differing lengths before comparing (timingSafeEqual would throw) and compares whole hashes.
      spy.mockClear();
      const h = hashKey(K.beta.key);
      expect(hashesEqual(h, h.slice(0, 62))).toBe(false);
      expect(hashesEqual(h, "")).toBe(false);
      expect(spy).not.toHaveBeenCalled();
      expect(hashesEqual(h, hashKey(K.alpha.key))).toBe(false);
      expect(spy).toHaveBeenCalledTimes(1);
    } finally {
      spy.mockRestore();
    }
  });

  it("code path (read from the source): both stores decide with hashesEqual on the SHA-256, never comparing the key itself", () => {
    const src = (f: string) => fs.readFileSync(path.join(ROOT, f), "utf8");
    expect(src("src/accounts/keys.ts")).toMatch(/crypto\.timingSafeEqual\(a, b\)/);
    // Both stores run the one implementation's key check (store.ts); neither compares keys itself.
    const body = /\*checkKeyIn\(key: string\)[\s\S]*?\n  }\n/.exec(src("src/accounts/store.ts"))![0];
    expect(body).toMatch(/const hash = hashKey\(key\)/);
    expect(body).toMatch(/hashesEqual\(row\.key_hash, hash\)/);
    expect(body).not.toMatch(/(?<!typeof )\bkey\b\s*[!=]==|[!=]==\s*\bkey\b/);
    for (const f of ["src/accounts/sqlite.ts", "src/accounts/postgres.ts"]) {
      expect(src(f), f).not.toMatch(/checkKey|hashKey|(?<!typeof )\bkey\b\s*[!=]==/);
    }
    expect(src("src/http/auth.ts")).not.toMatch(/\bkey\s*[!=]==\s*["'`\w]|[!=]==\s*key\b/);
  });
});

describe("a key of organization A can neither spend nor read organization B", () => {
  it("A's requests are charged to A whatever the request names; B's ledger and balance do not move", async () => {
    const betaBefore = readStore((s) => s.ledger(K.beta.orgId));
    const attempts = [
      {},
      { "x-organization": "beta" },
      { "openai-organization": K.beta.orgId },
      { "x-org-id": K.beta.orgId },
      { api_key: K.beta.key }, // ignored when Authorization is present
    ];
    const answered: string[] = [];
    for (const [i, h] of attempts.entries()) {
      const r = await score(server.url, K.alpha.key, smallBody(i), { ...h, "x-request-id": `iso-${i}` });
      expect(r.status, r.text).toBe(200);
      answered.push(`iso-${i}`);
    }
    // Naming another organization in the body is not a field of the request: an unknown top-level
    // field, ignored like a client's tracing field, so the request is answered and charged to A.
    const inBody = await score(server.url, K.alpha.key, { ...smallBody(0), organization: "beta", org_id: K.beta.orgId }, { "x-request-id": "iso-body" });
    expect(inBody.status, inBody.text).toBe(200);
    answered.push("iso-body");

    const alphaSettled = readStore((s) => s.ledger(K.alpha.orgId)).filter((e) => e.kind === "settle").map((e) => e.requestId);
    expect(alphaSettled).toEqual(answered);
    expect(readStore((s) => s.ledger(K.beta.orgId))).toEqual(betaBefore);
    expect(readStore((s) => s.balance(K.beta.orgId, Date.now()))).toMatchObject({ creditMicro: 1_000_000, heldMicro: 0 });
  });

  it("an organization without credit cannot spend another's: 402 for it while the other is served", async () => {
    const poor = await score(server.url, K.poor.key, smallBody(0));
    expect(poor.status, poor.text).toBe(402);
    expect(detailMessage((poor.json as { detail: unknown }).detail)).toMatch(/organization "poor" has \$0\.000000 available/);
    const alpha = await score(server.url, K.alpha.key, smallBody(0));
    expect(alpha.status).toBe(200);
    expect(readStore((s) => s.ledger(K.poor.orgId)).filter((e) => e.kind === "settle")).toEqual([]);
  });

  it("A at its concurrency limit does not take B's slots; A's purchase does not change what B reads", async () => {
    // 8 of A's at once against A's limit of 4, and B alongside: B is never refused for A's load.
    const a = Array.from({ length: 8 }, (_, i) => score(server.url, K.alpha.key, smallBody(i)));
    const b = Array.from({ length: 3 }, (_, i) => score(server.url, K.beta.key, smallBody(i)));
    const [ra, rb] = [await Promise.all(a), await Promise.all(b)];
    expect(ra.filter((r) => r.status === 429).length).toBeGreaterThan(0);
    expect(ra.every((r) => r.status === 200 || r.status === 429)).toBe(true);
    expect(rb.map((r) => r.status)).toEqual([200, 200, 200]);

    const bought = await cli("credit", "add", "--org", "alpha", "--usd", "5");
    expect(bought.code, bought.stderr).toBe(0);
    const limits = async (key: string) => ((await call(server.url, "/v1/limits", { method: "GET", headers: { authorization: `Bearer ${key}` } })).json as { max_concurrent_requests: number }).max_concurrent_requests;
    expect(await limits(K.alpha.key)).toBe(100);
    expect(await limits(K.beta.key)).toBe(4);
    // The unauthenticated operator routes carry no organization at all.
    const metrics = (await call(server.url, "/metrics", { method: "GET" })).text;
    for (const k of Object.values(K)) expect(metrics).not.toContain(k.orgId);
    expect(metrics).not.toMatch(/alpha|beta|poor/);
  });
});

describe("revoked keys", () => {
  it("fail at once: the request right after `assay key revoke` is 401, while the organization's other key still works", async () => {
    expect((await score(server.url, K.alpha2.key, smallBody(0))).status).toBe(200);
    const revoked = await cli("key", "revoke", K.alpha2.keyId);
    expect(revoked.code, revoked.stderr).toBe(0);
    const r = await score(server.url, K.alpha2.key, smallBody(0));
    expect(r.status).toBe(401);
    expect(detailMessage((r.json as { detail: unknown }).detail)).toMatch(/revoked/);
    expect(r.headers.get("www-authenticate")).toBe("Bearer");
    const models = await call(server.url, "/v1/models", { method: "GET", headers: { authorization: `Bearer ${K.alpha2.key}` } });
    expect(models.status).toBe(401);
    expect((await score(server.url, K.alpha.key, smallBody(0))).status).toBe(200);
  });
});

describe("logs never contain a key or the authorization header", () => {
  it("after requests that carry keys every way and fail every way, and a shutdown, the whole server output has none", async () => {
    const u = server.url;
    const json = { "content-type": "application/json" };
    const fake = `sk-assay-${crypto.randomBytes(32).toString("base64url")}`;
    sent.add(fake);
    const tries: [string, Parameters<typeof call>[2]][] = [
      ["/v1/systemone", { headers: { ...json, authorization: `Bearer ${fake}` }, body: JSON.stringify(smallBody(0)) }], // 401 unknown
      ["/v1/systemone", { headers: { ...json, authorization: `Bearer ${K.alpha.key}x` }, body: "{}" }], // 401 malformed
      ["/v1/systemone", { headers: { ...json, authorization: `Basic ${Buffer.from(`u:${K.alpha.key}`).toString("base64")}` }, body: "{}" }],
      ["/v1/systemone", { headers: { ...json, api_key: K.beta.key }, body: JSON.stringify(smallBody(1)) }], // 200 via api_key
      ["/v1/systemone", { headers: { ...json, "x-api-key": K.beta.key, authorization: `Bearer ${K.beta.key}` }, body: "not json" }], // 422
      ["/v1/systemone", { headers: { "content-type": "text/plain", authorization: `Bearer ${K.beta.key}` }, body: "{}" }], // 415
      ["/v1/systemone", { headers: { ...json, authorization: `Bearer ${K.beta.key}` }, body: `{"state":"${"x".repeat(1_100_000)}"}` }], // 413
      [`/v1/systemone?api_key=${K.beta.key}`, { headers: { ...json, authorization: `Bearer ${K.beta.key}` }, body: JSON.stringify(smallBody(2)) }],
      ["/v1/systemone", { headers: { ...json, authorization: `Bearer ${K.beta.key}`, cookie: `session=${K.beta.key}`, "proxy-authorization": `Bearer ${K.beta.key}` }, body: JSON.stringify(smallBody(3)) }],
      // The key inside the request's own content: scored, never logged.
      ["/v1/systemone", { headers: { ...json, authorization: `Bearer ${K.beta.key}` }, body: JSON.stringify({ ...smallBody(0), state: `my key is ${K.alpha.key}` }) }],
      [`/v1/models?key=${K.alpha.key}`, { method: "GET", headers: { authorization: `Bearer ${K.alpha.key}` } }],
      ["/v1/systemone", { method: "GET", headers: { authorization: `Bearer ${K.alpha.key}` } }], // 405
      ["/v1/nope", { headers: { authorization: `Bearer ${K.alpha.key}` }, body: "{}" }], // 404
      ["/v1/systemone", { headers: { ...json, authorization: `Bearer ${K.poor.key}` }, body: JSON.stringify(smallBody(0)) }], // 402
      // Compressed: decoded (debug log line), too large once decoded, corrupt; keys in the body and the headers.
      ["/v1/systemone", { headers: { ...json, authorization: `Bearer ${K.beta.key}`, "content-encoding": "gzip" }, body: new Uint8Array(zlib.gzipSync(JSON.stringify({ ...smallBody(1), state: `key ${K.alpha.key}` }))) }], // 200
      ["/v1/systemone", { headers: { ...json, authorization: `Bearer ${K.beta.key}`, "content-encoding": "gzip" }, body: new Uint8Array(zlib.gzipSync(Buffer.alloc(4 * 2 ** 20, K.alpha.key))) }], // 413
      ["/v1/systemone", { headers: { ...json, authorization: `Bearer ${K.beta.key}`, "content-encoding": "br" }, body: `${K.alpha.key} is not brotli` }], // 422
    ];
    const statuses: number[] = [];
    for (const [route, init] of tries) statuses.push((await call(u, route, init)).status);
    expect(statuses).toEqual([401, 401, 401, 200, 422, 415, 413, 200, 200, 200, 200, 405, 404, 402, 200, 413, 422]);

    // A request the HTTP parser refuses outright (bad Content-Length), with a key in it.
    const raw = await new Promise<string>((resolve) => {
      const sock = net.connect(server.port, "127.0.0.1", () => {
        sock.write(`POST /v1/systemone HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${K.beta.key}\r\nContent-Length: nope\r\n\r\n`);
      });
      let got = "";
      sock.on("data", (d) => (got += d.toString()));
      sock.on("close", () => resolve(got));
      sock.on("error", () => resolve(got));
    });
    expect(raw).toMatch(/^HTTP\/1\.1 400/);

    await server.stop(); // the drain and shutdown lines are part of the output too
    const lines = expectNoSecrets(server.output, [...sent]);
    expect(lines).toBeGreaterThan(30);
    // The output was not empty of what matters: requests were logged with their organization, never their key.
    expect(server.output).toMatch(/"org":"beta"/);
    expect(server.output).toMatch(/"status":401/);
  });
});
