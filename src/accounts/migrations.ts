/**
 * Numbered schema migrations for the embedded store. Append only: a
 * released migration is never edited, a change is a new number. All pending
 * ones run in one IMMEDIATE transaction at open, so two processes opening
 * the same file (server and `assay key create`) cannot both apply them.
 */
import type Database from "better-sqlite3";

export interface Migration {
  version: number;
  name: string;
  sql: string;
}

export const MIGRATIONS: readonly Migration[] = [
  {
    version: 1,
    name: "organizations and api keys",
    // organizations carries what admission needs later: a concurrency
    // override (NULL = spec default) and whether credit was ever bought
    // (4 concurrent requests before the first purchase, 100 after).
    sql: `
      CREATE TABLE organizations (
        id              TEXT PRIMARY KEY,
        name            TEXT NOT NULL UNIQUE,
        created_at      TEXT NOT NULL,
        max_concurrency INTEGER NULL CHECK (max_concurrency IS NULL OR max_concurrency > 0),
        has_purchased   INTEGER NOT NULL DEFAULT 0 CHECK (has_purchased IN (0, 1))
      );
      CREATE TABLE api_keys (
        id          TEXT PRIMARY KEY,
        org_id      TEXT NOT NULL REFERENCES organizations(id),
        hash        TEXT NOT NULL UNIQUE,   -- sha256(key), hex; the key itself is never stored
        prefix      TEXT NOT NULL,          -- display only: 'sk-assay-' + 4 chars
        created_at  TEXT NOT NULL,
        revoked_at  TEXT NULL
      );
      CREATE INDEX api_keys_org_id ON api_keys(org_id);
    `,
  },
  {
    version: 2,
    name: "credit ledger, balances and open holds",
    // The ledger is append-only (triggers refuse UPDATE and DELETE). A hold
    // is opened once and closed once (settle or release): two partial unique
    // indexes make a second close fail, so nothing is charged twice.
    // `balances` is kept in the same transaction as every ledger append;
    // `open_holds` is the working set of holds not yet closed (the ledger
    // keeps the history). Money is INTEGER micro-USD; times in ms.
    sql: `
      CREATE TABLE balances (
        org_id      TEXT PRIMARY KEY REFERENCES organizations(id),
        credit      INTEGER NOT NULL,
        held        INTEGER NOT NULL CHECK (held >= 0),
        updated_at  TEXT NOT NULL
      );
      CREATE TABLE ledger (
        seq           INTEGER PRIMARY KEY,
        org_id        TEXT NOT NULL REFERENCES organizations(id),
        kind          TEXT NOT NULL CHECK (kind IN ('grant', 'purchase', 'hold', 'settle', 'release')),
        amount        INTEGER NOT NULL CHECK (amount >= 0),
        hold_id       TEXT NULL,
        request_id    TEXT NULL,
        model         TEXT NULL,
        input_tokens  INTEGER NULL,
        price         INTEGER NULL,
        expires_at    INTEGER NULL,
        note          TEXT NULL,
        created_at    TEXT NOT NULL,
        CHECK ((kind IN ('grant', 'purchase')) = (hold_id IS NULL)),
        CHECK (kind NOT IN ('grant', 'purchase') OR amount > 0)
      );
      CREATE INDEX ledger_org_seq ON ledger(org_id, seq);
      CREATE UNIQUE INDEX ledger_hold_opened ON ledger(hold_id) WHERE kind = 'hold';
      CREATE UNIQUE INDEX ledger_hold_closed ON ledger(hold_id) WHERE kind IN ('settle', 'release');
      CREATE TRIGGER ledger_no_update BEFORE UPDATE ON ledger
        BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
      CREATE TRIGGER ledger_no_delete BEFORE DELETE ON ledger
        BEGIN SELECT RAISE(ABORT, 'the ledger is append-only'); END;
      CREATE TABLE open_holds (
        hold_id     TEXT PRIMARY KEY,
        org_id      TEXT NOT NULL REFERENCES organizations(id),
        amount      INTEGER NOT NULL CHECK (amount >= 0),
        expires_at  INTEGER NOT NULL,
        request_id  TEXT NULL,
        model       TEXT NULL,
        created_at  TEXT NOT NULL
      );
      CREATE INDEX open_holds_org_expiry ON open_holds(org_id, expires_at);
      CREATE INDEX open_holds_expiry ON open_holds(expires_at);
    `,
  },
];

/** Apply pending migrations; returns the versions applied now (empty when up to date). */
export function migrate(db: Database.Database, migrations: readonly Migration[] = MIGRATIONS): number[] {
  db.exec(`
    CREATE TABLE IF NOT EXISTS schema_migrations (
      version    INTEGER PRIMARY KEY,
      name       TEXT NOT NULL,
      applied_at TEXT NOT NULL
    )
  `);
  const run = db.transaction((): number[] => {
    const applied = new Set(
      (db.prepare("SELECT version FROM schema_migrations").all() as { version: number }[]).map((r) => r.version),
    );
    const latest = migrations.reduce((m, x) => Math.max(m, x.version), 0);
    const newest = Math.max(0, ...applied);
    if (newest > latest) {
      throw new Error(
        `the accounts database is at schema version ${newest}, newer than this build knows (${latest}); upgrade assay`,
      );
    }
    const now = new Date().toISOString();
    const insert = db.prepare("INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)");
    const done: number[] = [];
    for (const m of [...migrations].sort((a, b) => a.version - b.version)) {
      if (applied.has(m.version)) continue;
      db.exec(m.sql);
      insert.run(m.version, m.name, now);
      done.push(m.version);
    }
    return done;
  });
  return run.immediate();
}
