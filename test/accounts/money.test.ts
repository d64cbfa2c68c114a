import path from "node:path";
import { describe, expect, it } from "vitest";
import { chargeFor, formatPrice, formatUsd, parseUsd } from "../../src/accounts/money.js";
import { holdAmount, holdTokens, loadPrices, parsePrices } from "../../src/accounts/prices.js";
import { ROOT, loadConfig } from "../../src/config/index.js";

describe("money in integer micro-USD", () => {
  it("parses USD text without floats", () => {
    expect(parseUsd("1")).toBe(1_000_000);
    expect(parseUsd("0.04")).toBe(40_000);
    expect(parseUsd("0.000001")).toBe(1);
    expect(parseUsd("12.345678")).toBe(12_345_678);
    expect(parseUsd("$25")).toBe(25_000_000);
    expect(parseUsd(0.1)).toBe(100_000);
    // 0.1 + 0.2 style float noise never enters
    expect(parseUsd("0.3")).toBe(parseUsd("0.1") + parseUsd("0.2"));
    for (const bad of ["-1", "1e3", "0.0000001", "", "abc", "1.", ".5", "1,000"]) {
      expect(() => parseUsd(bad), bad).toThrow(/not an amount in USD/);
    }
  });

  it("formats exactly, six decimals", () => {
    expect(formatUsd(0)).toBe("$0.000000");
    expect(formatUsd(40)).toBe("$0.000040");
    expect(formatUsd(1_000_000)).toBe("$1.000000");
    expect(formatUsd(1_234_567_890_123)).toBe("$1,234,567.890123");
    expect(formatUsd(-1)).toBe("-$0.000001");
    expect(formatPrice(40_000)).toBe("$0.04/M");
    expect(formatPrice(120_000)).toBe("$0.12/M");
    expect(formatPrice(1_000_000)).toBe("$1.00/M");
  });

  it("a charge is ceil(tokens × price / 1e6) µUSD, per request", () => {
    expect(chargeFor(0, 40_000)).toBe(0);
    expect(chargeFor(1, 40_000)).toBe(1); // 0.04 µUSD rounds up to 1
    expect(chargeFor(25, 40_000)).toBe(1); // exactly 1
    expect(chargeFor(26, 40_000)).toBe(2);
    expect(chargeFor(1000, 40_000)).toBe(40);
    expect(chargeFor(1_000_000, 40_000)).toBe(40_000); // a million tokens at $0.04/M = $0.04
    expect(chargeFor(187, 20_000)).toBe(4); // 3.74 → 4
    expect(chargeFor(187, 120_000)).toBe(23); // 22.44 → 23
    // No float error even where tokens × price is past 2^53.
    expect(chargeFor(9_000_000_000_000, 1_000_000)).toBe(9_000_000_000_000);
    expect(() => chargeFor(-1, 40_000)).toThrow();
    expect(() => chargeFor(1.5, 40_000)).toThrow();
  });
});

describe("prices (models/prices.json)", () => {
  const prices = loadPrices(path.join(ROOT, "models", "prices.json"));

  it("is the file the config points at by default", () => {
    expect(loadConfig({}).pricesFile).toBe(path.join(ROOT, "models", "prices.json"));
  });

  it("defaults: general 0.04; code search and fact check 0.04, -lite 0.02, -max 0.12 (USD per million input tokens)", () => {
    for (const m of ["judge-latest", "judge-v4-max", "judge-v4", "judge-v3", "vendor/judge-9B-v3", "vendor/judge-9B"]) {
      expect(prices.priceFor(m, "general"), m).toBe(40_000);
    }
    expect(prices.priceFor("judge-codegrep-lite", "codesearch")).toBe(20_000);
    expect(prices.priceFor("judge-codegrep", "codesearch")).toBe(40_000);
    expect(prices.priceFor("judge-codegrep-max", "codesearch")).toBe(120_000);
    expect(prices.priceFor("judge-factcheck", "factcheck")).toBe(40_000);
    expect(prices.priceFor("judge-factcheck-lite", "factcheck")).toBe(20_000);
    expect(prices.priceFor("judge-factcheck-max", "factcheck")).toBe(120_000);
  });

  it("an explicit model price wins; bad files are refused with the field named", () => {
    const p = parsePrices({
      currency: "USD",
      per_input_tokens: 1_000_000,
      families: { general: { base: "0.05" }, factcheck: { base: "0.04" }, codesearch: { base: "0.04", suffixes: { "-max": "0.2" } } },
      models: { "judge-v3": "0.01" },
    });
    expect(p.priceFor("judge-v3", "general")).toBe(10_000);
    expect(p.priceFor("judge-latest", "general")).toBe(50_000);
    expect(p.priceFor("judge-codegrep-max", "codesearch")).toBe(200_000);
    expect(() =>
      parsePrices({ currency: "USD", per_input_tokens: 1_000_000, families: { general: { base: 0.0000001 }, factcheck: { base: "1" }, codesearch: { base: "1" } } }),
    ).toThrow(/families\.general\.base/);
    expect(() => parsePrices({ currency: "EUR" })).toThrow(/invalid prices/);
  });

  it("holds: general = the tokenized input; code search = 8,192 per question, doubled for judge-codegrep", () => {
    expect(holdTokens("judge-latest", "general", 64, 187)).toBe(187);
    expect(holdTokens("judge-codegrep-lite", "codesearch", 3, 100)).toBe(3 * 8192);
    expect(holdTokens("judge-codegrep", "codesearch", 3, 100)).toBe(3 * 8192 * 2);
    expect(holdTokens("judge-codegrep-max", "codesearch", 3, 100)).toBe(3 * 8192);
    expect(holdAmount(prices, "judge-codegrep-max", "codesearch", 2, 0)).toEqual({
      tokens: 16_384,
      price: 120_000,
      amount: chargeFor(16_384, 120_000),
    });
  });
});
