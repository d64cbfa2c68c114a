import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { SqliteAccountsStore } from "../../src/accounts/sqlite.js";
import { runCli } from "../../src/cli/index.js";

let dir: string;
beforeEach(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-cli-credit-"));
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

function withStore<T>(fn: (s: SqliteAccountsStore) => T): T {
  const s = new SqliteAccountsStore(dir);
  try {
    return fn(s);
  } finally {
    s.close();
  }
}

describe("assay credit add", () => {
  it("records a purchase in the ledger and lifts the concurrency limit", async () => {
    expect((await cli("key", "create", "--org", "acme")).code).toBe(0);
    const r = await cli("credit", "add", "--org", "acme", "--usd", "25.50", "--note", "invoice 42");
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain('recorded a purchase of $25.500000 for organization "acme"');
    expect(r.stdout).toContain("available $26.500000"); // + the $1 starting grant
    expect(r.stdout).toContain("concurrency limit 100 requests in flight");
    withStore((s) => {
      const org = s.findOrg("acme")!;
      expect(org.hasPurchased).toBe(true);
      expect(s.ledger(org.id).map((e) => [e.kind, e.amountMicro, e.note])).toEqual([
        ["grant", 1_000_000, "starting grant"],
        ["purchase", 25_500_000, "invoice 42"],
      ]);
    });
  });

  it("refuses unknown organizations, bad amounts and a missing --usd", async () => {
    const unknown = await cli("credit", "add", "--org", "nobody", "--usd", "5");
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toMatch(/no organization named "nobody"/);
    await cli("key", "create", "--org", "acme");
    for (const bad of ["-5", "0", "1e3", "0.0000001", "ten"]) {
      const r = await cli("credit", "add", "--org", "acme", "--usd", bad);
      expect(r.code, bad).not.toBe(0);
    }
    expect((await cli("credit", "add", "--org", "acme")).stderr).toMatch(/--usd/);
    withStore((s) => expect(s.ledger(s.findOrg("acme")!.id).map((e) => e.kind)).toEqual(["grant"]));
  });
});

describe("assay usage", () => {
  it("prints balance, holds and recent charges; --json gives micro-USD", async () => {
    await cli("key", "create", "--org", "acme");
    withStore((s) => {
      const org = s.findOrg("acme")!;
      const now = Date.now();
      const h = s.placeHold({ orgId: org.id, amountMicro: 48, now, ttlMs: 60_000, requestId: "r1", model: "judge-latest", inputTokens: 1187, priceMicroPerMTok: 40_000 });
      if (!h.ok) throw new Error("refused");
      s.settleHold({ holdId: h.holdId, chargeMicro: 48, inputTokens: 1187, priceMicroPerMTok: 40_000, now });
      s.placeHold({ orgId: org.id, amountMicro: 7, now, ttlMs: 60_000, requestId: "r2", model: "judge-v3", inputTokens: 175, priceMicroPerMTok: 40_000 });
    });
    const r = await cli("usage", "--org", "acme");
    expect(r.code, r.stderr).toBe(0);
    expect(r.stdout).toContain("organization   acme (org_");
    expect(r.stdout).toContain("available      $0.999945   (balance $0.999952, held $0.000007)");
    expect(r.stdout).toContain("purchased      $0.000000   granted $1.000000   charged $0.000048 over 1 request");
    expect(r.stdout).toContain("concurrency    4 requests in flight (until the first purchase, then 100)");
    expect(r.stdout).toMatch(/open holds {5}1\n {2}hold_\S+ {2}\$0\.000007 {2}judge-v3 {2}request r2 {2}expires in \d+ s/);
    expect(r.stdout).toMatch(/recent charges \(newest first\)\n {2}\S+ {2}\$0\.000048 {2}1,187 tokens × \$0\.04\/M {2}judge-latest {2}request r1/);

    const j = await cli("usage", "--org", "acme", "--json");
    const report = JSON.parse(j.stdout);
    expect(report.balance).toMatchObject({ creditMicro: 999_952, heldMicro: 7, availableMicro: 999_945 });
    expect(report.recentCharges[0]).toMatchObject({ kind: "settle", amountMicro: 48, inputTokens: 1187 });
  });

  it("unknown organization is an error", async () => {
    const r = await cli("usage", "--org", "nobody");
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/no organization named "nobody"/);
  });
});
