/**
 * Admission and billing for one request, kept out of the HTTP layer:
 *
 *   begin(org)          take a concurrency slot                → 429 (or 503 when the limiter is down)
 *   hold(model, …, n)   from the pipeline's `admit`, after tokenizing and
 *                       before model work: hold the maximum cost → 402 (or 503)
 *   settle(model, n)    on success: charge usage.input_tokens × price, return the rest
 *   end(reason)         always, in `finally`: an unsettled hold is released
 *                       (no charge for any error) and the slot given back
 *
 * A hold carries an expiry that is renewed while the request runs; if the
 * process dies between hold and settle, the hold releases itself at the
 * organization's next admission or read, or at the periodic sweep.
 */
import { AssayError, invalid } from "../errors/catalogue.js";
import type { ConcurrencyLimiter, Slot } from "./limiter.js";
import { chargeFor, formatPrice, formatUsd } from "./money.js";
import { holdAmount, type ModelFamily, type PriceTable } from "./prices.js";
import type { CreditStore, Org } from "./types.js";

export interface AdmissionSettings {
  /** In-flight requests allowed before the organization's first purchase. */
  concurrencyBeforePurchase: number;
  /** In-flight requests allowed once it has purchased credit. */
  concurrencyAfterPurchase: number;
  /** How long a hold lives without renewal (renewed every third of it while the request runs). */
  holdTtlMs: number;
  /** `Retry-After` for 429, seconds. */
  retryAfterSeconds: number;
  /** Period of the sweep that releases expired holds of every organization; 0 = no sweep. */
  sweepIntervalMs: number;
}

export const DEFAULT_ADMISSION_SETTINGS: AdmissionSettings = {
  concurrencyBeforePurchase: 4,
  concurrencyAfterPurchase: 100,
  holdTtlMs: 120_000,
  retryAfterSeconds: 1,
  sweepIntervalMs: 30_000,
};

export interface AdmissionLog {
  warn(obj: object, msg: string): void;
  error(obj: object, msg: string): void;
}

const silent: AdmissionLog = { warn() {}, error() {} };

export interface AdmissionDeps {
  store: CreditStore;
  limiter: ConcurrencyLimiter;
  prices: PriceTable;
  /** The family of a public model name (undefined when unknown); prices and holds depend on it. */
  modelFamily: (model: string) => ModelFamily | undefined;
  settings?: Partial<AdmissionSettings>;
  /** ms since the epoch; injectable for tests. */
  clock?: () => number;
  log?: AdmissionLog;
}

/** What a failed request's hold release records as its reason. */
export function releaseReason(err: unknown): string {
  if (err instanceof AssayError) return `error ${err.status} ${err.code}`;
  return "error 500 INTERNAL";
}

export class Admission {
  readonly settings: AdmissionSettings;
  readonly store: CreditStore;
  readonly limiter: ConcurrencyLimiter;
  readonly prices: PriceTable;
  readonly clock: () => number;
  private readonly modelFamily: (model: string) => ModelFamily | undefined;
  private readonly log: AdmissionLog;
  private sweeper: NodeJS.Timeout | null = null;

  constructor(deps: AdmissionDeps) {
    this.settings = { ...DEFAULT_ADMISSION_SETTINGS, ...deps.settings };
    const s = this.settings;
    for (const [k, v] of Object.entries(s)) {
      if (!Number.isFinite(v) || v < 0) throw new Error(`admission setting ${k} must be a non-negative number, got ${v}`);
    }
    if (s.concurrencyBeforePurchase < 1 || s.concurrencyAfterPurchase < 1) throw new Error("concurrency limits must be at least 1");
    if (s.holdTtlMs < 1000) throw new Error("hold TTL must be at least 1 second");
    this.store = deps.store;
    this.limiter = deps.limiter;
    this.prices = deps.prices;
    this.modelFamily = deps.modelFamily;
    this.clock = deps.clock ?? Date.now;
    this.log = deps.log ?? silent;
  }

  /** The organization's concurrency limit: its own override, else 4 until the first purchase, then 100. */
  limitFor(org: Org): number {
    if (org.maxConcurrency !== null) return org.maxConcurrency;
    return org.hasPurchased ? this.settings.concurrencyAfterPurchase : this.settings.concurrencyBeforePurchase;
  }

  /** Take a concurrency slot for the organization, or throw 429 (503 when the limiter cannot be reached). */
  async begin(org: Org, requestId: string): Promise<AdmittedRequest> {
    const limit = this.limitFor(org);
    let slot: Slot | null;
    try {
      slot = await this.limiter.acquire(org.id, limit);
    } catch (err) {
      this.log.error({ err: String(err), orgId: org.id }, "concurrency limiter unreachable");
      throw new AssayError("UNAVAILABLE", "the service cannot check the concurrency limit right now; retry shortly", 1);
    }
    if (!slot) {
      const s = this.settings.retryAfterSeconds;
      const why =
        org.maxConcurrency !== null
          ? "the limit set for this organization"
          : org.hasPurchased
            ? `the limit after a credit purchase`
            : `the limit until the first credit purchase, which raises it to ${this.settings.concurrencyAfterPurchase}`;
      throw new AssayError(
        "TOO_MANY_REQUESTS",
        `too many concurrent requests: organization "${org.name}" already has ${limit} requests in flight, ` +
          `${why}; retry after ${s} second${s === 1 ? "" : "s"}`,
        s,
      );
    }
    return new AdmittedRequest(this, org, requestId, slot, this.log);
  }

  familyOf(model: string): ModelFamily {
    const family = this.modelFamily(model);
    if (family === undefined) throw invalid(`unknown model "${model}"`, ["model"]);
    return family;
  }

  /** Release every expired hold now; returns how many. */
  async sweep(): Promise<number> {
    return this.store.releaseExpiredHolds(this.clock());
  }

  /** Start the periodic sweep (idempotent). */
  start(): void {
    if (this.sweeper || this.settings.sweepIntervalMs === 0) return;
    this.sweeper = setInterval(() => {
      this.sweep().then(
        (n) => {
          if (n > 0) this.log.warn({ released: n }, "released expired credit holds");
        },
        (err: unknown) => this.log.error({ err: String(err) }, "could not sweep expired credit holds"),
      );
    }, this.settings.sweepIntervalMs);
    this.sweeper.unref();
  }

  stop(): void {
    if (this.sweeper) clearInterval(this.sweeper);
    this.sweeper = null;
  }
}

interface OpenHoldState {
  id: string;
  model: string;
  price: number;
  amount: number;
  renew: NodeJS.Timeout;
}

/** One admitted request: its slot and, once the pipeline has tokenized, its hold. */
export class AdmittedRequest {
  private holdState: OpenHoldState | null = null;
  private settled = false;
  private ended = false;
  /** µUSD charged, once settled. */
  chargedMicro: number | null = null;

  constructor(
    private readonly admission: Admission,
    readonly org: Org,
    readonly requestId: string,
    private readonly slot: Slot,
    private readonly log: AdmissionLog,
  ) {}

  /**
   * Hold the request's maximum cost: `inputTokens` × price for general and
   * fact check models, the code search allowance for code search. Throws 402
   * naming the shortfall when the available balance does not cover it.
   */
  async hold(model: string, questionCount: number, inputTokens: number): Promise<void> {
    if (this.ended || this.settled) throw new AssayError("INTERNAL", "credit hold requested after the request ended");
    if (this.holdState) throw new AssayError("INTERNAL", "credit hold requested twice for one request");
    const a = this.admission;
    const family = a.familyOf(model);
    const { tokens, price, amount } = holdAmount(a.prices, model, family, questionCount, inputTokens);
    const ttl = a.settings.holdTtlMs;
    let result;
    try {
      result = await a.store.placeHold({
        orgId: this.org.id,
        amountMicro: amount,
        now: a.clock(),
        ttlMs: ttl,
        requestId: this.requestId,
        model,
        inputTokens: tokens,
        priceMicroPerMTok: price,
      });
    } catch (err) {
      this.log.error({ err: String(err), orgId: this.org.id }, "credit ledger unreachable");
      throw new AssayError("UNAVAILABLE", "the service cannot check credit right now; retry shortly", 1);
    }
    if (!result.ok) {
      const b = result.balance;
      const short = amount - b.availableMicro;
      const heldNote = b.heldMicro > 0 ? ` (balance ${formatUsd(b.creditMicro)}, of which ${formatUsd(b.heldMicro)} is held by requests in flight)` : "";
      throw new AssayError(
        "INSUFFICIENT_CREDIT",
        `insufficient credit: this request needs ${formatUsd(amount)} ` +
          `(${tokens.toLocaleString("en-US")} input tokens × ${formatPrice(price)} for ${model}), ` +
          `organization "${this.org.name}" has ${formatUsd(b.availableMicro)} available${heldNote}; ` +
          `short by ${formatUsd(short)}. Add credit to continue.`,
      );
    }
    const holdId = result.holdId;
    const renew = setInterval(() => {
      Promise.resolve(a.store.renewHold(holdId, a.clock() + ttl)).catch((err: unknown) =>
        this.log.warn({ err: String(err), holdId }, "could not renew a credit hold"),
      );
    }, Math.max(1000, Math.floor(ttl / 3)));
    renew.unref();
    this.holdState = { id: holdId, model, price, amount, renew };
  }

  /**
   * The request succeeded: charge `usage.input_tokens` × price and return
   * the rest of the hold. Returns the charge in µUSD.
   */
  async settle(model: string, usageInputTokens: number): Promise<number> {
    if (this.settled) throw new AssayError("INTERNAL", "request settled twice");
    if (!this.holdState) {
      // The pipeline answered without calling `admit` (it must not): bill
      // the actual usage anyway, through a hold of exactly that amount.
      if (usageInputTokens > 0) {
        this.log.error({ model, requestId: this.requestId }, "pipeline answered without a credit hold; holding the actual cost now");
        await this.hold(model, 0, usageInputTokens);
      } else {
        this.settled = true;
        this.chargedMicro = 0;
        return 0;
      }
    }
    const h = this.holdState!;
    clearInterval(h.renew);
    const charge = chargeFor(usageInputTokens, h.price);
    if (charge > h.amount) {
      this.log.warn({ holdId: h.id, charge, held: h.amount }, "charge exceeds the hold: the pipeline reported more input tokens than it held for");
    }
    const a = this.admission;
    let ok: boolean;
    try {
      ok = await a.store.settleHold({
        holdId: h.id,
        chargeMicro: charge,
        inputTokens: usageInputTokens,
        priceMicroPerMTok: h.price,
        now: a.clock(),
      });
    } catch (err) {
      this.log.error({ err: String(err), holdId: h.id }, "could not settle a credit hold");
      throw new AssayError("UNAVAILABLE", "the service could not record the charge; the request was not charged, retry shortly", 1);
    }
    this.settled = true;
    if (!ok) {
      // Released already (it expired without renewal, e.g. a long stall): not charged, never twice.
      this.log.error({ holdId: h.id, charge }, "credit hold was already closed at settle; the request is not charged");
      this.chargedMicro = 0;
      return 0;
    }
    this.chargedMicro = charge;
    return charge;
  }

  /** Always call in `finally`: releases an unsettled hold (no charge) and gives the slot back. Never throws. */
  async end(reason = "error"): Promise<void> {
    if (this.ended) return;
    this.ended = true;
    const h = this.holdState;
    if (h) clearInterval(h.renew);
    if (h && !this.settled) {
      try {
        await this.admission.store.releaseHold(h.id, reason, this.admission.clock());
      } catch (err) {
        this.log.error({ err: String(err), holdId: h.id }, "could not release a credit hold; it will expire");
      }
    }
    await this.slot.release();
  }
}
