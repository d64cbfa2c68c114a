import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import Database from "better-sqlite3";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { KEY_PATTERN, hashKey } from "../../src/accounts/keys.js";
import { MIGRATIONS } from "../../src/accounts/migrations.js";
import { DB_FILE, SqliteAccountsStore } from "../../src/accounts/sqlite.js";

let dir: string;
let store: SqliteAccountsStore;

beforeEach(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-accounts-"));
  store = new SqliteAccountsStore(dir);
});
afterEach(() => {
  store.close();
  vi.restoreAllMocks();
  fs.rmSync(dir, { recursive: true, force: true });
});

describe("SqliteAccountsStore", () => {
  it("creates the database under the data dir, creating the dir", () => {
    store.close();
    const nested = path.join(dir, "a", "b");
    store = new SqliteAccountsStore(nested);
    expect(fs.existsSync(path.join(nested, DB_FILE))).toBe(true);
  });

  it("createKey creates the organization and returns a well-formed key", () => {
    expect(store.isEmpty()).toBe(true);
    const { key, keyId, org } = store.createKey("acme");
    expect(key).toMatch(KEY_PATTERN);
    expect(key).toHaveLength("sk-assay-".length + 43);
    expect(keyId).toMatch(/^key_/);
    expect(org).toMatchObject({ name: "acme", maxConcurrency: null, hasPurchased: false });
    expect(store.ensureOrg("acme").id).toBe(org.id);
    expect(store.isEmpty()).toBe(false);
  });

  it("ensureOrg is idempotent and trims names; refuses empty ones", () => {
    const a = store.ensureOrg("team");
    const b = store.ensureOrg("  team ");
    expect(b).toEqual(a);
    expect(() => store.ensureOrg("   ")).toThrow(/empty/);
    expect(() => store.ensureOrg("x".repeat(101))).toThrow(/at most/);
    expect(() => store.ensureOrg("a\nb")).toThrow(/control/);
  });

  it("keys of the same org are distinct and both verify to it", () => {
    const one = store.createKey("acme");
    const two = store.createKey("acme");
    expect(one.key).not.toBe(two.key);
    expect(store.verifyKey(one.key)?.id).toBe(one.org.id);
    expect(store.verifyKey(two.key)?.id).toBe(one.org.id);
    expect(store.listKeys("acme").map((k) => k.id)).toEqual([one.keyId, two.keyId]);
  });

  it("verifyKey refuses unknown, altered and malformed keys", () => {
    const { key } = store.createKey("acme");
    const last = key.at(-1) === "A" ? "B" : "A";
    expect(store.verifyKey(key.slice(0, -1) + last)).toBeNull();
    expect(store.verifyKey("sk-assay-" + "Z".repeat(43))).toBeNull();
    expect(store.verifyKey("")).toBeNull();
    expect(store.verifyKey(key + "x")).toBeNull();
    expect(store.verifyKey(key.toUpperCase())).toBeNull();
    expect(store.checkKey("sk-assay-" + "Z".repeat(43))).toEqual({ state: "unknown" });
  });

  it("decides with crypto.timingSafeEqual on the stored and computed hashes", () => {
    const { key } = store.createKey("acme");
    const spy = vi.spyOn(crypto, "timingSafeEqual");
    expect(store.verifyKey(key)).not.toBeNull();
    expect(spy).toHaveBeenCalledTimes(1);
    const [a, b] = spy.mock.calls[0]!;
    expect(Buffer.from(a as Uint8Array).toString("hex")).toBe(hashKey(key));
    expect(Buffer.from(b as Uint8Array).toString("hex")).toBe(hashKey(key));

    // If the constant-time compare says no, the key is refused even though the index matched.
    spy.mockReturnValueOnce(false);
    expect(store.verifyKey(key)).toBeNull();
  });

  it("revokeKey refuses the key from then on", () => {
    const { key, keyId } = store.createKey("acme");
    expect(store.revokeKey(keyId)).toBe(true);
    expect(store.revokeKey(keyId)).toBe(false);
    expect(store.revokeKey("key_nope")).toBe(false);
    expect(store.verifyKey(key)).toBeNull();
    expect(store.checkKey(key)).toEqual({ state: "revoked", keyId });
    const [info] = store.listKeys("acme");
    expect(info?.revokedAt).toEqual(expect.any(String));
    // Revoked keys still count: the store is not empty again.
    expect(store.isEmpty()).toBe(false);
  });

  it("stores only a hash and a short prefix: the raw key is nowhere on disk", () => {
    const keys = [store.createKey("acme").key, store.createKey("other").key];
    const onDisk = () => Buffer.concat(fs.readdirSync(dir).map((f) => fs.readFileSync(path.join(dir, f))));
    const whileOpen = onDisk(); // database, -wal and -shm files
    store.close();
    const all = Buffer.concat([whileOpen, onDisk()]);
    for (const key of keys) {
      expect(all.includes(Buffer.from(key))).toBe(false);
      // The random part, and any 20-character run of it, is absent too.
      expect(all.includes(Buffer.from(key.slice(9)))).toBe(false);
      expect(all.includes(Buffer.from(key.slice(20, 40)))).toBe(false);
      expect(all.includes(Buffer.from(hashKey(key)))).toBe(true);
    }
    const db = new Database(path.join(dir, DB_FILE), { readonly: true });
    const rows = db.prepare("SELECT hash, prefix FROM api_keys").all() as { hash: string; prefix: string }[];
    db.close();
    expect(rows).toHaveLength(2);
    for (const r of rows) {
      expect(r.hash).toMatch(/^[0-9a-f]{64}$/);
      expect(r.prefix).toMatch(/^sk-assay-.{4}$/);
    }
  });

  it("applies migrations once; reopening is idempotent and keeps the data", () => {
    const { key, org } = store.createKey("acme");
    store.close();
    for (let i = 0; i < 3; i++) {
      store = new SqliteAccountsStore(dir);
      expect(store.verifyKey(key)?.id).toBe(org.id);
      store.close();
    }
    const db = new Database(path.join(dir, DB_FILE), { readonly: true });
    const versions = db.prepare("SELECT version FROM schema_migrations ORDER BY version").all() as { version: number }[];
    const tables = db.prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").all() as { name: string }[];
    const orgCols = db.prepare("PRAGMA table_info(organizations)").all() as { name: string }[];
    db.close();
    expect(versions.map((v) => v.version)).toEqual(MIGRATIONS.map((m) => m.version));
    expect(tables.map((t) => t.name)).toEqual(["api_keys", "balances", "ledger", "open_holds", "organizations", "schema_migrations"]);
    expect(orgCols.map((c) => c.name)).toEqual(["id", "name", "created_at", "max_concurrency", "has_purchased"]);
    store = new SqliteAccountsStore(dir);
  });

  it("refuses a database from a newer build", () => {
    store.close();
    const db = new Database(path.join(dir, DB_FILE));
    db.prepare("INSERT INTO schema_migrations (version, name, applied_at) VALUES (999, 'future', 'now')").run();
    db.close();
    expect(() => new SqliteAccountsStore(dir)).toThrow(/newer than this build/);
    const fix = new Database(path.join(dir, DB_FILE));
    fix.prepare("DELETE FROM schema_migrations WHERE version = 999").run();
    fix.close();
    store = new SqliteAccountsStore(dir);
  });

  it("two stores on the same file see each other's keys (server and CLI)", () => {
    const other = new SqliteAccountsStore(dir);
    try {
      const { key } = other.createKey("acme");
      expect(store.verifyKey(key)?.name).toBe("acme");
    } finally {
      other.close();
    }
  });
});
