export type { AccountsStore, CreatedKey, KeyCheck, KeyInfo, Org } from "./types.js";
export { SqliteAccountsStore, openSqliteAccounts, DB_FILE, checkOrgName } from "./sqlite.js";
export { ensureLocalKey, LOCAL_ORG, LOCAL_KEY_FILE, type LocalKey, type LocalKeyLog } from "./local-key.js";
export { KEY_PATTERN, KEY_PREFIX, isWellFormedKey } from "./keys.js";

import type { Config } from "../config/index.js";
import { openSqliteAccounts } from "./sqlite.js";
import type { AccountsStore } from "./types.js";

/** The store the config asks for. Only the embedded SQLite store exists today. */
export function openAccounts(config: Pick<Config, "dataDir">): AccountsStore {
  return openSqliteAccounts(config.dataDir);
}
