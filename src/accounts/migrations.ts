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
