/**
 * Numbered schema migrations for the PostgreSQL store (replicas). Same
 * numbering and meaning as the SQLite ones in migrations.ts; append only.
 * All pending ones run in one transaction under an advisory lock, so
 * replicas starting together apply each migration exactly once.
 */
import type { PoolClient } from "pg";
import type { Migration } from "./migrations.js";

export const PG_MIGRATIONS: readonly Migration[] = [
  {
    version: 1,
    name: "organizations and api keys",
    sql: `
      CREATE TABLE organizations (
        id              TEXT PRIMARY KEY,
        name            TEXT NOT NULL UNIQUE,
        created_at      TEXT NOT NULL,
        max_concurrency INTEGER NULL CHECK (max_concurrency IS NULL OR max_concurrency > 0),
        has_purchased   BOOLEAN NOT NULL DEFAULT FALSE
      );
      CREATE TABLE api_keys (
        id          TEXT PRIMARY KEY,
        org_id      TEXT NOT NULL REFERENCES organizations(id),
        hash        TEXT NOT NULL UNIQUE,
        prefix      TEXT NOT NULL,
        created_at  TEXT NOT NULL,
        revoked_at  TEXT NULL
      );
      CREATE INDEX api_keys_org_id ON api_keys(org_id);
    `,
  },
  {
    version: 2,
    name: "credit ledger, balances and open holds",
    sql: `
      CREATE TABLE balances (
        org_id      TEXT PRIMARY KEY REFERENCES organizations(id),
        credit      BIGINT NOT NULL,
        held        BIGINT NOT NULL CHECK (held >= 0),
        updated_at  TEXT NOT NULL
      );
      CREATE TABLE ledger (
        seq           BIGSERIAL PRIMARY KEY,
        org_id        TEXT NOT NULL REFERENCES organizations(id),
        kind          TEXT NOT NULL CHECK (kind IN ('grant', 'purchase', 'hold', 'settle', 'release')),
        amount        BIGINT NOT NULL CHECK (amount >= 0),
        hold_id       TEXT NULL,
        request_id    TEXT NULL,
        model         TEXT NULL,
        input_tokens  BIGINT NULL,
        price         BIGINT NULL,
        expires_at    BIGINT NULL,
        note          TEXT NULL,
        created_at    TEXT NOT NULL,
        CHECK ((kind IN ('grant', 'purchase')) = (hold_id IS NULL)),
        CHECK (kind NOT IN ('grant', 'purchase') OR amount > 0)
      );
      CREATE INDEX ledger_org_seq ON ledger(org_id, seq);
      CREATE UNIQUE INDEX ledger_hold_opened ON ledger(hold_id) WHERE kind = 'hold';
      CREATE UNIQUE INDEX ledger_hold_closed ON ledger(hold_id) WHERE kind IN ('settle', 'release');
      CREATE FUNCTION ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'the ledger is append-only'; END;
      $$;
      CREATE TRIGGER ledger_no_update_delete BEFORE UPDATE OR DELETE ON ledger
        FOR EACH ROW EXECUTE FUNCTION ledger_append_only();
      CREATE TRIGGER ledger_no_truncate BEFORE TRUNCATE ON ledger
        FOR EACH STATEMENT EXECUTE FUNCTION ledger_append_only();
      CREATE TABLE open_holds (
        hold_id     TEXT PRIMARY KEY,
        org_id      TEXT NOT NULL REFERENCES organizations(id),
        amount      BIGINT NOT NULL CHECK (amount >= 0),
        expires_at  BIGINT NOT NULL,
        request_id  TEXT NULL,
        model       TEXT NULL,
        created_at  TEXT NOT NULL
      );
      CREATE INDEX open_holds_org_expiry ON open_holds(org_id, expires_at);
      CREATE INDEX open_holds_expiry ON open_holds(expires_at);
    `,
  },
];

/** Advisory lock key for migrations (any fixed 64-bit number). */
const MIGRATION_LOCK = 7_214_550_113n;

/**
 * Apply pending migrations in the client's current schema (creating `schema`
 * first when given, under the same lock: CREATE SCHEMA IF NOT EXISTS alone
 * races); returns the versions applied now.
 */
export async function migratePg(
  client: PoolClient,
  schema: string | null = null,
  migrations: readonly Migration[] = PG_MIGRATIONS,
): Promise<number[]> {
  await client.query("BEGIN");
  try {
    await client.query("SELECT pg_advisory_xact_lock($1)", [MIGRATION_LOCK.toString()]);
    if (schema !== null) await client.query(`CREATE SCHEMA IF NOT EXISTS "${schema}"`);
    await client.query(`
      CREATE TABLE IF NOT EXISTS schema_migrations (
        version    INTEGER PRIMARY KEY,
        name       TEXT NOT NULL,
        applied_at TEXT NOT NULL
      )`);
    const { rows } = await client.query<{ version: number }>("SELECT version FROM schema_migrations");
    const applied = new Set(rows.map((r) => r.version));
    const latest = migrations.reduce((m, x) => Math.max(m, x.version), 0);
    const newest = Math.max(0, ...applied);
    if (newest > latest) {
      throw new Error(
        `the accounts database is at schema version ${newest}, newer than this build knows (${latest}); upgrade assay`,
      );
    }
    const now = new Date().toISOString();
    const done: number[] = [];
    for (const m of [...migrations].sort((a, b) => a.version - b.version)) {
      if (applied.has(m.version)) continue;
      await client.query(m.sql);
      await client.query("INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, $2, $3)", [m.version, m.name, now]);
      done.push(m.version);
    }
    await client.query("COMMIT");
    return done;
  } catch (e) {
    await client.query("ROLLBACK").catch(() => {});
    throw e;
  }
}
