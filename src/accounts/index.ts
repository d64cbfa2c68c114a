export type * from "./types.js";
export { SqliteAccountsStore, DB_FILE } from "./sqlite.js";
export { PgAccountsStore, type PgStoreOptions } from "./postgres.js";
export { checkOrgName, DEFAULT_STARTING_GRANT_MICRO, type StoreOptions } from "./shared.js";
export { ensureLocalKey, LOCAL_ORG, LOCAL_KEY_FILE, type LocalKey, type LocalKeyLog } from "./local-key.js";
export { KEY_PATTERN, KEY_PREFIX, isWellFormedKey } from "./keys.js";
export { InProcessLimiter, type ConcurrencyLimiter, type Slot } from "./limiter.js";
export { RedisLimiter, type RedisLimiterOptions } from "./redis-limiter.js";
export { Admission, AdmittedRequest, releaseReason, DEFAULT_ADMISSION_SETTINGS, type AdmissionSettings, type AdmissionLog } from "./admission.js";
export { loadPrices, parsePrices, holdTokens, holdAmount, type PriceTable, type ModelFamily } from "./prices.js";
export { parseUsd, formatUsd, formatPrice, chargeFor, MICRO_PER_USD } from "./money.js";

import type { Config } from "../config/index.js";
import type { AdmissionLog, AdmissionSettings } from "./admission.js";
import { InProcessLimiter, type ConcurrencyLimiter } from "./limiter.js";
import { PgAccountsStore } from "./postgres.js";
import { RedisLimiter } from "./redis-limiter.js";
import { SqliteAccountsStore } from "./sqlite.js";
import type { Store } from "./types.js";

type StoreConfig = Pick<Config, "dataDir" | "databaseUrl" | "databaseSchema" | "startingGrantMicro">;

/** The store the config asks for: PostgreSQL when ASSAY_DATABASE_URL is set, else SQLite in the data dir. */
export async function openAccounts(config: StoreConfig): Promise<Store> {
  if (config.databaseUrl) {
    return PgAccountsStore.open({
      connectionString: config.databaseUrl,
      ...(config.databaseSchema ? { schema: config.databaseSchema } : {}),
      startingGrantMicro: config.startingGrantMicro,
    });
  }
  return new SqliteAccountsStore(config.dataDir, { startingGrantMicro: config.startingGrantMicro });
}

/** The limiter the config asks for: Redis when ASSAY_REDIS_URL is set, else in-process. */
export function openLimiter(
  config: Pick<Config, "redisUrl" | "redisPrefix" | "slotLeaseMs">,
  log?: Pick<AdmissionLog, "warn">,
): ConcurrencyLimiter {
  if (!config.redisUrl) return new InProcessLimiter();
  return new RedisLimiter({
    url: config.redisUrl,
    prefix: config.redisPrefix,
    leaseMs: config.slotLeaseMs,
    ...(log ? { onWarning: (obj: object, msg: string) => log.warn(obj, msg) } : {}),
  });
}

/** Admission settings from the config. */
export function admissionSettings(
  config: Pick<
    Config,
    "concurrencyBeforePurchase" | "concurrencyAfterPurchase" | "holdTtlMs" | "holdSweepMs" | "retryAfterSeconds"
  >,
): AdmissionSettings {
  return {
    concurrencyBeforePurchase: config.concurrencyBeforePurchase,
    concurrencyAfterPurchase: config.concurrencyAfterPurchase,
    holdTtlMs: config.holdTtlMs,
    sweepIntervalMs: config.holdSweepMs,
    retryAfterSeconds: config.retryAfterSeconds,
  };
}
