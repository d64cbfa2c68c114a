/**
 * PostgreSQL store, for several replicas sharing one database
 * (ASSAY_DATABASE_URL, optional ASSAY_DATABASE_SCHEMA): the same store as
 * the embedded one, run on pooled connections. A query waits at most 5 s and
 * a connection that failed is discarded, so a database that stops answering
 * gives 503, not a hung request.
 */
import pg from "pg";
import { Kysely, PostgresDialect } from "kysely";
import { migrate } from "./migrations.js";
import { toSafeInt } from "./money.js";
import { startingGrant, type StoreOptions } from "./shared.js";
import { drive, transaction, type Dialect, type Op, type Result, type Tables } from "./sql.js";
import { SqlAccountsStore } from "./store.js";

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
/** Advisory lock keys (any fixed numbers). */
const MIGRATION_LOCK = 7_214_550_113;
const FIRST_KEY_LOCK = "assay:first-key";
const INT8 = 20;
const NUMERIC = 1700;

const postgres = (pool: pg.Pool, schema: string | null): Dialect => ({
  db: new Kysely<Tables>({ dialect: new PostgresDialect({ pool }) }),
  begin: "BEGIN",
  rowLocks: true,
  greatest: "greatest",
  keyTieBreak: "k.id",
  firstKeyLock: [`SELECT pg_advisory_xact_lock(hashtext('${FIRST_KEY_LOCK}'))`],
  // CREATE SCHEMA IF NOT EXISTS alone races between replicas: it runs under the lock.
  migrationLock: [`SELECT pg_advisory_xact_lock(${MIGRATION_LOCK})`, ...(schema !== null ? [`CREATE SCHEMA IF NOT EXISTS "${schema}"`] : [])],
  ddl: {
    bigint: "BIGINT",
    flag: "BOOLEAN NOT NULL DEFAULT FALSE",
    serial: "BIGSERIAL PRIMARY KEY",
    appendOnly: [
      `CREATE FUNCTION ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'the ledger is append-only'; END;
      $$`,
      `CREATE TRIGGER ledger_no_update_delete BEFORE UPDATE OR DELETE ON ledger
        FOR EACH ROW EXECUTE FUNCTION ledger_append_only()`,
      `CREATE TRIGGER ledger_no_truncate BEFORE TRUNCATE ON ledger
        FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only()`,
    ],
  },
});

export class PgAccountsStore extends SqlAccountsStore<"async"> {
  private closed = false;

  private constructor(
    private readonly pool: pg.Pool,
    grant: number,
    readonly schema: string | null,
  ) {
    super(postgres(pool, schema), grant);
  }

  /** Connect, create the schema if asked for one, and apply pending migrations. */
  static async open(options: PgStoreOptions): Promise<PgAccountsStore> {
    const grant = startingGrant(options);
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
      // BIGINT and SUM() come back as numbers, as SQLite's integers do (and refuse past 2^53).
      types: {
        getTypeParser: ((oid: number, format?: "text" | "binary") =>
          oid === INT8 || oid === NUMERIC ? (v: string) => toSafeInt(v) : pg.types.getTypeParser(oid, format as "text")) as typeof pg.types.getTypeParser,
      },
      ...(schema !== null ? { options: `-c search_path=${schema}` } : {}),
    });
    // An idle client losing its connection must not crash the process.
    pool.on("error", () => {});
    const store = new PgAccountsStore(pool, grant, schema);
    try {
      await store.run(transaction(store.d, migrate(store.d)));
    } catch (e) {
      await pool.end().catch(() => {});
      throw e;
    }
    return store;
  }

  protected override async run<T>(op: Op<T>): Promise<T> {
    const first = op.next();
    if (first.done) return first.value; // answered without a query: no connection taken
    const c = await this.pool.connect();
    // A connection that failed (timed out, reset) is discarded, not pooled:
    // a timed-out query may still be pending on it, and everything queued
    // behind it would hang; nothing more is sent on it (not even ROLLBACK).
    // Closing it rolls its transaction back server-side.
    let broken: Error | undefined;
    const execute = async (q: { sql: string; parameters: readonly unknown[] }): Promise<Result> => {
      if (broken) throw broken;
      try {
        const r = await c.query(q.sql, [...q.parameters]);
        return { rows: r.rows, changes: r.rowCount ?? 0 };
      } catch (e) {
        if (!(e instanceof pg.DatabaseError)) broken = e instanceof Error ? e : new Error(String(e));
        throw e;
      }
    };
    try {
      return await drive(op, execute, first);
    } finally {
      c.release(broken);
    }
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await this.pool.end();
  }
}
