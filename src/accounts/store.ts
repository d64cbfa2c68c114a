/**
 * The accounts store, written once for SQLite and PostgreSQL: organizations,
 * keys, balances, open holds and the ledger. Every credit change is one
 * transaction that first reads the organization's `balances` row, locked on
 * PostgreSQL (`Dialect.rowLocks`), so concurrent holds from several replicas
 * are serialized per organization and can never overdraw it; on SQLite the
 * IMMEDIATE transaction serializes every writer. `sqlite.ts` and
 * `postgres.ts` open the database and run the operations.
 */
import crypto from "node:crypto";
import { sql, type Selectable } from "kysely";
import { displayPrefix, generateKey, hashKey, hashesEqual, isWellFormedKey } from "./keys.js";
import { assertMicro } from "./money.js";
import { checkOrgName, newHoldId } from "./shared.js";
import { all, changes, exec, first, transaction, type Dialect, type Op, type Tables } from "./sql.js";
import type * as T from "./types.js";

/** SQLite answers synchronously, PostgreSQL with promises. */
export type Mode = "sync" | "async";
export type Out<M extends Mode, R> = M extends "sync" ? R : Promise<R>;

type Row<K extends keyof Tables> = Selectable<Tables[K]>;
type EntryDetail = "hold_id" | "request_id" | "model" | "input_tokens" | "price" | "expires_at" | "note";
type NewEntry = Pick<Row<"ledger">, "org_id" | "kind" | "amount"> & Partial<Pick<Row<"ledger">, EntryDetail>>;
type Close = { kind: "settle"; charge: number; inputTokens: number; price: number } | { kind: "release"; reason: string };

const toOrg = (r: Row<"organizations">): T.Org => ({
  id: r.id,
  name: r.name,
  createdAt: r.created_at,
  maxConcurrency: r.max_concurrency,
  hasPurchased: Boolean(r.has_purchased),
});

/** Ledger and hold columns under the names the API gives them. */
const LEDGER_ENTRY = [
  "seq", "org_id as orgId", "kind", "amount as amountMicro", "hold_id as holdId", "request_id as requestId", "model",
  "input_tokens as inputTokens", "price as priceMicroPerMTok", "expires_at as expiresAt", "note", "created_at as createdAt",
] as const;
const OPEN_HOLD = ["hold_id as holdId", "org_id as orgId", "amount as amountMicro", "expires_at as expiresAt", "request_id as requestId", "model", "created_at as createdAt"] as const;

const iso = (ms: number) => new Date(ms).toISOString();

function* equalsOne(count: Op<number>): Op<boolean> {
  return (yield* count) === 1;
}

export abstract class SqlAccountsStore<M extends Mode> implements T.AccountsStore, T.CreditStore {
  protected constructor(
    protected readonly d: Dialect,
    private readonly startingGrantMicro: number,
  ) {}

  /** Run `op` on this store's database. */
  protected abstract run<R>(op: Op<R>): Out<M, R>;
  abstract close(): Out<M, void>;

  /** `body` (a function: with this store as `this`) in one transaction. */
  private tx<R>(body: Op<R> | ((this: this) => Op<R>)): Out<M, R> {
    return this.run(transaction(this.d, typeof body === "function" ? body.call(this) : body));
  }

  /** `body` outside a transaction: reads, or transactions of its own. */
  private read<R>(body: (this: this) => Op<R>): Out<M, R> {
    return this.run(body.call(this));
  }

  // ------------------------------------------------------------ orgs and keys

  private orgWhere(column: "id" | "name", value: string) {
    return this.d.db.selectFrom("organizations").selectAll().where(column, "=", value);
  }

  private *ensureOrgIn(name: string, now: number): Op<T.Org> {
    const n = checkOrgName(name);
    const org = { id: `org_${crypto.randomUUID()}`, name: n, created_at: iso(now) };
    yield* changes(this.d.db.insertInto("organizations").values(org).onConflict((oc) => oc.column("name").doNothing()));
    const row = yield* first(this.orgWhere("name", n));
    if (!row) throw new Error(`organization "${n}" could not be created`);
    yield* this.ensureAccount(row.id, now);
    return toOrg(row);
  }

  ensureOrg(name: string): Out<M, T.Org> {
    return this.tx(this.ensureOrgIn(name, Date.now()));
  }

  private *findOrgIn(name: string): Op<T.Org | null> {
    const row = yield* first(this.orgWhere("name", name.trim()));
    return row ? toOrg(row) : null;
  }

  findOrg(name: string): Out<M, T.Org | null> {
    return this.run(this.findOrgIn(name));
  }

  private *createKeyIn(orgName: string): Op<T.CreatedKey> {
    const now = Date.now();
    const org = yield* this.ensureOrgIn(orgName, now);
    const key = generateKey();
    const keyId = `key_${crypto.randomUUID()}`;
    const row = { id: keyId, org_id: org.id, hash: hashKey(key), prefix: displayPrefix(key), created_at: iso(now) };
    yield* changes(this.d.db.insertInto("api_keys").values(row));
    return { key, keyId, org };
  }

  createKey(orgName: string): Out<M, T.CreatedKey> {
    return this.tx(this.createKeyIn(orgName));
  }

  private anyKey() {
    return this.d.db.selectFrom("api_keys").select(sql<number>`1`.as("one")).limit(1);
  }

  createFirstKey(orgName: string): Out<M, T.CreatedKey | null> {
    return this.tx(function* () {
      for (const s of this.d.firstKeyLock) yield* exec(s);
      return (yield* first(this.anyKey())) ? null : yield* this.createKeyIn(orgName);
    });
  }

  private *checkKeyIn(key: string): Op<T.KeyCheck> {
    // A malformed key is refused without a query (and without a database).
    if (typeof key !== "string" || !isWellFormedKey(key)) return { state: "unknown" };
    const hash = hashKey(key);
    const row = yield* first(
      this.d.db
        .selectFrom("api_keys as k")
        .innerJoin("organizations as o", "o.id", "k.org_id")
        .select(["k.id as key_id", "k.hash as key_hash", "k.revoked_at"])
        .selectAll("o")
        .where("k.hash", "=", hash),
    );
    if (!row || !hashesEqual(row.key_hash, hash)) return { state: "unknown" };
    if (row.revoked_at !== null) return { state: "revoked", keyId: row.key_id };
    return { state: "valid", org: toOrg(row), keyId: row.key_id };
  }

  checkKey(key: string): Out<M, T.KeyCheck> {
    return this.run(this.checkKeyIn(key));
  }

  verifyKey(key: string): Out<M, T.Org | null> {
    return this.read(function* () {
      const c = yield* this.checkKeyIn(key);
      return c.state === "valid" ? c.org : null;
    });
  }

  revokeKey(keyId: string): Out<M, boolean> {
    const revoke = this.d.db.updateTable("api_keys").set({ revoked_at: iso(Date.now()) }).where("id", "=", keyId).where("revoked_at", "is", null);
    return this.run(equalsOne(changes(revoke)));
  }

  listKeys(orgName: string): Out<M, T.KeyInfo[]> {
    return this.read(function* () {
      const rows = yield* all(
        this.d.db
          .selectFrom("api_keys as k")
          .innerJoin("organizations as o", "o.id", "k.org_id")
          .select(["k.id", "k.org_id", "k.prefix", "k.created_at", "k.revoked_at"])
          .where("o.name", "=", orgName.trim())
          .orderBy("k.created_at")
          .orderBy(sql.raw(this.d.keyTieBreak)),
      );
      return rows.map((r) => ({ id: r.id, orgId: r.org_id, prefix: r.prefix, createdAt: r.created_at, revokedAt: r.revoked_at }));
    });
  }

  isEmpty(): Out<M, boolean> {
    return this.read(function* () {
      return (yield* first(this.anyKey())) === undefined;
    });
  }

  // ------------------------------------------------------------------ credit

  /**
   * The organization's balance row, created on first use together with the
   * starting grant. New organizations get it in `ensureOrg`; one that
   * existed before the ledger did gets it the first time it is billed.
   */
  private *ensureAccount(orgId: string, now: number): Op<void> {
    const row = { org_id: orgId, credit: 0, held: 0, updated_at: iso(now) };
    const created = yield* changes(this.d.db.insertInto("balances").values(row).onConflict((oc) => oc.column("org_id").doNothing()));
    if (created !== 1 || this.startingGrantMicro === 0) return;
    yield* this.append({ org_id: orgId, kind: "grant", amount: this.startingGrantMicro, note: "starting grant" }, now);
    yield* this.addToBalance(orgId, this.startingGrantMicro, 0, now);
  }

  private *append(e: NewEntry, now: number): Op<void> {
    yield* changes(this.d.db.insertInto("ledger").values({ ...e, created_at: iso(now) }));
  }

  private *addToBalance(orgId: string, credit: number, held: number, now: number): Op<void> {
    const add = this.d.db
      .updateTable("balances")
      .set((eb) => ({ credit: eb("credit", "+", credit), held: eb("held", "+", held), updated_at: iso(now) }));
    yield* changes(add.where("org_id", "=", orgId));
  }

  /** The balance row with its organization's flag, locked for this transaction where the dialect locks rows. */
  private *lockedBalance(orgId: string): Op<T.Balance | undefined> {
    const r = yield* first(
      this.d.db
        .selectFrom("balances as b")
        .innerJoin("organizations as o", "o.id", "b.org_id")
        .select(["b.org_id", "b.credit", "b.held", "o.has_purchased"])
        .where("b.org_id", "=", orgId)
        .$if(this.d.rowLocks, (q) => q.forUpdate("b")),
    );
    return r && { orgId: r.org_id, creditMicro: r.credit, heldMicro: r.held, availableMicro: r.credit - r.held, hasPurchased: Boolean(r.has_purchased) };
  }

  /** The balance after the organization's expired holds are released, under its lock. */
  private *currentBalance(orgId: string, now: number): Op<T.Balance> {
    yield* this.balanceOf(orgId, now);
    yield* this.releaseExpired(orgId, now);
    return yield* this.balanceOf(orgId, now);
  }

  /** Lock the organization's balance row (creating it if needed) and read it. */
  private *balanceOf(orgId: string, now: number): Op<T.Balance> {
    yield* this.ensureAccount(orgId, now);
    const b = yield* this.lockedBalance(orgId);
    if (!b) throw new Error(`no organization with id ${orgId}`);
    return b;
  }

  private *requireOrgId(orgId: string): Op<void> {
    if (!(yield* first(this.orgWhere("id", orgId)))) throw new Error(`no organization with id ${orgId}`);
  }

  /** Close one open hold whose organization's balance row this transaction has locked. */
  private *closeHold(holdId: string, now: number, close: Close): Op<boolean> {
    const h = yield* first(this.d.db.deleteFrom("open_holds").where("hold_id", "=", holdId).returningAll());
    if (!h) return false;
    const entry = { org_id: h.org_id, hold_id: holdId, request_id: h.request_id, model: h.model };
    if (close.kind === "settle") {
      yield* this.append({ ...entry, kind: "settle", amount: close.charge, input_tokens: close.inputTokens, price: close.price }, now);
      yield* this.addToBalance(h.org_id, -close.charge, -h.amount, now);
    } else {
      yield* this.append({ ...entry, kind: "release", amount: h.amount, note: close.reason }, now);
      yield* this.addToBalance(h.org_id, 0, -h.amount, now);
    }
    return true;
  }

  /** Lock the hold's organization, then close the hold (lock order: balance row first, always). */
  private *closeLocked(holdId: string, now: number, close: Close): Op<boolean> {
    const open = yield* first(this.d.db.selectFrom("open_holds").select("org_id").where("hold_id", "=", holdId));
    if (!open) return false;
    yield* this.balanceOf(open.org_id, now);
    return yield* this.closeHold(holdId, now, close);
  }

  private *releaseExpired(orgId: string, now: number): Op<number> {
    const expired = this.d.db.selectFrom("open_holds").select("hold_id").where("org_id", "=", orgId).where("expires_at", "<=", now);
    let n = 0;
    for (const r of yield* all(expired.orderBy("expires_at"))) {
      if (yield* this.closeHold(r.hold_id, now, { kind: "release", reason: "expired" })) n++;
    }
    return n;
  }

  addCredit(orgName: string, kind: "purchase" | "grant", amountMicro: number, note: string | null, now: number): Out<M, { org: T.Org; balance: T.Balance }> {
    return this.tx(function* () {
      assertMicro(amountMicro, "amount");
      if (amountMicro === 0) throw new Error("amount must be more than zero");
      const found = yield* this.findOrgIn(orgName);
      if (!found) throw new Error(`no organization named "${orgName.trim()}"; create it with \`assay key create --org NAME\``);
      yield* this.balanceOf(found.id, now);
      yield* this.append({ org_id: found.id, kind, amount: amountMicro, note }, now);
      yield* this.addToBalance(found.id, amountMicro, 0, now);
      if (kind === "purchase") {
        yield* changes(this.d.db.updateTable("organizations").set({ has_purchased: sql<boolean>`TRUE` }).where("id", "=", found.id));
      }
      const org = toOrg((yield* first(this.orgWhere("id", found.id)))!);
      return { org, balance: yield* this.balanceOf(found.id, now) };
    });
  }

  placeHold(req: T.HoldRequest): Out<M, T.HoldResult> {
    return this.tx(function* (): Op<T.HoldResult> {
      assertMicro(req.amountMicro, "hold amount");
      yield* this.requireOrgId(req.orgId);
      const before = yield* this.currentBalance(req.orgId, req.now);
      if (before.availableMicro < req.amountMicro) return { ok: false, balance: before };
      const holdId = newHoldId();
      const expiresAt = req.now + req.ttlMs;
      const hold = { hold_id: holdId, org_id: req.orgId, amount: req.amountMicro, expires_at: expiresAt, request_id: req.requestId, model: req.model };
      yield* this.append({ ...hold, kind: "hold", input_tokens: req.inputTokens, price: req.priceMicroPerMTok }, req.now);
      yield* changes(this.d.db.insertInto("open_holds").values({ ...hold, created_at: iso(req.now) }));
      yield* this.addToBalance(req.orgId, 0, req.amountMicro, req.now);
      return { ok: true, holdId, expiresAt, balance: yield* this.balanceOf(req.orgId, req.now) };
    });
  }

  renewHold(holdId: string, expiresAt: number): Out<M, boolean> {
    const renew = this.d.db
      .updateTable("open_holds")
      .set((eb) => ({ expires_at: eb.fn<number>(this.d.greatest, ["expires_at", eb.val(expiresAt)]) }))
      .where("hold_id", "=", holdId);
    return this.run(equalsOne(changes(renew)));
  }

  settleHold(req: T.SettleRequest): Out<M, boolean> {
    return this.tx(function* () {
      assertMicro(req.chargeMicro, "charge");
      return yield* this.closeLocked(req.holdId, req.now, { kind: "settle", charge: req.chargeMicro, inputTokens: req.inputTokens, price: req.priceMicroPerMTok });
    });
  }

  releaseHold(holdId: string, reason: string, now: number): Out<M, boolean> {
    return this.tx(this.closeLocked(holdId, now, { kind: "release", reason }));
  }

  releaseExpiredHolds(now: number, orgId?: string): Out<M, number> {
    return this.read(function* () {
      const expired = this.d.db.selectFrom("open_holds").select("org_id").distinct().where("expires_at", "<=", now);
      const orgs = orgId !== undefined ? [orgId] : (yield* all(expired)).map((r) => r.org_id);
      let n = 0;
      // One transaction per organization: each locks only its own balance row.
      for (const id of orgs) n += yield* transaction(this.d, this.sweepOrg(id, now));
      return n;
    });
  }

  private *sweepOrg(orgId: string, now: number): Op<number> {
    yield* this.lockedBalance(orgId);
    return yield* this.releaseExpired(orgId, now);
  }

  balance(orgId: string, now: number): Out<M, T.Balance> {
    return this.tx(function* () {
      yield* this.requireOrgId(orgId);
      return yield* this.currentBalance(orgId, now);
    });
  }

  usage(orgName: string, now: number, recent: number): Out<M, T.UsageReport | null> {
    return this.tx(function* (): Op<T.UsageReport | null> {
      const db = this.d.db;
      const found = yield* this.findOrgIn(orgName);
      if (!found) return null;
      const balance = yield* this.currentBalance(found.id, now);
      const totals = { grantsMicro: 0, purchasesMicro: 0, chargesMicro: 0, charges: 0 };
      const sums = db
        .selectFrom("ledger")
        .select((eb) => ["kind", eb.fn.coalesce(eb.fn.sum<number>("amount"), eb.lit(0)).as("total"), eb.fn.countAll<number>().as("n")]);
      for (const t of yield* all(sums.where("org_id", "=", found.id).groupBy("kind"))) {
        if (t.kind === "grant") totals.grantsMicro = t.total;
        if (t.kind === "purchase") totals.purchasesMicro = t.total;
        if (t.kind === "settle") {
          totals.chargesMicro = t.total;
          totals.charges = t.n;
        }
      }
      const openHolds = yield* all(db.selectFrom("open_holds").select(OPEN_HOLD).where("org_id", "=", found.id).orderBy("created_at"));
      const settled = db.selectFrom("ledger").select(LEDGER_ENTRY).where("org_id", "=", found.id).where("kind", "=", "settle");
      const recentCharges = yield* all(settled.orderBy("seq", "desc").limit(Math.max(0, recent)));
      // Read again under the lock: a purchase may have committed since `found` was read.
      const org = toOrg((yield* first(this.orgWhere("id", found.id)))!);
      return { org, balance, totals, openHolds, recentCharges };
    });
  }

  ledger(orgId: string): Out<M, T.LedgerEntry[]> {
    return this.run(all(this.d.db.selectFrom("ledger").select(LEDGER_ENTRY).where("org_id", "=", orgId).orderBy("seq")));
  }

  audit(orgId: string): Out<M, T.LedgerAudit> {
    return this.tx(function* () {
      const kept = yield* this.lockedBalance(orgId);
      const derived = yield* first(
        sql<{ credit: number; held: number }>`
          SELECT
            (SELECT COALESCE(SUM(CASE WHEN kind IN ('grant', 'purchase') THEN amount
                                      WHEN kind = 'settle' THEN -amount ELSE 0 END), 0)
               FROM ledger WHERE org_id = ${orgId}) AS credit,
            (SELECT COALESCE(SUM(h.amount), 0) FROM ledger h
              WHERE h.org_id = ${orgId} AND h.kind = 'hold'
                AND NOT EXISTS (SELECT 1 FROM ledger c WHERE c.hold_id = h.hold_id AND c.kind IN ('settle', 'release'))) AS held`.compile(this.d.db),
      );
      return {
        derived: { creditMicro: derived!.credit, heldMicro: derived!.held },
        kept: { creditMicro: kept?.creditMicro ?? 0, heldMicro: kept?.heldMicro ?? 0 },
      };
    });
  }
}
