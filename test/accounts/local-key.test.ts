import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ensureLocalKey, LOCAL_KEY_FILE } from "../../src/accounts/local-key.js";
import { SqliteAccountsStore } from "../../src/accounts/sqlite.js";

let dir: string;
let store: SqliteAccountsStore;
const log = { lines: [] as unknown[], info(obj: object, msg?: string) { this.lines.push({ obj, msg }); } };

beforeEach(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-localkey-"));
  store = new SqliteAccountsStore(dir);
  log.lines = [];
});
afterEach(() => {
  store.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

describe("ensureLocalKey", () => {
  it("on an empty store creates org local, prints the key once and saves it 0600", async () => {
    const printed: string[] = [];
    const made = await ensureLocalKey(store, dir, log, (l) => printed.push(l));
    expect(made).not.toBeNull();
    const file = path.join(dir, LOCAL_KEY_FILE);
    expect(made!.file).toBe(file);
    expect(fs.readFileSync(file, "utf8")).toBe(`${made!.key}\n`);
    expect(fs.statSync(file).mode & 0o777).toBe(0o600);
    expect(store.verifyKey(made!.key)?.name).toBe("local");

    expect(printed).toHaveLength(2);
    expect(printed.filter((l) => l.includes(made!.key))).toHaveLength(1);
    expect(printed[1]).toContain(file);
    // The structured log never carries the key.
    expect(JSON.stringify(log.lines)).not.toContain(made!.key);
    // Organization local starts with the free grant, like any new organization.
    const org = store.findOrg("local")!;
    expect(store.balance(org.id, Date.now())).toMatchObject({ creditMicro: 1_000_000, heldMicro: 0, hasPurchased: false });
    expect(store.ledger(org.id).map((e) => [e.kind, e.amountMicro])).toEqual([["grant", 1_000_000]]);
  });

  it("does nothing when the store already has keys, revoked ones included", async () => {
    const { keyId } = store.createKey("acme");
    store.revokeKey(keyId);
    const printed: string[] = [];
    expect(await ensureLocalKey(store, dir, log, (l) => printed.push(l))).toBeNull();
    expect(printed).toEqual([]);
    expect(fs.existsSync(path.join(dir, LOCAL_KEY_FILE))).toBe(false);
  });

  it("runs once: a second start prints nothing", async () => {
    const printed: string[] = [];
    await ensureLocalKey(store, dir, log, (l) => printed.push(l));
    await ensureLocalKey(store, dir, log, (l) => printed.push(l));
    expect(printed).toHaveLength(2);
    expect(store.listKeys("local")).toHaveLength(1);
  });

  it("replaces a stale key file left from an old database, still 0600", async () => {
    const file = path.join(dir, LOCAL_KEY_FILE);
    fs.writeFileSync(file, "old\n", { mode: 0o644 });
    const made = await ensureLocalKey(store, dir, log, () => {});
    expect(fs.readFileSync(file, "utf8")).toBe(`${made!.key}\n`);
    expect(fs.statSync(file).mode & 0o777).toBe(0o600);
  });
});
