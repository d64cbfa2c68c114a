/**
 * Embedded accounts store: one SQLite file, `${dataDir}/assay.db`, opened
 * synchronously (better-sqlite3). Lookups are index probes of microseconds,
 * so a synchronous call on the request path costs less than a hop to a pool.
 */
import fs from "node:fs";
import path from "node:path";
import crypto from "node:crypto";
import Database from "better-sqlite3";
import { migrate } from "./migrations.js";
import { displayPrefix, generateKey, hashKey, hashesEqual, isWellFormedKey } from "./keys.js";
import type { AccountsStore, CreatedKey, KeyCheck, KeyInfo, Org } from "./types.js";

export const DB_FILE = "assay.db";
const ORG_NAME_MAX = 100;

interface OrgRow {
  id: string;
  name: string;
  created_at: string;
  max_concurrency: number | null;
  has_purchased: number;
}

interface KeyRow {
  id: string;
  org_id: string;
  prefix: string;
  created_at: string;
  revoked_at: string | null;
}

const toOrg = (r: OrgRow): Org => ({
  id: r.id,
  name: r.name,
  createdAt: r.created_at,
  maxConcurrency: r.max_concurrency,
  hasPurchased: r.has_purchased === 1,
});

const toKeyInfo = (r: KeyRow): KeyInfo => ({
  id: r.id,
  orgId: r.org_id,
  prefix: r.prefix,
  createdAt: r.created_at,
  revokedAt: r.revoked_at,
});

/** Trimmed organization name, or an Error saying what is wrong with it. */
export function checkOrgName(name: string): string {
  const n = name.trim();
  if (n.length === 0) throw new Error("organization name must not be empty");
  if (n.length > ORG_NAME_MAX) throw new Error(`organization name must be at most ${ORG_NAME_MAX} characters`);
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f]/.test(n)) throw new Error("organization name must not contain control characters");
  return n;
}

function statements(db: Database.Database) {
  return {
    orgByName: db.prepare<[string], OrgRow>("SELECT * FROM organizations WHERE name = ?"),
    insertOrg: db.prepare<[string, string, string]>(
      "INSERT INTO organizations (id, name, created_at) VALUES (?, ?, ?) ON CONFLICT(name) DO NOTHING",
    ),
    insertKey: db.prepare<[string, string, string, string, string]>(
      "INSERT INTO api_keys (id, org_id, hash, prefix, created_at) VALUES (?, ?, ?, ?, ?)",
    ),
    keyByHash: db.prepare<[string], OrgRow & { key_id: string; key_hash: string; revoked_at: string | null }>(
      `SELECT k.id AS key_id, k.hash AS key_hash, k.revoked_at, o.*
         FROM api_keys k JOIN organizations o ON o.id = k.org_id
        WHERE k.hash = ?`,
    ),
    revoke: db.prepare<[string, string]>(
      "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
    ),
    keysOfOrg: db.prepare<[string], KeyRow>(
      `SELECT k.id, k.org_id, k.prefix, k.created_at, k.revoked_at
         FROM api_keys k JOIN organizations o ON o.id = k.org_id
        WHERE o.name = ? ORDER BY k.created_at, k.rowid`,
    ),
    anyKey: db.prepare<[], { one: number }>("SELECT 1 AS one FROM api_keys LIMIT 1"),
  };
}

export class SqliteAccountsStore implements AccountsStore {
  readonly file: string;
  private readonly db: Database.Database;
  private closed = false;

  private readonly q: ReturnType<typeof statements>;

  constructor(dataDir: string) {
    fs.mkdirSync(dataDir, { recursive: true, mode: 0o700 });
    this.file = path.join(dataDir, DB_FILE);
    this.db = new Database(this.file);
    try {
      // The file holds no secrets (hashes only), but nothing else needs to read it.
      fs.chmodSync(this.file, 0o600);
    } catch {
      /* best effort: a read-only mount or foreign owner is not fatal */
    }
    this.db.pragma("journal_mode = WAL");
    this.db.pragma("synchronous = NORMAL");
    this.db.pragma("foreign_keys = ON");
    // Server and CLI may write at the same moment; wait rather than fail.
    this.db.pragma("busy_timeout = 5000");
    migrate(this.db);

    this.q = statements(this.db);
  }

  ensureOrg(name: string): Org {
    const n = checkOrgName(name);
    this.q.insertOrg.run(`org_${crypto.randomUUID()}`, n, new Date().toISOString());
    const row = this.q.orgByName.get(n);
    if (!row) throw new Error(`organization "${n}" could not be created`);
    return toOrg(row);
  }

  createKey(orgName: string): CreatedKey {
    return this.db
      .transaction((): CreatedKey => {
        const org = this.ensureOrg(orgName);
        const key = generateKey();
        const keyId = `key_${crypto.randomUUID()}`;
        this.q.insertKey.run(keyId, org.id, hashKey(key), displayPrefix(key), new Date().toISOString());
        return { key, keyId, org };
      })
      .immediate();
  }

  checkKey(key: string): KeyCheck {
    if (typeof key !== "string" || !isWellFormedKey(key)) return { state: "unknown" };
    const hash = hashKey(key);
    const row = this.q.keyByHash.get(hash);
    if (!row || !hashesEqual(row.key_hash, hash)) return { state: "unknown" };
    if (row.revoked_at !== null) return { state: "revoked", keyId: row.key_id };
    return { state: "valid", org: toOrg(row), keyId: row.key_id };
  }

  verifyKey(key: string): Org | null {
    const c = this.checkKey(key);
    return c.state === "valid" ? c.org : null;
  }

  revokeKey(keyId: string): boolean {
    return this.q.revoke.run(new Date().toISOString(), keyId).changes === 1;
  }

  listKeys(orgName: string): KeyInfo[] {
    return this.q.keysOfOrg.all(orgName.trim()).map(toKeyInfo);
  }

  isEmpty(): boolean {
    return this.q.anyKey.get() === undefined;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.db.close();
  }
}

export function openSqliteAccounts(dataDir: string): SqliteAccountsStore {
  return new SqliteAccountsStore(dataDir);
}
