/**
 * Prices for the batch summary, when this checkout has a price list: the
 * accounts layer's `loadPrices` (src/accounts/prices.ts) on `ASSAY_PRICES`
 * or models/prices.json, and the server's per-request rounding (`chargeFor`,
 * src/accounts/money.ts). Without a price list the batch reports tokens only.
 */
import fs from "node:fs";
import path from "node:path";
import { chargeFor, formatPrice } from "../accounts/money.js";
import { loadPrices, type ModelFamily } from "../accounts/prices.js";
import { ROOT } from "../config/index.js";

export interface Pricing {
  source: string;
  /** µUSD for one request of `tokens` input tokens on `model`, or null when the model's family is unknown. */
  charge(model: string, tokens: number): number | null;
  /** "$0.04/M" for a model, or null. */
  describe(model: string): string | null;
}

export function loadPricing(env: NodeJS.ProcessEnv, family: (model: string) => ModelFamily | null): Pricing | null {
  const file = env.ASSAY_PRICES ?? path.join(ROOT, "models", "prices.json");
  if (!fs.existsSync(file)) return null;
  const table = loadPrices(file);
  const price = (model: string): number | null => {
    const f = family(model);
    return f ? table.priceFor(model, f) : null;
  };
  return {
    source: file.startsWith(ROOT + path.sep) ? path.relative(ROOT, file) : file,
    charge: (model, tokens) => {
      const p = price(model);
      return p === null ? null : chargeFor(tokens, p);
    },
    describe: (model) => {
      const p = price(model);
      return p === null ? null : formatPrice(p);
    },
  };
}
