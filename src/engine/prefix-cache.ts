import { createHash } from "node:crypto";
import { LRUCache } from "lru-cache";
import type { PrefixKv } from "../inference/protocol.js";
import { metrics } from "../observability/metrics.js";

/**
 * Keys and values of recent prefixes (system text + state), so that a state
 * read before skips its prefill: across the passes of one large request and
 * across requests. One LRU per process under a byte budget; an entry is keyed
 * by the build, the partition and the exact prefix token ids (a hash to find
 * it, the ids themselves compared on a hit).
 *
 * Partitioned by organization unless configured as shared: a hit is several
 * times faster than a miss, so a shared cache would let one organization time
 * whether another sent a given document.
 */

interface Entry {
  tokens: Int32Array;
  kv: PrefixKv;
}

/** Prefixes shorter than this are recomputed: a prefill of a few dozen tokens costs less than the entry's churn. */
export const MIN_CACHED_TOKENS = 32;

export class PrefixCache {
  private readonly lru: LRUCache<string, Entry> | null;

  constructor(
    bytes: number,
    readonly scope: "organization" | "shared",
  ) {
    this.lru =
      bytes > 0
        ? new LRUCache<string, Entry>({
            maxSize: bytes,
            sizeCalculation: (e) => e.kv.data.byteLength + e.tokens.byteLength,
            dispose: (e, _key, reason) => {
              metrics.prefixCacheBytes.dec(e.kv.data.byteLength + e.tokens.byteLength);
              if (reason === "evict") metrics.prefixCacheEvictions.inc();
            },
          })
        : null;
  }

  get enabled(): boolean {
    return this.lru !== null;
  }

  /** The keys and values of `tokens` (the whole of them), if this partition holds them. */
  get(build: string, org: string | undefined, tokens: BigInt64Array): PrefixKv | undefined {
    if (!this.lru) return undefined;
    const e = this.lru.get(this.key(build, org, tokens));
    const hit = e !== undefined && e.tokens.length === tokens.length && e.tokens.every((t, i) => t === Number(tokens[i]));
    metrics.prefixCacheLookups.inc({ result: hit ? "hit" : "miss" });
    if (!hit) return undefined;
    metrics.prefixCacheTokensSaved.inc(tokens.length);
    return e.kv;
  }

  /** Whether this partition holds `tokens`, without counting a lookup or touching its recency (admission's estimate). */
  has(build: string, org: string | undefined, tokens: BigInt64Array): boolean {
    const e = this.lru?.peek(this.key(build, org, tokens));
    return e !== undefined && e.tokens.length === tokens.length && e.tokens.every((t, i) => t === Number(tokens[i]));
  }

  set(build: string, org: string | undefined, tokens: BigInt64Array, kv: PrefixKv): void {
    if (!this.lru || kv.tokens !== tokens.length) return;
    const entry = { tokens: Int32Array.from(tokens, Number), kv };
    const size = kv.data.byteLength + entry.tokens.byteLength;
    // lru-cache refuses (and does not store) an entry larger than the whole budget.
    if (size > this.lru.maxSize) return;
    const key = this.key(build, org, tokens);
    if (this.lru.has(key)) return;
    this.lru.set(key, entry);
    metrics.prefixCacheBytes.inc(size);
  }

  /** Bytes held (the LRU's own count). */
  get bytes(): number {
    return this.lru?.calculatedSize ?? 0;
  }

  private key(build: string, org: string | undefined, tokens: BigInt64Array): string {
    const h = createHash("sha256").update(new Uint8Array(tokens.buffer, tokens.byteOffset, tokens.byteLength)).digest("base64url");
    return `${build}\u0000${this.scope === "shared" ? "" : (org ?? "")}\u0000${h}`;
  }
}
