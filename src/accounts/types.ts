/**
 * What the rest of the service knows about accounts: organizations and the
 * API keys that charge them. Stores (SQLite now, Postgres later) implement
 * `AccountsStore`; nothing outside src/accounts/ touches a database.
 */
export interface Org {
  id: string;
  name: string;
  /** ISO 8601, UTC. */
  createdAt: string;
  /** Per-organization override of the concurrency limit; null = the spec default (4, or 100 once purchased). */
  maxConcurrency: number | null;
  /** Whether the organization has ever bought credit (lifts the concurrency default). */
  hasPurchased: boolean;
}

/** A key as listed: never the key itself, only its display prefix. */
export interface KeyInfo {
  id: string;
  orgId: string;
  /** First characters of the key (`sk-assay-AbCd`), enough to tell keys apart. */
  prefix: string;
  createdAt: string;
  revokedAt: string | null;
}

export interface CreatedKey {
  /** The raw key: shown once, never stored. */
  key: string;
  keyId: string;
  org: Org;
}

/** Result of looking a presented key up; lets the HTTP layer say why a key is refused. */
export type KeyCheck =
  | { state: "valid"; org: Org; keyId: string }
  | { state: "revoked"; keyId: string }
  | { state: "unknown" };

export interface AccountsStore {
  /** Return the organization named `name`, creating it if needed. */
  ensureOrg(name: string): Org;
  /** Create a key for `orgName` (the organization is created if needed). */
  createKey(orgName: string): CreatedKey;
  /** The organization a valid key belongs to, or null (unknown, revoked or malformed). */
  verifyKey(key: string): Org | null;
  /** Same lookup as `verifyKey`, but says which way a refused key failed. */
  checkKey(key: string): KeyCheck;
  /** Revoke a key by id; false when there is no such key or it was already revoked. */
  revokeKey(keyId: string): boolean;
  /** Keys of the named organization, oldest first; empty when it does not exist. */
  listKeys(orgName: string): KeyInfo[];
  /** True until the first API key is created (revoked keys still count). */
  isEmpty(): boolean;
  close(): void;
}
