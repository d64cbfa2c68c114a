/**
 * PostgreSQL store, for several replicas sharing one database
 * (ASSAY_DATABASE_URL): organizations, keys, balances, open holds and the
 * ledger. Same schema and rules as the SQLite store. Every credit change is
 * one transaction that first locks the organization's `balances` row
 * (SELECT … FOR UPDATE), so concurrent holds from different replicas are
 * serialized per organization and can never overdraw it.
 */
import crypto from "node:crypto";
import pg from "pg";
import { displayPrefix, generateKey, hashKey, hashesEqual, isWellFormedKey } from "./keys.js";
import { assertMicro, toSafeInt } from "./money.js";
import { migratePg } from "./pg-migrations.js";
import { DEFAULT_STARTING_GRANT_MICRO, checkOrgName, newHoldId, type StoreOptions } from "./shared.js";
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

export interface PgStoreOptions extends StoreOptions {
  connectionString: string;
  /** Schema to use (created if missing); default: the server's search_path (usually `public`). */
  schema?: string;
  /** Pool size per process. */
  maxConnections?: number;
  /**
   * How long one query may wait for its answer, ms (default 5000). A database
   * behind a network partition keeps connections open and silent; without a
   * bound a request would hang on it instead of getting 503.
   */
  queryTimeoutMs?: number;
}

const SCHEMA_NAME = /^[A-Za-z_][A-Za-z0-9_]{0,62}$/;
const FIRST_KEY_LOCK = "assay:first-key";

interface OrgRow {
  id: string;
  name: string;
  created_at: string;
  max_concurrency: number | null;
  has_purchased: boolean;
}

interface HoldRow {
  hold_id: string;
  org_id: string;
  amount: string;
  expires_at: string;
  request_id: string | null;
  model: string | null;
  created_at: string;
}

interface LedgerRow {
  seq: string;
  org_id: string;
  kind: LedgerKind;
  amount: string;
  hold_id: string | null;
  request_id: string | null;
  model: string | null;
  input_tokens: string | null;
  price: string | null;
  expires_at: string | null;
  note: string | null;
  created_at: string;
}

const toOrg = (r: OrgRow): Org => ({
  id: r.id,
  name: r.name,
  createdAt: r.created_at,
  maxConcurrency: r.max_concurrency,
  hasPurchased: r.has_purchased,
});

const intOrNull = (v: string | null, what: string) => (v === null ? null : toSafeInt(v, what));

const toLedgerEntry = (r: LedgerRow): LedgerEntry => ({
  seq: toSafeInt(r.seq, "seq"),
  orgId: r.org_id,
  kind: r.kind,
  amountMicro: toSafeInt(r.amount, "amount"),
  holdId: r.hold_id,
  requestId: r.request_id,
  model: r.model,
  inputTokens: intOrNull(r.input_tokens, "input_tokens"),
  priceMicroPerMTok: intOrNull(r.price, "price"),
  expiresAt: intOrNull(r.expires_at, "expires_at"),
  note: r.note,
  createdAt: r.created_at,
});

const toOpenHold = (r: HoldRow): OpenHold => ({
  holdId: r.hold_id,
  orgId: r.org_id,
  amountMicro: toSafeInt(r.amount, "amount"),
  expiresAt: toSafeInt(r.expires_at, "expires_at"),
  requestId: r.request_id,
  model: r.model,
  createdAt: r.created_at,
});

const iso = (ms: number) => new Date(ms).toISOString();

type Q = pg.PoolClient;

export class PgAccountsStore implements AccountsStore, CreditStore {
  private closed = false;

  private constructor(
    private readonly pool: pg.Pool,
    private readonly startingGrantMicro: number,
    readonly schema: string | null,
  ) {}

  /** Connect, create the schema if asked for one, and apply pending migrations. */
  static async open(options: PgStoreOptions): Promise<PgAccountsStore> {
    const grant = options.startingGrantMicro ?? DEFAULT_STARTING_GRANT_MICRO;
    assertMicro(grant, "starting grant");
    const schema = options.schema ?? null;
    if (schema !== null && !SCHEMA_NAME.test(schema)) {
      throw new Error(`invalid PostgreSQL schema name "${schema}": letters, digits and _ only`);
    }
    const pool = new pg.Pool({
      connectionString: options.connectionString,
      max: options.maxConnections ?? 10,
      // A database that does not answer fails the request (503) instead of hanging it:
      // neither a new connection nor a query on an open one waits for ever.
      connectionTimeoutMillis: 5000,
      query_timeout: options.queryTimeoutMs ?? 5000,
      ...(schema !== null ? { options: `-c search_path=${schema}` } : {}),
    });
    // An idle client losing its connection must not crash the process.
    pool.on("error", () => {});
    try {
      const client = await pool.connect();
      try {
        await migratePg(client, schema);
      } finally {
        client.release();
      }
    } catch (e) {
      await pool.end().catch(() => {});
      throw e;
    }
    return new PgAccountsStore(pool, grant, schema);
  }

  private async tx<T>(fn: (c: Q) => Promise<T>): Promise<T> {
    const c = await this.pool.connect();
    // A connection that failed (timed out, reset) is discarded, not pooled:
    // a timed-out query may still be pending on it, and everything queued
    // behind it would hang. Closing it rolls the transaction back server-side.
    let broken: Error | undefined;
    try {
      await c.query("BEGIN");
      const out = await fn(c);
      await c.query("COMMIT");
      return out;
    } catch (e) {
      if (e instanceof pg.DatabaseError) {
        await c.query("ROLLBACK").catch((err: unknown) => {
          broken = err instanceof Error ? err : new Error(String(err));
        });
      } else {
        broken = e instanceof Error ? e : new Error(String(e));
      }
      throw e;
    } finally {
      c.release(broken);
    }
  }

  // ------------------------------------------------------------ orgs and keys

  private async ensureOrgIn(c: Q, name: string, now: number): Promise<Org> {
    const n = checkOrgName(name);
    await c.query("INSERT INTO organizations (id, name, created_at) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING", [
      `org_${crypto.randomUUID()}`,
      n,
      iso(now),
    ]);
    const { rows } = await c.query<OrgRow>("SELECT * FROM organizations WHERE name = $1", [n]);
    const row = rows[0];
    if (!row) throw new Error(`organization "${n}" could not be created`);
    await this.ensureAccount(c, row.id, now);
    return toOrg(row);
  }

  async ensureOrg(name: string): Promise<Org> {
    return this.tx((c) => this.ensureOrgIn(c, name, Date.now()));
  }

  async findOrg(name: string): Promise<Org | null> {
    const { rows } = await this.pool.query<OrgRow>("SELECT * FROM organizations WHERE name = $1", [name.trim()]);
    return rows[0] ? toOrg(rows[0]) : null;
  }

  private async createKeyIn(c: Q, orgName: string): Promise<CreatedKey> {
    const org = await this.ensureOrgIn(c, orgName, Date.now());
    const key = generateKey();
    const keyId = `key_${crypto.randomUUID()}`;
    await c.query("INSERT INTO api_keys (id, org_id, hash, prefix, created_at) VALUES ($1, $2, $3, $4, $5)", [
      keyId,
      org.id,
      hashKey(key),
      displayPrefix(key),
      new Date().toISOString(),
    ]);
    return { key, keyId, org };
  }

  async createKey(orgName: string): Promise<CreatedKey> {
    return this.tx((c) => this.createKeyIn(c, orgName));
  }

  async createFirstKey(orgName: string): Promise<CreatedKey | null> {
    return this.tx(async (c) => {
      await c.query("SELECT pg_advisory_xact_lock(hashtext($1))", [FIRST_KEY_LOCK]);
      const { rows } = await c.query("SELECT 1 FROM api_keys LIMIT 1");
      return rows.length > 0 ? null : this.createKeyIn(c, orgName);
    });
  }

  async checkKey(key: string): Promise<KeyCheck> {
    if (typeof key !== "string" || !isWellFormedKey(key)) return { state: "unknown" };
    const hash = hashKey(key);
    const { rows } = await this.pool.query<OrgRow & { key_id: string; key_hash: string; revoked_at: string | null }>(
      `SELECT k.id AS key_id, k.hash AS key_hash, k.revoked_at, o.*
         FROM api_keys k JOIN organizations o ON o.id = k.org_id
        WHERE k.hash = $1`,
      [hash],
    );
    const row = rows[0];
    if (!row || !hashesEqual(row.key_hash, hash)) return { state: "unknown" };
    if (row.revoked_at !== null) return { state: "revoked", keyId: row.key_id };
    return { state: "valid", org: toOrg(row), keyId: row.key_id };
  }

  async verifyKey(key: string): Promise<Org | null> {
    const c = await this.checkKey(key);
    return c.state === "valid" ? c.org : null;
  }

  async revokeKey(keyId: string): Promise<boolean> {
    const r = await this.pool.query("UPDATE api_keys SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL", [
      new Date().toISOString(),
      keyId,
    ]);
    return r.rowCount === 1;
  }

  async listKeys(orgName: string): Promise<KeyInfo[]> {
    const { rows } = await this.pool.query<{ id: string; org_id: string; prefix: string; created_at: string; revoked_at: string | null }>(
      `SELECT k.id, k.org_id, k.prefix, k.created_at, k.revoked_at
         FROM api_keys k JOIN organizations o ON o.id = k.org_id
        WHERE o.name = $1 ORDER BY k.created_at, k.id`,
      [orgName.trim()],
    );
    return rows.map((r) => ({ id: r.id, orgId: r.org_id, prefix: r.prefix, createdAt: r.created_at, revokedAt: r.revoked_at }));
  }

  async isEmpty(): Promise<boolean> {
    const { rows } = await this.pool.query("SELECT 1 FROM api_keys LIMIT 1");
    return rows.length === 0;
  }

  // ------------------------------------------------------------------ credit

  /** Balance row (with the starting grant) on first use; see the SQLite store. */
  private async ensureAccount(c: Q, orgId: string, now: number): Promise<void> {
    const r = await c.query(
      "INSERT INTO balances (org_id, credit, held, updated_at) VALUES ($1, 0, 0, $2) ON CONFLICT (org_id) DO NOTHING",
      [orgId, iso(now)],
    );
    if (r.rowCount !== 1 || this.startingGrantMicro === 0) return;
    await this.append(c, { org_id: orgId, kind: "grant", amount: this.startingGrantMicro, note: "starting grant" }, now);
    await this.addToBalance(c, orgId, this.startingGrantMicro, 0, now);
  }

  private async append(
    c: Q,
    e: {
      org_id: string;
      kind: LedgerKind;
      amount: number;
      hold_id?: string | null;
      request_id?: string | null;
      model?: string | null;
      input_tokens?: number | null;
      price?: number | null;
      expires_at?: number | null;
      note?: string | null;
    },
    now: number,
  ): Promise<void> {
    await c.query(
      `INSERT INTO ledger (org_id, kind, amount, hold_id, request_id, model, input_tokens, price, expires_at, note, created_at)
       VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`,
      [
        e.org_id,
        e.kind,
        e.amount,
        e.hold_id ?? null,
        e.request_id ?? null,
        e.model ?? null,
        e.input_tokens ?? null,
        e.price ?? null,
        e.expires_at ?? null,
        e.note ?? null,
        iso(now),
      ],
    );
  }

  private async addToBalance(c: Q, orgId: string, credit: number, held: number, now: number): Promise<void> {
    await c.query("UPDATE balances SET credit = credit + $1, held = held + $2, updated_at = $3 WHERE org_id = $4", [
      credit,
      held,
      iso(now),
      orgId,
    ]);
  }

  /** Lock the organization's balance row for this transaction (creating it if needed) and read it. */
  private async lockBalance(c: Q, orgId: string, now: number): Promise<Balance> {
    await this.ensureAccount(c, orgId, now);
    const { rows } = await c.query<{ org_id: string; credit: string; held: string; has_purchased: boolean }>(
      `SELECT b.org_id, b.credit, b.held, o.has_purchased
         FROM balances b JOIN organizations o ON o.id = b.org_id
        WHERE b.org_id = $1 FOR UPDATE OF b`,
      [orgId],
    );
    const r = rows[0];
    if (!r) throw new Error(`no organization with id ${orgId}`);
    const credit = toSafeInt(r.credit, "credit");
    const held = toSafeInt(r.held, "held");
    return { orgId: r.org_id, creditMicro: credit, heldMicro: held, availableMicro: credit - held, hasPurchased: r.has_purchased };
  }

  private async requireOrgId(c: Q, orgId: string): Promise<void> {
    const { rows } = await c.query("SELECT 1 FROM organizations WHERE id = $1", [orgId]);
    if (rows.length === 0) throw new Error(`no organization with id ${orgId}`);
  }

  /** Close one open hold whose organization's balance row this transaction has locked. */
  private async closeHold(
    c: Q,
    holdId: string,
    now: number,
    close: { kind: "settle"; charge: number; inputTokens: number; price: number } | { kind: "release"; reason: string },
  ): Promise<boolean> {
    const { rows } = await c.query<HoldRow>("DELETE FROM open_holds WHERE hold_id = $1 RETURNING *", [holdId]);
    const h = rows[0];
    if (!h) return false;
    const amount = toSafeInt(h.amount, "amount");
    if (close.kind === "settle") {
      await this.append(
        c,
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
      await this.addToBalance(c, h.org_id, -close.charge, -amount, now);
    } else {
      await this.append(
        c,
        { org_id: h.org_id, kind: "release", amount, hold_id: holdId, request_id: h.request_id, model: h.model, note: close.reason },
        now,
      );
      await this.addToBalance(c, h.org_id, 0, -amount, now);
    }
    return true;
  }

  /** The organization a hold belongs to, or null when it is closed. */
  private async holdOrg(holdId: string): Promise<string | null> {
    const { rows } = await this.pool.query<{ org_id: string }>("SELECT org_id FROM open_holds WHERE hold_id = $1", [holdId]);
    return rows[0]?.org_id ?? null;
  }

  private async releaseExpiredIn(c: Q, orgId: string, now: number): Promise<number> {
    const { rows } = await c.query<{ hold_id: string }>(
      "SELECT hold_id FROM open_holds WHERE org_id = $1 AND expires_at <= $2 ORDER BY expires_at",
      [orgId, now],
    );
    let n = 0;
    for (const r of rows) if (await this.closeHold(c, r.hold_id, now, { kind: "release", reason: "expired" })) n++;
    return n;
  }

  async addCredit(
    orgName: string,
    kind: "purchase" | "grant",
    amountMicro: number,
    note: string | null,
    now: number,
  ): Promise<{ org: Org; balance: Balance }> {
    assertMicro(amountMicro, "amount");
    if (amountMicro === 0) throw new Error("amount must be more than zero");
    const found = await this.findOrg(orgName);
    if (!found) throw new Error(`no organization named "${orgName.trim()}"; create it with \`assay key create --org NAME\``);
    return this.tx(async (c) => {
      await this.lockBalance(c, found.id, now);
      await this.append(c, { org_id: found.id, kind, amount: amountMicro, note }, now);
      await this.addToBalance(c, found.id, amountMicro, 0, now);
      if (kind === "purchase") await c.query("UPDATE organizations SET has_purchased = TRUE WHERE id = $1", [found.id]);
      const { rows } = await c.query<OrgRow>("SELECT * FROM organizations WHERE id = $1", [found.id]);
      return { org: toOrg(rows[0]!), balance: await this.lockBalance(c, found.id, now) };
    });
  }

  async placeHold(req: HoldRequest): Promise<HoldResult> {
    assertMicro(req.amountMicro, "hold amount");
    return this.tx(async (c): Promise<HoldResult> => {
      await this.requireOrgId(c, req.orgId);
      await this.lockBalance(c, req.orgId, req.now);
      await this.releaseExpiredIn(c, req.orgId, req.now);
      const before = await this.lockBalance(c, req.orgId, req.now);
      if (before.availableMicro < req.amountMicro) return { ok: false, balance: before };
      const holdId = newHoldId();
      const expiresAt = req.now + req.ttlMs;
      await this.append(
        c,
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
      await c.query(
        `INSERT INTO open_holds (hold_id, org_id, amount, expires_at, request_id, model, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7)`,
        [holdId, req.orgId, req.amountMicro, expiresAt, req.requestId, req.model, iso(req.now)],
      );
      await this.addToBalance(c, req.orgId, 0, req.amountMicro, req.now);
      return { ok: true, holdId, expiresAt, balance: await this.lockBalance(c, req.orgId, req.now) };
    });
  }

  async renewHold(holdId: string, expiresAt: number): Promise<boolean> {
    const r = await this.pool.query("UPDATE open_holds SET expires_at = GREATEST(expires_at, $1) WHERE hold_id = $2", [
      expiresAt,
      holdId,
    ]);
    return r.rowCount === 1;
  }

  /** Lock the hold's organization, then close the hold (lock order: balances row first, always). */
  private async closeLocked(
    holdId: string,
    now: number,
    close: Parameters<PgAccountsStore["closeHold"]>[3],
  ): Promise<boolean> {
    const orgId = await this.holdOrg(holdId);
    if (orgId === null) return false;
    return this.tx(async (c) => {
      await this.lockBalance(c, orgId, now);
      return this.closeHold(c, holdId, now, close);
    });
  }

  async settleHold(req: SettleRequest): Promise<boolean> {
    assertMicro(req.chargeMicro, "charge");
    return this.closeLocked(req.holdId, req.now, {
      kind: "settle",
      charge: req.chargeMicro,
      inputTokens: req.inputTokens,
      price: req.priceMicroPerMTok,
    });
  }

  async releaseHold(holdId: string, reason: string, now: number): Promise<boolean> {
    return this.closeLocked(holdId, now, { kind: "release", reason });
  }

  async releaseExpiredHolds(now: number, orgId?: string): Promise<number> {
    const orgs =
      orgId !== undefined
        ? [orgId]
        : (
            await this.pool.query<{ org_id: string }>("SELECT DISTINCT org_id FROM open_holds WHERE expires_at <= $1", [now])
          ).rows.map((r) => r.org_id);
    let n = 0;
    // One transaction per organization: each locks only its own balance row.
    for (const id of orgs) {
      n += await this.tx(async (c) => {
        await this.lockBalance(c, id, now);
        return this.releaseExpiredIn(c, id, now);
      });
    }
    return n;
  }

  async balance(orgId: string, now: number): Promise<Balance> {
    return this.tx(async (c) => {
      await this.requireOrgId(c, orgId);
      await this.lockBalance(c, orgId, now);
      await this.releaseExpiredIn(c, orgId, now);
      return this.lockBalance(c, orgId, now);
    });
  }

  async usage(orgName: string, now: number, recent: number): Promise<UsageReport | null> {
    const found = await this.findOrg(orgName);
    if (!found) return null;
    return this.tx(async (c) => {
      await this.lockBalance(c, found.id, now);
      await this.releaseExpiredIn(c, found.id, now);
      const balance = await this.lockBalance(c, found.id, now);
      const totals = { grantsMicro: 0, purchasesMicro: 0, chargesMicro: 0, charges: 0 };
      const t = await c.query<{ kind: LedgerKind; total: string; n: string }>(
        "SELECT kind, COALESCE(SUM(amount), 0) AS total, COUNT(*) AS n FROM ledger WHERE org_id = $1 GROUP BY kind",
        [found.id],
      );
      for (const r of t.rows) {
        if (r.kind === "grant") totals.grantsMicro = toSafeInt(r.total);
        if (r.kind === "purchase") totals.purchasesMicro = toSafeInt(r.total);
        if (r.kind === "settle") {
          totals.chargesMicro = toSafeInt(r.total);
          totals.charges = toSafeInt(r.n);
        }
      }
      const holds = await c.query<HoldRow>("SELECT * FROM open_holds WHERE org_id = $1 ORDER BY created_at", [found.id]);
      const charges = await c.query<LedgerRow>(
        "SELECT * FROM ledger WHERE org_id = $1 AND kind = 'settle' ORDER BY seq DESC LIMIT $2",
        [found.id, Math.max(0, recent)],
      );
      const org = (await c.query<OrgRow>("SELECT * FROM organizations WHERE id = $1", [found.id])).rows[0]!;
      return {
        org: toOrg(org),
        balance,
        totals,
        openHolds: holds.rows.map(toOpenHold),
        recentCharges: charges.rows.map(toLedgerEntry),
      };
    });
  }

  async ledger(orgId: string): Promise<LedgerEntry[]> {
    const { rows } = await this.pool.query<LedgerRow>("SELECT * FROM ledger WHERE org_id = $1 ORDER BY seq", [orgId]);
    return rows.map(toLedgerEntry);
  }

  async audit(orgId: string): Promise<LedgerAudit> {
    return this.tx(async (c) => {
      await c.query("SELECT 1 FROM balances WHERE org_id = $1 FOR SHARE", [orgId]);
      const d = await c.query<{ credit: string; held: string }>(
        `SELECT
           (SELECT COALESCE(SUM(CASE WHEN kind IN ('grant', 'purchase') THEN amount
                                     WHEN kind = 'settle' THEN -amount ELSE 0 END), 0)
              FROM ledger WHERE org_id = $1) AS credit,
           (SELECT COALESCE(SUM(h.amount), 0) FROM ledger h
             WHERE h.org_id = $1 AND h.kind = 'hold'
               AND NOT EXISTS (SELECT 1 FROM ledger x WHERE x.hold_id = h.hold_id AND x.kind IN ('settle', 'release'))) AS held`,
        [orgId],
      );
      const k = await c.query<{ credit: string; held: string }>("SELECT credit, held FROM balances WHERE org_id = $1", [orgId]);
      return {
        derived: { creditMicro: toSafeInt(d.rows[0]!.credit), heldMicro: toSafeInt(d.rows[0]!.held) },
        kept: { creditMicro: toSafeInt(k.rows[0]?.credit ?? 0), heldMicro: toSafeInt(k.rows[0]?.held ?? 0) },
      };
    });
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.pool.end();
  }
}

export function openPgAccounts(options: PgStoreOptions): Promise<PgAccountsStore> {
  return PgAccountsStore.open(options);
}
