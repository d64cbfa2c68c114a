/**
 * Numbered schema migrations, one list for both databases. Append only: a
 * released migration is never edited, a change is a new number. Where SQLite
 * and PostgreSQL spell a column type or a trigger differently the statement
 * takes the word from the dialect (`Ddl`), so numbers, tables and columns are
 * the same on both, and a database created by the earlier per-database lists
 * (same numbers, same statements) opens as it is.
 *
 * All pending ones run in one transaction: IMMEDIATE on SQLite, so two
 * processes opening the same file (server and `assay key create`) cannot both
 * apply them; under an advisory lock on PostgreSQL, so replicas starting
 * together apply each exactly once.
 */
import { all, changes, exec, type Ddl, type Dialect, type Op } from "./sql.js";

export interface Migration {
  version: number;
  name: string;
  statements(t: Ddl): string[];
}

export const MIGRATIONS: readonly Migration[] = [
  {
    version: 1,
    name: "organizations and api keys",
    // organizations carries what admission needs later: a concurrency
    // override (NULL = spec default) and whether credit was ever bought
    // (4 concurrent requests before the first purchase, 100 after).
    statements: (t) => [
      `CREATE TABLE organizations (
        id              TEXT PRIMARY KEY,
        name            TEXT NOT NULL UNIQUE,
        created_at      TEXT NOT NULL,
        max_concurrency INTEGER NULL CHECK (max_concurrency IS NULL OR max_concurrency > 0),
        has_purchased   ${t.flag}
      )`,
      `CREATE TABLE api_keys (
        id          TEXT PRIMARY KEY,
        org_id      TEXT NOT NULL REFERENCES organizations(id),
        hash        TEXT NOT NULL UNIQUE,   -- sha256(key), hex; the key itself is never stored
        prefix      TEXT NOT NULL,          -- display only: 'sk-assay-' + 4 chars
        created_at  TEXT NOT NULL,
        revoked_at  TEXT NULL
      )`,
      "CREATE INDEX api_keys_org_id ON api_keys(org_id)",
    ],
  },
  {
    version: 2,
    name: "credit ledger, balances and open holds",
    // The ledger is append-only (triggers refuse UPDATE and DELETE). A hold
    // is opened once and closed once (settle or release): two partial unique
    // indexes make a second close fail, so nothing is charged twice.
    // `balances` is kept in the same transaction as every ledger append;
    // `open_holds` is the working set of holds not yet closed (the ledger
    // keeps the history). Money is integer micro-USD; times in ms.
    statements: (t) => [
      `CREATE TABLE balances (
        org_id      TEXT PRIMARY KEY REFERENCES organizations(id),
        credit      ${t.bigint} NOT NULL,
        held        ${t.bigint} NOT NULL CHECK (held >= 0),
        updated_at  TEXT NOT NULL
      )`,
      `CREATE TABLE ledger (
        seq           ${t.serial},
        org_id        TEXT NOT NULL REFERENCES organizations(id),
        kind          TEXT NOT NULL CHECK (kind IN ('grant', 'purchase', 'hold', 'settle', 'release')),
        amount        ${t.bigint} NOT NULL CHECK (amount >= 0),
        hold_id       TEXT NULL,
        request_id    TEXT NULL,
        model         TEXT NULL,
        input_tokens  ${t.bigint} NULL,
        price         ${t.bigint} NULL,
        expires_at    ${t.bigint} NULL,
        note          TEXT NULL,
        created_at    TEXT NOT NULL,
        CHECK ((kind IN ('grant', 'purchase')) = (hold_id IS NULL)),
        CHECK (kind NOT IN ('grant', 'purchase') OR amount > 0)
      )`,
      "CREATE INDEX ledger_org_seq ON ledger(org_id, seq)",
      "CREATE UNIQUE INDEX ledger_hold_opened ON ledger(hold_id) WHERE kind = 'hold'",
      "CREATE UNIQUE INDEX ledger_hold_closed ON ledger(hold_id) WHERE kind IN ('settle', 'release')",
      ...t.appendOnly,
      `CREATE TABLE open_holds (
        hold_id     TEXT PRIMARY KEY,
        org_id      TEXT NOT NULL REFERENCES organizations(id),
        amount      ${t.bigint} NOT NULL CHECK (amount >= 0),
        expires_at  ${t.bigint} NOT NULL,
        request_id  TEXT NULL,
        model       TEXT NULL,
        created_at  TEXT NOT NULL
      )`,
      "CREATE INDEX open_holds_org_expiry ON open_holds(org_id, expires_at)",
      "CREATE INDEX open_holds_expiry ON open_holds(expires_at)",
    ],
  },
];

/** Apply pending migrations inside the caller's transaction; returns the versions applied now. */
export function* migrate(d: Dialect, migrations: readonly Migration[] = MIGRATIONS): Op<number[]> {
  for (const s of d.migrationLock) yield* exec(s);
  yield* exec(`
    CREATE TABLE IF NOT EXISTS schema_migrations (
      version    INTEGER PRIMARY KEY,
      name       TEXT NOT NULL,
      applied_at TEXT NOT NULL
    )`);
  const applied = new Set((yield* all(d.db.selectFrom("schema_migrations").select("version"))).map((r) => r.version));
  const latest = migrations.reduce((m, x) => Math.max(m, x.version), 0);
  const newest = Math.max(0, ...applied);
  if (newest > latest) {
    throw new Error(`the accounts database is at schema version ${newest}, newer than this build knows (${latest}); upgrade assay`);
  }
  const now = new Date().toISOString();
  const done: number[] = [];
  for (const m of [...migrations].sort((a, b) => a.version - b.version)) {
    if (applied.has(m.version)) continue;
    for (const s of m.statements(d.ddl)) yield* exec(s);
    yield* changes(d.db.insertInto("schema_migrations").values({ version: m.version, name: m.name, applied_at: now }));
    done.push(m.version);
  }
  return done;
}
