/**
 * Embedded store: one SQLite file, `${dataDir}/assay.db`, opened
 * synchronously (better-sqlite3). Lookups are index probes of microseconds,
 * so a synchronous call on the request path costs less than a hop to a pool.
 * Every ledger change runs in one IMMEDIATE transaction (a single writer at a
 * time, across processes too: server and CLI share the file).
 */
import fs from "node:fs";
import path from "node:path";
import crypto from "node:crypto";
import Database from "better-sqlite3";
import { migrate } from "./migrations.js";
import { displayPrefix, generateKey, hashKey, hashesEqual, isWellFormedKey } from "./keys.js";
import { assertMicro } from "./money.js";
import { checkOrgName, DEFAULT_STARTING_GRANT_MICRO, newHoldId, type StoreOptions } from "./shared.js";
import type {
  AccountsStore,
  Balance,
  CreatedKey,
  CreditStore,
  HoldRequest,
  HoldResult,
  KeyCheck,
  KeyInfo,
  LedgerAudit,
  LedgerEntry,
  LedgerKind,
  OpenHold,
  Org,
  SettleRequest,
  UsageReport,
} from "./types.js";

export const DB_FILE = "assay.db";
export { checkOrgName, DEFAULT_STARTING_GRANT_MICRO, type StoreOptions } from "./shared.js";

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

interface BalanceRow {
  org_id: string;
  credit: number;
  held: number;
  has_purchased: number;
}

interface LedgerRow {
  seq: number;
  org_id: string;
  kind: LedgerKind;
  amount: number;
  hold_id: string | null;
  request_id: string | null;
  model: string | null;
  input_tokens: number | null;
  price: number | null;
  expires_at: number | null;
  note: string | null;
  created_at: string;
}

interface HoldRow {
  hold_id: string;
  org_id: string;
  amount: number;
  expires_at: number;
  request_id: string | null;
  model: string | null;
  created_at: string;
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

const toBalance = (r: BalanceRow): Balance => ({
  orgId: r.org_id,
  creditMicro: r.credit,
  heldMicro: r.held,
  availableMicro: r.credit - r.held,
  hasPurchased: r.has_purchased === 1,
});

export const toLedgerEntry = (r: LedgerRow): LedgerEntry => ({
  seq: r.seq,
  orgId: r.org_id,
  kind: r.kind,
  amountMicro: r.amount,
  holdId: r.hold_id,
  requestId: r.request_id,
  model: r.model,
  inputTokens: r.input_tokens,
  priceMicroPerMTok: r.price,
  expiresAt: r.expires_at,
  note: r.note,
  createdAt: r.created_at,
});

const toOpenHold = (r: HoldRow): OpenHold => ({
  holdId: r.hold_id,
  orgId: r.org_id,
  amountMicro: r.amount,
  expiresAt: r.expires_at,
  requestId: r.request_id,
  model: r.model,
  createdAt: r.created_at,
});

const iso = (ms: number) => new Date(ms).toISOString();

function statements(db: Database.Database) {
  return {
    orgByName: db.prepare<[string], OrgRow>("SELECT * FROM organizations WHERE name = ?"),
    orgById: db.prepare<[string], OrgRow>("SELECT * FROM organizations WHERE id = ?"),
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

    // credit
    insertBalance: db.prepare<[string, string]>(
      "INSERT INTO balances (org_id, credit, held, updated_at) VALUES (?, 0, 0, ?) ON CONFLICT(org_id) DO NOTHING",
    ),
    balance: db.prepare<[string], BalanceRow>(
      `SELECT b.org_id, b.credit, b.held, o.has_purchased
         FROM balances b JOIN organizations o ON o.id = b.org_id WHERE b.org_id = ?`,
    ),
    addToBalance: db.prepare<[number, number, string, string]>(
      "UPDATE balances SET credit = credit + ?, held = held + ?, updated_at = ? WHERE org_id = ?",
    ),
    markPurchased: db.prepare<[string]>("UPDATE organizations SET has_purchased = 1 WHERE id = ?"),
    append: db.prepare<
      [Omit<LedgerRow, "seq">]
    >(
      `INSERT INTO ledger (org_id, kind, amount, hold_id, request_id, model, input_tokens, price, expires_at, note, created_at)
       VALUES (@org_id, @kind, @amount, @hold_id, @request_id, @model, @input_tokens, @price, @expires_at, @note, @created_at)`,
    ),
    insertHold: db.prepare<[string, string, number, number, string | null, string | null, string]>(
      `INSERT INTO open_holds (hold_id, org_id, amount, expires_at, request_id, model, created_at)
       VALUES (?, ?, ?, ?, ?, ?, ?)`,
    ),
    hold: db.prepare<[string], HoldRow>("SELECT * FROM open_holds WHERE hold_id = ?"),
    deleteHold: db.prepare<[string]>("DELETE FROM open_holds WHERE hold_id = ?"),
    renewHold: db.prepare<[number, string]>(
      "UPDATE open_holds SET expires_at = MAX(expires_at, ?) WHERE hold_id = ?",
    ),
    expiredOfOrg: db.prepare<[string, number], HoldRow>(
      "SELECT * FROM open_holds WHERE org_id = ? AND expires_at <= ? ORDER BY expires_at",
    ),
    expired: db.prepare<[number], HoldRow>("SELECT * FROM open_holds WHERE expires_at <= ? ORDER BY expires_at"),
    holdsOfOrg: db.prepare<[string], HoldRow>("SELECT * FROM open_holds WHERE org_id = ? ORDER BY created_at"),
    ledgerOfOrg: db.prepare<[string], LedgerRow>("SELECT * FROM ledger WHERE org_id = ? ORDER BY seq"),
    recentCharges: db.prepare<[string, number], LedgerRow>(
      "SELECT * FROM ledger WHERE org_id = ? AND kind = 'settle' ORDER BY seq DESC LIMIT ?",
    ),
    totals: db.prepare<[string], { kind: LedgerKind; total: number; n: number }>(
      "SELECT kind, COALESCE(SUM(amount), 0) AS total, COUNT(*) AS n FROM ledger WHERE org_id = ? GROUP BY kind",
    ),
    derived: db.prepare<[{ org: string }], { credit: number; held: number }>(
      `SELECT
         (SELECT COALESCE(SUM(CASE WHEN kind IN ('grant', 'purchase') THEN amount
                                   WHEN kind = 'settle' THEN -amount ELSE 0 END), 0)
            FROM ledger WHERE org_id = @org) AS credit,
         (SELECT COALESCE(SUM(h.amount), 0) FROM ledger h
           WHERE h.org_id = @org AND h.kind = 'hold'
             AND NOT EXISTS (SELECT 1 FROM ledger c WHERE c.hold_id = h.hold_id AND c.kind IN ('settle', 'release'))) AS held`,
    ),
  };
}

export class SqliteAccountsStore implements AccountsStore, CreditStore {
  readonly file: string;
  private readonly db: Database.Database;
  private closed = false;
  private readonly startingGrantMicro: number;

  private readonly q: ReturnType<typeof statements>;

  constructor(dataDir: string, options: StoreOptions = {}) {
    this.startingGrantMicro = options.startingGrantMicro ?? DEFAULT_STARTING_GRANT_MICRO;
    assertMicro(this.startingGrantMicro, "starting grant");
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

  /** Run `fn` in one IMMEDIATE transaction (nested calls become savepoints). */
  private tx<T>(fn: () => T): T {
    return this.db.transaction(fn).immediate();
  }

  // ------------------------------------------------------------ orgs and keys

  ensureOrg(name: string): Org {
    const n = checkOrgName(name);
    return this.tx(() => {
      const now = Date.now();
      this.q.insertOrg.run(`org_${crypto.randomUUID()}`, n, iso(now));
      const row = this.q.orgByName.get(n);
      if (!row) throw new Error(`organization "${n}" could not be created`);
      this.ensureAccount(row.id, now);
      return toOrg(row);
    });
  }

  findOrg(name: string): Org | null {
    const row = this.q.orgByName.get(name.trim());
    return row ? toOrg(row) : null;
  }

  createKey(orgName: string): CreatedKey {
    return this.tx((): CreatedKey => {
      const org = this.ensureOrg(orgName);
      const key = generateKey();
      const keyId = `key_${crypto.randomUUID()}`;
      this.q.insertKey.run(keyId, org.id, hashKey(key), displayPrefix(key), new Date().toISOString());
      return { key, keyId, org };
    });
  }

  createFirstKey(orgName: string): CreatedKey | null {
    return this.tx(() => (this.isEmpty() ? this.createKey(orgName) : null));
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

  // ------------------------------------------------------------------ credit

  /**
   * The organization's balance row, created on first use together with the
   * starting grant. New organizations get it in `ensureOrg`; one that
   * existed before the ledger did gets it the first time it is billed.
   */
  private ensureAccount(orgId: string, now: number): void {
    if (this.q.insertBalance.run(orgId, iso(now)).changes !== 1) return;
    if (this.startingGrantMicro > 0) {
      this.appendEntry({ org_id: orgId, kind: "grant", amount: this.startingGrantMicro, note: "starting grant" }, now);
      this.q.addToBalance.run(this.startingGrantMicro, 0, iso(now), orgId);
    }
  }

  private appendEntry(
    e: { org_id: string; kind: LedgerKind; amount: number } & Partial<Omit<LedgerRow, "seq" | "org_id" | "kind" | "amount">>,
    now: number,
  ): void {
    this.q.append.run({
      hold_id: null,
      request_id: null,
      model: null,
      input_tokens: null,
      price: null,
      expires_at: null,
      note: null,
      created_at: iso(now),
      ...e,
    });
  }

  private balanceOf(orgId: string): Balance {
    const row = this.q.balance.get(orgId);
    if (!row) throw new Error(`no organization with id ${orgId}`);
    return toBalance(row);
  }

  private requireOrgId(orgId: string): void {
    if (!this.q.orgById.get(orgId)) throw new Error(`no organization with id ${orgId}`);
  }

  /** Close one open hold: settle with `charge`, or release when `charge` is null. */
  private closeHold(
    holdId: string,
    now: number,
    close: { kind: "settle"; charge: number; inputTokens: number; price: number } | { kind: "release"; reason: string },
  ): boolean {
    const h = this.q.hold.get(holdId);
    if (!h) return false;
    this.q.deleteHold.run(holdId);
    if (close.kind === "settle") {
      this.appendEntry(
        {
          org_id: h.org_id,
          kind: "settle",
          amount: close.charge,
          hold_id: holdId,
          request_id: h.request_id,
          model: h.model,
          input_tokens: close.inputTokens,
          price: close.price,
        },
        now,
      );
      this.q.addToBalance.run(-close.charge, -h.amount, iso(now), h.org_id);
    } else {
      this.appendEntry(
        {
          org_id: h.org_id,
          kind: "release",
          amount: h.amount,
          hold_id: holdId,
          request_id: h.request_id,
          model: h.model,
          note: close.reason,
        },
        now,
      );
      this.q.addToBalance.run(0, -h.amount, iso(now), h.org_id);
    }
    return true;
  }

  private releaseExpiredNow(now: number, orgId?: string): number {
    const rows = orgId === undefined ? this.q.expired.all(now) : this.q.expiredOfOrg.all(orgId, now);
    for (const h of rows) this.closeHold(h.hold_id, now, { kind: "release", reason: "expired" });
    return rows.length;
  }

  addCredit(
    orgName: string,
    kind: "purchase" | "grant",
    amountMicro: number,
    note: string | null,
    now: number,
  ): { org: Org; balance: Balance } {
    assertMicro(amountMicro, "amount");
    if (amountMicro === 0) throw new Error("amount must be more than zero");
    return this.tx(() => {
      const found = this.findOrg(orgName);
      if (!found) throw new Error(`no organization named "${orgName.trim()}"; create it with \`assay key create --org NAME\``);
      this.ensureAccount(found.id, now);
      this.appendEntry({ org_id: found.id, kind, amount: amountMicro, note }, now);
      this.q.addToBalance.run(amountMicro, 0, iso(now), found.id);
      if (kind === "purchase") this.q.markPurchased.run(found.id);
      return { org: toOrg(this.q.orgById.get(found.id)!), balance: this.balanceOf(found.id) };
    });
  }

  placeHold(req: HoldRequest): HoldResult {
    assertMicro(req.amountMicro, "hold amount");
    return this.tx((): HoldResult => {
      this.requireOrgId(req.orgId);
      this.ensureAccount(req.orgId, req.now);
      this.releaseExpiredNow(req.now, req.orgId);
      const before = this.balanceOf(req.orgId);
      if (before.availableMicro < req.amountMicro) return { ok: false, balance: before };
      const holdId = newHoldId();
      const expiresAt = req.now + req.ttlMs;
      this.appendEntry(
        {
          org_id: req.orgId,
          kind: "hold",
          amount: req.amountMicro,
          hold_id: holdId,
          request_id: req.requestId,
          model: req.model,
          input_tokens: req.inputTokens,
          price: req.priceMicroPerMTok,
          expires_at: expiresAt,
        },
        req.now,
      );
      this.q.insertHold.run(holdId, req.orgId, req.amountMicro, expiresAt, req.requestId, req.model, iso(req.now));
      this.q.addToBalance.run(0, req.amountMicro, iso(req.now), req.orgId);
      return { ok: true, holdId, expiresAt, balance: this.balanceOf(req.orgId) };
    });
  }

  renewHold(holdId: string, expiresAt: number): boolean {
    return this.q.renewHold.run(expiresAt, holdId).changes === 1;
  }

  settleHold(req: SettleRequest): boolean {
    assertMicro(req.chargeMicro, "charge");
    return this.tx(() =>
      this.closeHold(req.holdId, req.now, {
        kind: "settle",
        charge: req.chargeMicro,
        inputTokens: req.inputTokens,
        price: req.priceMicroPerMTok,
      }),
    );
  }

  releaseHold(holdId: string, reason: string, now: number): boolean {
    return this.tx(() => this.closeHold(holdId, now, { kind: "release", reason }));
  }

  releaseExpiredHolds(now: number, orgId?: string): number {
    return this.tx(() => this.releaseExpiredNow(now, orgId));
  }

  balance(orgId: string, now: number): Balance {
    return this.tx(() => {
      this.requireOrgId(orgId);
      this.ensureAccount(orgId, now);
      this.releaseExpiredNow(now, orgId);
      return this.balanceOf(orgId);
    });
  }

  usage(orgName: string, now: number, recent: number): UsageReport | null {
    return this.tx(() => {
      const found = this.findOrg(orgName);
      if (!found) return null;
      this.ensureAccount(found.id, now);
      this.releaseExpiredNow(now, found.id);
      const totals = { grantsMicro: 0, purchasesMicro: 0, chargesMicro: 0, charges: 0 };
      for (const t of this.q.totals.all(found.id)) {
        if (t.kind === "grant") totals.grantsMicro = t.total;
        if (t.kind === "purchase") totals.purchasesMicro = t.total;
        if (t.kind === "settle") {
          totals.chargesMicro = t.total;
          totals.charges = t.n;
        }
      }
      return {
        org: found,
        balance: this.balanceOf(found.id),
        totals,
        openHolds: this.q.holdsOfOrg.all(found.id).map(toOpenHold),
        recentCharges: this.q.recentCharges.all(found.id, Math.max(0, recent)).map(toLedgerEntry),
      };
    });
  }

  ledger(orgId: string): LedgerEntry[] {
    return this.q.ledgerOfOrg.all(orgId).map(toLedgerEntry);
  }

  audit(orgId: string): LedgerAudit {
    return this.tx(() => {
      const d = this.q.derived.get({ org: orgId })!;
      const row = this.q.balance.get(orgId);
      return {
        derived: { creditMicro: d.credit, heldMicro: d.held },
        kept: { creditMicro: row?.credit ?? 0, heldMicro: row?.held ?? 0 },
      };
    });
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.db.close();
  }
}

export function openSqliteAccounts(dataDir: string, options: StoreOptions = {}): SqliteAccountsStore {
  return new SqliteAccountsStore(dataDir, options);
}
