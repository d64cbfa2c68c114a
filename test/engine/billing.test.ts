/**
 * Billing with the real engine (never a stub): one request through buildApp
 * with EnginePipeline, whose `admit` call places the hold after tokenizing.
 * The organization is charged exactly ceil(usage.input_tokens × price / 1e6)
 * µUSD, and the hold was the same amount. One forward pass.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import type { FastifyInstance } from "fastify";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { chargeFor } from "../../src/accounts/money.js";
import { loadPrices } from "../../src/accounts/prices.js";
import { SqliteAccountsStore } from "../../src/accounts/sqlite.js";
import { buildApp } from "../../src/app.js";
import { loadConfig } from "../../src/config/index.js";
import type { EnginePipeline } from "../../src/pipeline/index.js";
import { smallDeployment, startEngine } from "./engine.js";

let engine: EnginePipeline;
let app: FastifyInstance;
let accounts: SqliteAccountsStore;
let dir: string;

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-engine-billing-"));
  engine = await startEngine(smallDeployment());
  const config = loadConfig({ ...process.env, ASSAY_DATA_DIR: dir, LOG_LEVEL: "silent" });
  accounts = new SqliteAccountsStore(dir, { startingGrantMicro: config.startingGrantMicro });
  app = buildApp({ config, pipeline: engine, accounts });
  await app.ready();
});

afterAll(async () => {
  await app?.close();
  await engine?.close();
  accounts?.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

describe("billing on the real engine", () => {
  it("charges exactly usage.input_tokens × price for judge-latest", async () => {
    const { key, org } = accounts.createKey("acme");
    const res = await app.inject({
      method: "POST",
      url: "/v1/systemone",
      headers: { authorization: `Bearer ${key}` },
      payload: {
        model: "judge-latest",
        state: "The invoice was paid on March 3rd, two weeks after the due date.",
        questions: {
          late: { type: "noul", instructions: "The invoice was paid late." },
          topic: { type: "choice", criteria: { billing: null, shipping: null } },
        },
      },
    });
    expect(res.statusCode, res.body).toBe(200);
    const tokens: number = res.json().usage.input_tokens;
    expect(tokens).toBeGreaterThan(20);
    const price = loadPrices(loadConfig({}).pricesFile).priceFor("judge-latest", "general");
    expect(price).toBe(40_000);
    const charge = chargeFor(tokens, price);

    const entries = accounts.ledger(org.id);
    expect(entries.map((e) => e.kind)).toEqual(["grant", "hold", "settle"]);
    const [, hold, settle] = entries;
    // The hold was placed from the tokenized count, before inference: the same number.
    expect(hold).toMatchObject({ amountMicro: charge, inputTokens: tokens, priceMicroPerMTok: price });
    expect(settle).toMatchObject({ amountMicro: charge, inputTokens: tokens, priceMicroPerMTok: price });
    expect(accounts.balance(org.id, Date.now())).toMatchObject({ creditMicro: 1_000_000 - charge, heldMicro: 0 });
  });
});
