/**
 * Prices for the batch summary, when this checkout has a price list: the
 * accounts layer's `loadPrices` (src/accounts/prices.ts) on
 * `ASSAY_PRICES` or models/prices.json, and its per-request rounding
 * (`chargeFor`, src/accounts/money.ts). Looked up at run time, so that the
 * batch works (tokens only) where no price list exists.
 */
import fs from "node:fs";
import path from "node:path";
import { ROOT } from "../config/index.js";

type Family = "general" | "factcheck" | "codesearch";

export interface Pricing {
  source: string;
  /** µUSD for one request of `tokens` input tokens on `model`, or null when the model's family is unknown. */
  charge(model: string, tokens: number): number | null;
  /** "$0.04/M" for a model, or null. */
  describe(model: string): string | null;
}

interface PricesModule {
  loadPrices(file: string): { priceFor(model: string, family: Family): number };
}
interface MoneyModule {
  chargeFor(tokens: number, microPerMillion: number): number;
  formatPrice?(microPerMillion: number): string;
}

async function importOptional<T>(rel: string): Promise<T | null> {
  try {
    return (await import(new URL(rel, import.meta.url).href)) as T;
  } catch {
    return null;
  }
}

/** µUSD → "$0.001234". */
export function usd(micro: number): string {
  return `$${(micro / 1_000_000).toFixed(6)}`;
}

export async function loadPricing(
  env: NodeJS.ProcessEnv,
  family: (model: string) => Family | null,
): Promise<Pricing | null> {
  const file = env.ASSAY_PRICES ?? path.join(ROOT, "models", "prices.json");
  if (!fs.existsSync(file)) return null;
  const prices = await importOptional<PricesModule>("../accounts/prices.js");
  const money = await importOptional<MoneyModule>("../accounts/money.js");
  if (typeof prices?.loadPrices !== "function" || typeof money?.chargeFor !== "function") return null;
  const table = prices.loadPrices(file);
  const price = (model: string): number | null => {
    const f = family(model);
    return f ? table.priceFor(model, f) : null;
  };
  return {
    source: file.startsWith(ROOT + path.sep) ? path.relative(ROOT, file) : file,
    charge: (model, tokens) => {
      const p = price(model);
      return p === null ? null : money.chargeFor(tokens, p);
    },
    describe: (model) => {
      const p = price(model);
      if (p === null) return null;
      return money.formatPrice ? money.formatPrice(p) : `${usd(p)}/M`;
    },
  };
}
