/**
 * Embedded store: one SQLite file, `${dataDir}/assay.db`, opened
 * synchronously (better-sqlite3). Lookups are index probes of microseconds,
 * so a synchronous call on the request path costs less than a hop to a pool:
 * the store's operations run to completion without a promise. Every change
 * runs in one IMMEDIATE transaction (a single writer at a time, across
 * processes too: server and CLI share the file).
 */
import fs from "node:fs";
import path from "node:path";
import Database from "better-sqlite3";
import { Kysely, SqliteDialect } from "kysely";
import { migrate } from "./migrations.js";
import { startingGrant, type StoreOptions } from "./shared.js";
import { drive, transaction, type Dialect, type Op, type Result, type Tables } from "./sql.js";
import { SqlAccountsStore } from "./store.js";

export const DB_FILE = "assay.db";

const sqlite = (db: Database.Database): Dialect => ({
  db: new Kysely<Tables>({ dialect: new SqliteDialect({ database: db }) }),
  begin: "BEGIN IMMEDIATE",
  rowLocks: false,
  greatest: "max",
  keyTieBreak: "k.rowid",
  firstKeyLock: [],
  migrationLock: [],
  ddl: {
    bigint: "INTEGER",
    flag: "INTEGER NOT NULL DEFAULT 0 CHECK (has_purchased IN (0, 1))",
    serial: "INTEGER PRIMARY KEY",
    appendOnly: ["UPDATE", "DELETE"].map(
      (op) => `CREATE TRIGGER ledger_no_${op.toLowerCase()} BEFORE ${op} ON ledger
        BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END`,
    ),
  },
});

export class SqliteAccountsStore extends SqlAccountsStore<"sync"> {
  readonly file: string;
  private readonly db: Database.Database;
  /** Prepared once per distinct SQL text, like the hand-prepared statements of a fixed query set. */
  private readonly statements = new Map<string, Database.Statement>();
  private closed = false;

  constructor(dataDir: string, options: StoreOptions = {}) {
    const grant = startingGrant(options);
    fs.mkdirSync(dataDir, { recursive: true, mode: 0o700 });
    const file = path.join(dataDir, DB_FILE);
    const db = new Database(file);
    super(sqlite(db), grant);
    this.file = file;
    this.db = db;
    try {
      // The file holds no secrets (hashes only), but nothing else needs to read it.
      fs.chmodSync(file, 0o600);
    } catch {
      /* best effort: a read-only mount or foreign owner is not fatal */
    }
    db.pragma("journal_mode = WAL");
    db.pragma("synchronous = NORMAL");
    db.pragma("foreign_keys = ON");
    // Server and CLI may write at the same moment; wait rather than fail.
    db.pragma("busy_timeout = 5000");
    try {
      this.run(transaction(this.d, migrate(this.d)));
    } catch (e) {
      db.close();
      throw e;
    }
  }

  protected override run<T>(op: Op<T>): T {
    // `execute` never returns a promise, so neither does `drive`.
    return drive(op, (q): Result => {
      let stmt = this.statements.get(q.sql);
      if (!stmt) this.statements.set(q.sql, (stmt = this.db.prepare(q.sql)));
      return stmt.reader ? { rows: stmt.all(...q.parameters), changes: 0 } : { rows: [], changes: stmt.run(...q.parameters).changes };
    }) as T;
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.db.close();
  }
}
