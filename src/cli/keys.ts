/**
 * `assay key …`: API key administration on the configured store (the data
 * dir's SQLite file, or PostgreSQL when ASSAY_DATABASE_URL is set).
 *
 *   assay key create --org NAME   new key (org created if needed); the key alone on stdout
 *   assay key list --org NAME     id, prefix, created, revoked — never the key
 *   assay key revoke KEY_ID
 *
 * Human-readable notes go to stderr, so `KEY=$(assay key create --org x)`
 * captures just the key.
 */
import type { Command } from "commander";
import { openAccounts } from "../accounts/index.js";
import type { CreatedKey, Store } from "../accounts/types.js";
import { loadConfig } from "../config/index.js";

export interface CliIO {
  stdout: (text: string) => void;
  stderr: (text: string) => void;
  env: NodeJS.ProcessEnv;
}

/** Open the configured store (SQLite, or PostgreSQL with ASSAY_DATABASE_URL), run `fn`, close it. */
export async function withStore<T>(io: CliIO, fn: (store: Store) => T | Promise<T>): Promise<T> {
  const store = await openAccounts(loadConfig(io.env));
  try {
    return await fn(store);
  } finally {
    await store.close();
  }
}

/** Create a key for `orgName` in the configured store and print it (last stdout line). */
export async function keyCreate(orgName: string, io: CliIO): Promise<CreatedKey> {
  const created = await withStore(io, (s) => s.createKey(orgName));
  io.stderr(`created API key ${created.keyId} for organization "${created.org.name}" (${created.org.id}); it is shown once:\n`);
  io.stdout(`${created.key}\n`);
  return created;
}

export function registerKeyCommands(program: Command, io: CliIO): void {
  const key = program.command("key").description("manage API keys");

  key
    .command("create")
    .description("create an API key for an organization (created if needed); prints the key on the last line")
    .requiredOption("--org <name>", "organization name")
    .action(async (opts: { org: string }) => {
      await keyCreate(opts.org, io);
    });

  key
    .command("list")
    .description("list an organization's keys (ids and prefixes, never the keys)")
    .requiredOption("--org <name>", "organization name")
    .action(async (opts: { org: string }) => {
      const keys = await withStore(io, (s) => s.listKeys(opts.org));
      if (keys.length === 0) io.stderr(`no keys for organization "${opts.org}"\n`);
      for (const k of keys) {
        io.stdout(`${k.id}\t${k.prefix}…\tcreated ${k.createdAt}\t${k.revokedAt ? `revoked ${k.revokedAt}` : "active"}\n`);
      }
    });

  key
    .command("revoke")
    .description("revoke a key by id (see `key list`)")
    .argument("<key-id>", "key id, e.g. key_…")
    .action(async (keyId: string) => {
      const done = await withStore(io, (s) => s.revokeKey(keyId));
      if (!done) throw new Error(`no active key with id ${keyId}`);
      io.stderr(`revoked ${keyId}\n`);
    });
}
