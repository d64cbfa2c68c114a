/**
 * Prices per model, from `models/prices.json` (ASSAY_PRICES): USD per
 * million input tokens, output free. Parsed once into integer µUSD per
 * million tokens; see money.ts for the rounding of a charge.
 */
import fs from "node:fs";
import { z } from "zod";
import { chargeFor, parseUsd } from "./money.js";

export type ModelFamily = "general" | "factcheck" | "codesearch";

/** Code search: tokens held per question before the items are tokenized (the per-item prompt limit). */
export const CODESEARCH_HOLD_TOKENS_PER_QUESTION = 8192;
/** Models that may score an item twice (small model, then the large one): their hold is doubled. */
const ESCALATING_MODELS: ReadonlySet<string> = new Set(["judge-codegrep"]);

const Usd = z.union([z.string(), z.number()]).transform((v, ctx) => {
  try {
    return parseUsd(v);
  } catch (e) {
    ctx.addIssue({ code: "custom", message: (e as Error).message });
    return z.NEVER;
  }
});

const FamilyPrices = z.strictObject({
  base: Usd,
  /** Name suffix → price; checked in file order, first match wins. */
  suffixes: z.record(z.string().min(1), Usd).optional(),
});

const PricesFile = z.object({
  currency: z.literal("USD"),
  per_input_tokens: z.literal(1_000_000),
  families: z.strictObject({ general: FamilyPrices, factcheck: FamilyPrices, codesearch: FamilyPrices }),
  models: z.record(z.string().min(1), Usd).default({}),
});

export interface PriceTable {
  /** µUSD per million input tokens for a public model name of the given family. */
  priceFor(model: string, family: ModelFamily): number;
}

export class ConfiguredPrices implements PriceTable {
  constructor(
    private readonly families: Record<ModelFamily, { base: number; suffixes: [string, number][] }>,
    private readonly models: ReadonlyMap<string, number>,
  ) {}

  priceFor(model: string, family: ModelFamily): number {
    const explicit = this.models.get(model);
    if (explicit !== undefined) return explicit;
    const f = this.families[family];
    for (const [suffix, price] of f.suffixes) if (model.endsWith(suffix)) return price;
    return f.base;
  }
}

export function parsePrices(json: unknown, source = "prices"): PriceTable {
  const parsed = PricesFile.safeParse(json);
  if (!parsed.success) {
    const msg = parsed.error.issues.map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`).join("; ");
    throw new Error(`invalid ${source}: ${msg}`);
  }
  const p = parsed.data;
  const fam = (f: z.infer<typeof FamilyPrices>) => ({ base: f.base, suffixes: Object.entries(f.suffixes ?? {}) });
  return new ConfiguredPrices(
    { general: fam(p.families.general), factcheck: fam(p.families.factcheck), codesearch: fam(p.families.codesearch) },
    new Map(Object.entries(p.models)),
  );
}

export function loadPrices(file: string): PriceTable {
  let text: string;
  try {
    text = fs.readFileSync(file, "utf8");
  } catch (e) {
    throw new Error(`cannot read the price list ${file}: ${(e as Error).message}`);
  }
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new Error(`price list ${file} is not valid JSON: ${(e as Error).message}`);
  }
  return parsePrices(json, `price list ${file}`);
}

/**
 * Tokens to hold before the work: the maximum the request can be charged for.
 * General and fact check models know their input tokens after tokenizing.
 * Code search holds 8,192 tokens per question (the per-item limit), doubled
 * for `judge-codegrep`, whose unsure items are scored again by the large model.
 */
export function holdTokens(model: string, family: ModelFamily, questionCount: number, inputTokens: number): number {
  if (family !== "codesearch") return inputTokens;
  const perQuestion = CODESEARCH_HOLD_TOKENS_PER_QUESTION * (ESCALATING_MODELS.has(model) ? 2 : 1);
  return Math.max(inputTokens, perQuestion * questionCount);
}

/** µUSD held for a request: its maximum cost. */
export function holdAmount(
  prices: PriceTable,
  model: string,
  family: ModelFamily,
  questionCount: number,
  inputTokens: number,
): { tokens: number; price: number; amount: number } {
  const price = prices.priceFor(model, family);
  const tokens = holdTokens(model, family, questionCount, inputTokens);
  return { tokens, price, amount: chargeFor(tokens, price) };
}
