/**
 * What the rest of the service knows about accounts: organizations, the API
 * keys that charge them, and their credit ledger. Two stores implement
 * `Store` (= `AccountsStore` & `CreditStore`): SQLite (embedded, synchronous
 * results) and PostgreSQL (replicas, promises); callers always `await`.
 * Nothing outside src/accounts/ touches a database.
 */

/** A result that a store may give synchronously (SQLite) or as a promise (PostgreSQL). */
export type Awaitable<T> = T | Promise<T>;
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
  /**
   * Return the organization named `name`, creating it if needed. A new
   * organization gets the starting grant in the same transaction.
   */
  ensureOrg(name: string): Awaitable<Org>;
  /** The organization named `name`, or null; creates nothing. */
  findOrg(name: string): Awaitable<Org | null>;
  /** Create a key for `orgName` (the organization is created if needed). */
  createKey(orgName: string): Awaitable<CreatedKey>;
  /** Create a key for `orgName` only if the store has no key at all (atomic; first start). */
  createFirstKey(orgName: string): Awaitable<CreatedKey | null>;
  /** The organization a valid key belongs to, or null (unknown, revoked or malformed). */
  verifyKey(key: string): Awaitable<Org | null>;
  /** Same lookup as `verifyKey`, but says which way a refused key failed. */
  checkKey(key: string): Awaitable<KeyCheck>;
  /** Revoke a key by id; false when there is no such key or it was already revoked. */
  revokeKey(keyId: string): Awaitable<boolean>;
  /** Keys of the named organization, oldest first; empty when it does not exist. */
  listKeys(orgName: string): Awaitable<KeyInfo[]>;
  /** True until the first API key is created (revoked keys still count). */
  isEmpty(): Awaitable<boolean>;
  close(): Awaitable<void>;
}

// ---------------------------------------------------------------- credit

/**
 * Ledger entry kinds. Every amount is a non-negative integer of µUSD.
 *   grant     free credit (the starting grant); not a purchase
 *   purchase  bought credit (`assay credit add`); lifts the concurrency limit
 *   hold      reserves `amount` for one request (its maximum cost) until `expires_at`
 *   settle    closes a hold and charges `amount` (≤ what a correct pipeline held)
 *   release   closes a hold with no charge (`note`: error, expired, abandoned)
 * A hold is closed by exactly one settle or release (a unique index says so).
 * credit = Σ grant + Σ purchase − Σ settle;  held = Σ hold not yet closed;
 * available = credit − held.
 */
export type LedgerKind = "grant" | "purchase" | "hold" | "settle" | "release";

export interface LedgerEntry {
  seq: number;
  orgId: string;
  kind: LedgerKind;
  amountMicro: number;
  holdId: string | null;
  requestId: string | null;
  model: string | null;
  /** settle: the `usage.input_tokens` charged; hold: the tokens held. */
  inputTokens: number | null;
  /** settle and hold: µUSD per million input tokens. */
  priceMicroPerMTok: number | null;
  /** hold: ms since the epoch when it releases itself unless renewed. */
  expiresAt: number | null;
  note: string | null;
  createdAt: string;
}

export interface Balance {
  orgId: string;
  /** Grants + purchases − charges. */
  creditMicro: number;
  /** Sum of open holds. */
  heldMicro: number;
  /** creditMicro − heldMicro: what a new hold may take. */
  availableMicro: number;
  hasPurchased: boolean;
}

export interface OpenHold {
  holdId: string;
  orgId: string;
  amountMicro: number;
  expiresAt: number;
  requestId: string | null;
  model: string | null;
  createdAt: string;
}

export interface HoldRequest {
  orgId: string;
  amountMicro: number;
  /** ms since the epoch (the caller's clock); the hold expires at now + ttlMs. */
  now: number;
  ttlMs: number;
  requestId: string | null;
  model: string | null;
  inputTokens: number | null;
  priceMicroPerMTok: number | null;
}

export type HoldResult =
  | { ok: true; holdId: string; expiresAt: number; balance: Balance }
  | { ok: false; balance: Balance };

export interface SettleRequest {
  holdId: string;
  chargeMicro: number;
  inputTokens: number;
  priceMicroPerMTok: number;
  now: number;
}

export interface UsageReport {
  org: Org;
  balance: Balance;
  totals: { grantsMicro: number; purchasesMicro: number; chargesMicro: number; charges: number };
  openHolds: OpenHold[];
  /** Newest first. */
  recentCharges: LedgerEntry[];
}

export interface LedgerAudit {
  /** Recomputed from the ledger alone. */
  derived: { creditMicro: number; heldMicro: number };
  /** The balance row kept in the same transactions. */
  kept: { creditMicro: number; heldMicro: number };
}

export interface CreditStore {
  /**
   * Append a purchase or grant for an existing organization (Error when there
   * is none). A purchase also marks the organization as having purchased.
   */
  addCredit(orgName: string, kind: "purchase" | "grant", amountMicro: number, note: string | null, now: number): Awaitable<{ org: Org; balance: Balance }>;
  /**
   * Hold `amountMicro` if the available balance covers it. The organization's
   * expired holds are released first, in the same transaction.
   */
  placeHold(req: HoldRequest): Awaitable<HoldResult>;
  /** Push an open hold's expiry to `expiresAt` (never earlier); false when it is already closed. */
  renewHold(holdId: string, expiresAt: number): Awaitable<boolean>;
  /** Close a hold with a charge. False (and nothing written) when the hold is already closed. */
  settleHold(req: SettleRequest): Awaitable<boolean>;
  /** Close a hold with no charge. False when it is already closed. */
  releaseHold(holdId: string, reason: string, now: number): Awaitable<boolean>;
  /** Release every open hold (of one organization, or all) that expired at or before `now`; returns how many. */
  releaseExpiredHolds(now: number, orgId?: string): Awaitable<number>;
  /** The balance after releasing the organization's expired holds. */
  balance(orgId: string, now: number): Awaitable<Balance>;
  /** Balance, open holds and recent charges of the named organization (expired holds released first); null when it does not exist. */
  usage(orgName: string, now: number, recent: number): Awaitable<UsageReport | null>;
  /** The organization's ledger, oldest first. */
  ledger(orgId: string): Awaitable<LedgerEntry[]>;
  /** The kept balance next to the one recomputed from the ledger. */
  audit(orgId: string): Awaitable<LedgerAudit>;
}

/** What the service runs on: keys, organizations and credit in one store. */
export type Store = AccountsStore & CreditStore;
