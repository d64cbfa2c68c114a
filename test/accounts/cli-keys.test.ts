import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { SqliteAccountsStore } from "../../src/accounts/sqlite.js";
import { runCli } from "../../src/cli/index.js";

let dir: string;
beforeEach(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-cli-"));
});
afterEach(() => {
  fs.rmSync(dir, { recursive: true, force: true });
});

async function cli(...args: string[]) {
  let stdout = "";
  let stderr = "";
  const code = await runCli(["node", "assay", ...args], {
    stdout: (t) => (stdout += t),
    stderr: (t) => (stderr += t),
    env: { ASSAY_DATA_DIR: dir },
  });
  return { code, stdout, stderr };
}

const lastLine = (s: string) => s.trimEnd().split("\n").at(-1) ?? "";

describe("assay key create", () => {
  it("creates the org and prints the key alone on the last stdout line; the key verifies", async () => {
    const { code, stdout, stderr } = await cli("key", "create", "--org", "acme");
    expect(code).toBe(0);
    const key = lastLine(stdout);
    expect(key).toMatch(/^sk-assay-[A-Za-z0-9_-]{43}$/);
    expect(stderr).toContain('"acme"');

    const store = new SqliteAccountsStore(dir);
    try {
      expect(store.verifyKey(key)?.name).toBe("acme");
    } finally {
      store.close();
    }
  });

  it("a second key for the same org joins it", async () => {
    const a = lastLine((await cli("key", "create", "--org", "acme")).stdout);
    const b = lastLine((await cli("key", "create", "--org", "acme")).stdout);
    const store = new SqliteAccountsStore(dir);
    try {
      expect(a).not.toBe(b);
      expect(store.verifyKey(a)?.id).toBe(store.verifyKey(b)?.id);
    } finally {
      store.close();
    }
  });

  it("requires --org", async () => {
    const { code, stdout, stderr } = await cli("key", "create");
    expect(code).not.toBe(0);
    expect(stdout).toBe("");
    expect(stderr).toMatch(/--org/);
  });

  it("reports a bad org name without a stack", async () => {
    const { code, stderr } = await cli("key", "create", "--org", "  ");
    expect(code).toBe(1);
    expect(stderr).toMatch(/^assay: organization name must not be empty/);
  });

  it("list and revoke", async () => {
    const key = lastLine((await cli("key", "create", "--org", "acme")).stdout);
    const list = await cli("key", "list", "--org", "acme");
    expect(list.stdout).not.toContain(key);
    const keyId = list.stdout.split("\t")[0]!;
    expect(keyId).toMatch(/^key_/);
    expect(list.stdout).toContain("active");
    expect((await cli("key", "revoke", keyId)).code).toBe(0);
    expect((await cli("key", "list", "--org", "acme")).stdout).toContain("revoked");
    expect((await cli("key", "revoke", keyId)).code).toBe(1);
    const store = new SqliteAccountsStore(dir);
    try {
      expect(store.verifyKey(key)).toBeNull();
    } finally {
      store.close();
    }
  });
});
