/**
 * The one SQL layer under both stores. Kysely builds every query and
 * compiles it for the store's database; the store's logic is written once,
 * as generators (`Op`) that yield compiled queries and get their results
 * back. Each store runs them with `drive`: the embedded store synchronously
 * on better-sqlite3 (its calls answer without a promise, which a Kysely
 * driver cannot do), the PostgreSQL one on a pooled connection it can
 * discard when the connection fails.
 */
import { CompiledQuery, type Compilable, type Generated, type Kysely } from "kysely";
import type { LedgerKind } from "./types.js";

/** The tables, as both databases return them (PostgreSQL's BIGINTs are parsed to numbers). */
export interface Tables {
  organizations: {
    id: string;
    name: string;
    created_at: string;
    max_concurrency: number | null;
    /** SQLite stores 0/1, PostgreSQL a BOOLEAN. */
    has_purchased: Generated<boolean | number>;
  };
  api_keys: { id: string; org_id: string; hash: string; prefix: string; created_at: string; revoked_at: string | null };
  balances: { org_id: string; credit: number; held: number; updated_at: string };
  ledger: {
    seq: Generated<number>;
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
  };
  open_holds: { hold_id: string; org_id: string; amount: number; expires_at: number; request_id: string | null; model: string | null; created_at: string };
  schema_migrations: { version: number; name: string; applied_at: string };
}

/** Column types and triggers the two databases spell differently; the migrations take them from here. */
export interface Ddl {
  /** Money, token counts and ms timestamps (SQLite's INTEGER is 64-bit already). */
  bigint: "INTEGER" | "BIGINT";
  /** `organizations.has_purchased`. */
  flag: string;
  /** `ledger.seq`: an increasing key in insertion order. */
  serial: "INTEGER PRIMARY KEY" | "BIGSERIAL PRIMARY KEY";
  /** Triggers that refuse every UPDATE and DELETE on `ledger`. */
  appendOnly: string[];
}

/** Everything in which the two databases differ, named; the store and the migrations branch on nothing else. */
export interface Dialect {
  /** Compiles queries for this database (never runs them). */
  db: Kysely<Tables>;
  /**
   * Opens a write transaction. SQLite: IMMEDIATE takes the file's single write
   * lock at once (server and CLI share the file), so nothing fails half-way on
   * a lock upgrade and every transaction is serialized.
   */
  begin: string;
  /**
   * Lock the balance row a transaction reads (FOR UPDATE): PostgreSQL, where
   * replicas write at once and the row lock serializes each organization's
   * credit changes. SQLite's IMMEDIATE transaction already excludes every other writer.
   */
  rowLocks: boolean;
  /** The two-argument maximum. */
  greatest: "greatest" | "max";
  /** Orders keys created in the same millisecond: SQLite's rowid follows insertion; PostgreSQL has no such column. */
  keyTieBreak: "k.rowid" | "k.id";
  /** Statements that make createFirstKey's check-and-create exclusive (SQLite: the IMMEDIATE transaction does). */
  firstKeyLock: string[];
  /** Statements run first in the migration transaction (PostgreSQL: advisory lock, then the schema). */
  migrationLock: string[];
  ddl: Ddl;
}

export interface Result {
  rows: unknown[];
  /** Rows inserted, updated or deleted by a statement that returns none. */
  changes: number;
}

/** Store logic: yields queries, receives their results, returns a T. */
export type Op<T> = Generator<CompiledQuery, T, Result>;

type Query<R> = Compilable<R> | CompiledQuery<R>;
const compiled = <R>(q: Query<R>): CompiledQuery<R> => ("compile" in q ? q.compile() : q);

export function* all<R>(q: Query<R>): Op<R[]> {
  return (yield compiled(q)).rows as R[];
}

export function* first<R>(q: Query<R>): Op<R | undefined> {
  return (yield* all(q))[0];
}

export function* changes(q: Query<unknown>): Op<number> {
  return (yield compiled(q)).changes;
}

export function* exec(statement: string): Op<void> {
  yield CompiledQuery.raw(statement);
}

/** `op` in one transaction, rolled back when it throws. Ops compose with `yield*`; only the outermost opens one. */
export function* transaction<T>(d: Dialect, op: Op<T>): Op<T> {
  yield* exec(d.begin);
  try {
    const out = yield* op;
    yield* exec("COMMIT");
    return out;
  } catch (e) {
    try {
      yield* exec("ROLLBACK");
    } catch {
      // The connection failed; the PostgreSQL store discards it, which ends the transaction too.
    }
    throw e;
  }
}

/**
 * Run `op`, handing each query to `execute` and its result (or error) back.
 * Synchronous while `execute` is; from the first promise on, a promise.
 */
export function drive<T>(
  op: Op<T>,
  execute: (q: CompiledQuery) => Result | Promise<Result>,
  step: IteratorResult<CompiledQuery, T> = op.next(),
): T | Promise<T> {
  while (!step.done) {
    let result: Result | Promise<Result>;
    try {
      result = execute(step.value);
    } catch (e) {
      step = op.throw(e);
      continue;
    }
    if (result instanceof Promise) {
      return result.then(
        (r) => drive(op, execute, op.next(r)),
        (e: unknown) => drive(op, execute, op.throw(e)),
      );
    }
    step = op.next(result);
  }
  return step.value;
}
