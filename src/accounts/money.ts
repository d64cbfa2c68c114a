/**
 * Money is integer micro-USD (1 USD = 1,000,000 µUSD) everywhere: in the
 * stores, the ledger, the config after parsing, and every computation.
 * Decimal text is converted with string arithmetic, never through a float.
 *
 * Rounding: a request's charge is `ceil(input_tokens × price / 1,000,000)`
 * µUSD, where `price` is µUSD per million input tokens. Each request is
 * rounded up on its own, to the next whole µUSD ($0.000001), so a 1-token
 * request at $0.04 per million costs 1 µUSD, and 25 tokens cost exactly 1.
 */

export const MICRO_PER_USD = 1_000_000;
const TOKENS_PER_PRICE_UNIT = 1_000_000n;
const USD_TEXT = /^(\d{1,9})(?:\.(\d{1,6}))?$/;

/** "12", "0.04", "3.500000" → µUSD. Refuses negatives, exponents, more than 6 decimals, more than $999,999,999. */
export function parseUsd(text: string | number): number {
  const s = String(text).trim().replace(/^\$/, "");
  const m = USD_TEXT.exec(s);
  if (!m) {
    throw new Error(`"${String(text)}" is not an amount in USD: use digits with at most 6 decimals, e.g. 25 or 0.04`);
  }
  const whole = Number(m[1]);
  const frac = Number((m[2] ?? "").padEnd(6, "0"));
  return whole * MICRO_PER_USD + frac;
}

/** µUSD → "$0.000040" (always 6 decimals, exact). */
export function formatUsd(micro: number): string {
  assertMicro(micro, "amount", true);
  const sign = micro < 0 ? "-" : "";
  const abs = Math.abs(micro);
  const whole = Math.floor(abs / MICRO_PER_USD);
  const frac = String(abs % MICRO_PER_USD).padStart(6, "0");
  return `${sign}$${whole.toLocaleString("en-US")}.${frac}`;
}

/** µUSD per million tokens → "$0.04/M" (trailing zeros dropped). */
export function formatPrice(microPerMillion: number): string {
  const usd = formatUsd(microPerMillion).replace(/0+$/, "").replace(/\.$/, ".00");
  return `${usd}/M`;
}

/** The charge for `inputTokens` at `microPerMillion`: ceil(tokens × price / 1e6), exact (BigInt). */
export function chargeFor(inputTokens: number, microPerMillion: number): number {
  if (!Number.isSafeInteger(inputTokens) || inputTokens < 0) {
    throw new Error(`input token count must be a non-negative integer, got ${inputTokens}`);
  }
  assertMicro(microPerMillion, "price");
  const product = BigInt(inputTokens) * BigInt(microPerMillion);
  const charge = (product + TOKENS_PER_PRICE_UNIT - 1n) / TOKENS_PER_PRICE_UNIT;
  const n = Number(charge);
  if (!Number.isSafeInteger(n)) throw new Error("charge out of range");
  return n;
}

export function assertMicro(v: number, what: string, allowNegative = false): void {
  if (!Number.isSafeInteger(v) || (!allowNegative && v < 0)) {
    throw new Error(`${what} must be a ${allowNegative ? "" : "non-negative "}whole number of micro-USD, got ${v}`);
  }
}

/** A BIGINT column from PostgreSQL (a string) or a SQLite integer → a safe JS integer. */
export function toSafeInt(v: unknown, what = "value"): number {
  const n = typeof v === "string" ? Number(v) : typeof v === "bigint" ? Number(v) : (v as number);
  if (!Number.isSafeInteger(n)) throw new Error(`${what} is not a safe integer: ${String(v)}`);
  return n;
}
