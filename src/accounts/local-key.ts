/**
 * First start: a fresh store has no key, so nobody could call the service.
 * Create organization `local` (with the starting grant, like any new
 * organization) with one key, show it once and keep a copy in
 * `${dataDir}/local-api-key` (mode 0600) for local tools to read.
 */
import fs from "node:fs";
import path from "node:path";
import type { AccountsStore } from "./types.js";

export const LOCAL_ORG = "local";
export const LOCAL_KEY_FILE = "local-api-key";

export interface LocalKeyLog {
  info(obj: object, msg?: string): void;
}

export interface LocalKey {
  key: string;
  keyId: string;
  file: string;
}

/**
 * Returns the new key when one was created, null when the store already had
 * keys (revoked ones count: revoking every key must not mint a new one).
 * The check and the creation are one transaction, so two replicas starting
 * together on one PostgreSQL database create one key, not two.
 * `print` writes one line to stdout by default.
 */
export async function ensureLocalKey(
  accounts: AccountsStore,
  dataDir: string,
  log: LocalKeyLog,
  print: (line: string) => void = (line) => process.stdout.write(`${line}\n`),
): Promise<LocalKey | null> {
  if (!(await accounts.isEmpty())) return null;
  const created = await accounts.createFirstKey(LOCAL_ORG);
  if (!created) return null;
  const { key, keyId, org } = created;
  const file = path.join(dataDir, LOCAL_KEY_FILE);
  writeSecretFile(file, `${key}\n`);
  // The key goes to stdout only, never into the structured log.
  log.info({ org: org.name, keyId, file }, "created the first API key");
  print(`assay: API key for organization "${org.name}" (shown once): ${key}`);
  print(`assay: saved to ${file} (mode 0600)`);
  return { key, keyId, file };
}

/** Write via a 0600 temporary file and rename, so the key is never readable by others, even briefly. */
function writeSecretFile(file: string, content: string): void {
  fs.mkdirSync(path.dirname(file), { recursive: true, mode: 0o700 });
  const tmp = `${file}.${process.pid}.tmp`;
  try {
    fs.writeFileSync(tmp, content, { mode: 0o600, flag: "w" });
    fs.chmodSync(tmp, 0o600); // mode above is masked by umask only on create; be explicit
    fs.renameSync(tmp, file);
  } catch (e) {
    fs.rmSync(tmp, { force: true });
    throw e;
  }
}
