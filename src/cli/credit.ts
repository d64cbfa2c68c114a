/**
 * Credit administration on the configured store (SQLite in the data dir, or
 * PostgreSQL when ASSAY_DATABASE_URL is set):
 *
 *   assay credit add --org NAME --usd AMOUNT [--note TEXT]   record a purchase (lifts the concurrency limit)
 *   assay usage --org NAME [--recent N] [--json]             balance, open holds, recent charges
 */
import type { Command } from "commander";
import { formatPrice, formatUsd, parseUsd } from "../accounts/money.js";
import type { Org, UsageReport } from "../accounts/types.js";
import { loadConfig, type Config } from "../config/index.js";
import { withStore, type CliIO } from "./keys.js";

function limitLine(org: Org, config: Config): string {
  if (org.maxConcurrency !== null) return `${org.maxConcurrency} requests in flight (set for this organization)`;
  if (org.hasPurchased) return `${config.concurrencyAfterPurchase} requests in flight`;
  return `${config.concurrencyBeforePurchase} requests in flight (until the first purchase, then ${config.concurrencyAfterPurchase})`;
}

export function formatUsage(r: UsageReport, config: Config, now = Date.now()): string {
  const b = r.balance;
  const lines = [
    `organization   ${r.org.name} (${r.org.id})`,
    `available      ${formatUsd(b.availableMicro)}   (balance ${formatUsd(b.creditMicro)}, held ${formatUsd(b.heldMicro)})`,
    `purchased      ${formatUsd(r.totals.purchasesMicro)}   granted ${formatUsd(r.totals.grantsMicro)}   ` +
      `charged ${formatUsd(r.totals.chargesMicro)} over ${r.totals.charges} request${r.totals.charges === 1 ? "" : "s"}`,
    `concurrency    ${limitLine(r.org, config)}`,
  ];
  if (r.openHolds.length === 0) lines.push("open holds     none");
  else {
    lines.push(`open holds     ${r.openHolds.length}`);
    for (const h of r.openHolds) {
      const secs = Math.max(0, Math.ceil((h.expiresAt - now) / 1000));
      lines.push(`  ${h.holdId}  ${formatUsd(h.amountMicro)}  ${h.model ?? "-"}  request ${h.requestId ?? "-"}  expires in ${secs} s`);
    }
  }
  if (r.recentCharges.length === 0) lines.push("recent charges none");
  else {
    lines.push(`recent charges (newest first)`);
    for (const c of r.recentCharges) {
      const tokens = (c.inputTokens ?? 0).toLocaleString("en-US");
      const price = c.priceMicroPerMTok === null ? "" : ` × ${formatPrice(c.priceMicroPerMTok)}`;
      lines.push(`  ${c.createdAt}  ${formatUsd(c.amountMicro)}  ${tokens} tokens${price}  ${c.model ?? "-"}  request ${c.requestId ?? "-"}`);
    }
  }
  return lines.join("\n") + "\n";
}

export function registerCreditCommands(program: Command, io: CliIO): void {
  const credit = program.command("credit").description("manage prepaid credit");

  credit
    .command("add")
    .description("record a credit purchase for an organization (lifts its concurrency limit)")
    .requiredOption("--org <name>", "organization name (must exist: `assay key create --org NAME`)")
    .requiredOption("--usd <amount>", "amount in USD, at most 6 decimals, e.g. 25 or 0.50")
    .option("--note <text>", "free text kept in the ledger (invoice number, …)")
    .action(async (opts: { org: string; usd: string; note?: string }) => {
      const micro = parseUsd(opts.usd);
      if (micro <= 0) throw new Error("--usd must be more than zero");
      const config = loadConfig(io.env);
      const { org, balance } = await withStore(io, (s) => s.addCredit(opts.org, "purchase", micro, opts.note ?? null, Date.now()));
      io.stdout(
        `recorded a purchase of ${formatUsd(micro)} for organization "${org.name}"; ` +
          `available ${formatUsd(balance.availableMicro)}; concurrency limit ${limitLine(org, config)}\n`,
      );
    });

  program
    .command("usage")
    .description("an organization's balance, open holds and recent charges")
    .requiredOption("--org <name>", "organization name")
    .option("--recent <n>", "how many recent charges to list", "10")
    .option("--json", "print the report as JSON (amounts in micro-USD)")
    .action(async (opts: { org: string; recent: string; json?: boolean }) => {
      const recent = Number(opts.recent);
      if (!Number.isInteger(recent) || recent < 0) throw new Error("--recent must be a non-negative integer");
      const config = loadConfig(io.env);
      const report = await withStore(io, (s) => s.usage(opts.org, Date.now(), recent));
      if (!report) throw new Error(`no organization named "${opts.org.trim()}"`);
      io.stdout(opts.json ? `${JSON.stringify(report, null, 2)}\n` : formatUsage(report, config));
    });
}
