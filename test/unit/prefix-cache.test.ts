/**
 * The prefix cache's bookkeeping (src/engine/prefix-cache.ts), without a
 * model: what is found, by whom, and what is dropped under the budget. That
 * a hit reads the same log-probabilities as a miss is tested on the real
 * model in test/engine/prefix-cache.test.ts.
 */
import { describe, expect, it } from "vitest";
import { PrefixCache } from "../../src/engine/prefix-cache.js";
import { continuePacked, pack } from "../../src/inference/pack.js";
import { metrics } from "../../src/observability/metrics.js";
import { Timings } from "../../src/pipeline/timings.js";

const ids = (...t: number[]) => BigInt64Array.from(t, BigInt);
/** K/V of `tokens` tokens in a made-up layout of 1,000 floats per token (4 KB). */
const kv = (tokens: number, fill = 1) => ({ data: new Float32Array(new SharedArrayBuffer(tokens * 4000)).fill(fill), tokens });
const counter = async (name: string, labels: Record<string, string> = {}) =>
  ((await metrics.registry.getSingleMetric(name)!.get()).values.find((v) => Object.entries(labels).every(([k, x]) => v.labels[k] === x))?.value ?? 0);

describe("PrefixCache", () => {
  it("finds an entry by build, organization and the exact token ids", () => {
    const c = new PrefixCache(1 << 20, "organization");
    const e = kv(3);
    c.set("b1", "org-a", ids(1, 2, 3), e);
    expect(c.get("b1", "org-a", ids(1, 2, 3))).toBe(e);
    expect(c.get("b1", "org-b", ids(1, 2, 3))).toBeUndefined();
    expect(c.get("b2", "org-a", ids(1, 2, 3))).toBeUndefined();
    expect(c.get("b1", "org-a", ids(1, 2, 4))).toBeUndefined();
    expect(c.get("b1", "org-a", ids(1, 2))).toBeUndefined();
  });

  it("shared scope: any organization hits", () => {
    const c = new PrefixCache(1 << 20, "shared");
    c.set("b1", "org-a", ids(1, 2, 3), kv(3));
    expect(c.get("b1", "org-b", ids(1, 2, 3))).toBeDefined();
  });

  it("keeps within its byte budget, dropping the least recently used, and counts it", async () => {
    const c = new PrefixCache(3 * 4000 * 3 + 100, "organization"); // three 3-token entries and their ids
    const evictions = await counter("assay_prefix_cache_evictions_total");
    for (let i = 0; i < 3; i++) c.set("b", "o", ids(i, 0, 0), kv(3));
    expect(c.get("b", "o", ids(0, 0, 0))).toBeDefined(); // 0 is now the most recent
    c.set("b", "o", ids(9, 0, 0), kv(3));
    expect(c.get("b", "o", ids(1, 0, 0))).toBeUndefined();
    expect(c.get("b", "o", ids(0, 0, 0))).toBeDefined();
    expect(c.bytes).toBeLessThanOrEqual(3 * 4000 * 3 + 100);
    expect((await counter("assay_prefix_cache_evictions_total")) - evictions).toBe(1);
  });

  it("refuses an entry larger than the whole budget, and a budget of 0 turns it off", () => {
    const small = new PrefixCache(1000, "organization");
    small.set("b", "o", ids(1, 2, 3), kv(3));
    expect(small.get("b", "o", ids(1, 2, 3))).toBeUndefined();
    const off = new PrefixCache(0, "organization");
    expect(off.enabled).toBe(false);
    off.set("b", "o", ids(1), kv(1));
    expect(off.get("b", "o", ids(1))).toBeUndefined();
  });

  it("an entry must hold as many tokens as its key", () => {
    const c = new PrefixCache(1 << 20, "organization");
    c.set("b", "o", ids(1, 2, 3), kv(2));
    expect(c.get("b", "o", ids(1, 2, 3))).toBeUndefined();
  });

  it("counts hits, misses and tokens saved", async () => {
    const c = new PrefixCache(1 << 20, "organization");
    const [hits, misses, saved] = await Promise.all([
      counter("assay_prefix_cache_lookups_total", { result: "hit" }),
      counter("assay_prefix_cache_lookups_total", { result: "miss" }),
      counter("assay_prefix_cache_tokens_saved_total"),
    ]);
    c.get("b", "o", ids(5, 6));
    c.set("b", "o", ids(5, 6), kv(2));
    c.get("b", "o", ids(5, 6));
    expect((await counter("assay_prefix_cache_lookups_total", { result: "hit" })) - hits).toBe(1);
    expect((await counter("assay_prefix_cache_lookups_total", { result: "miss" })) - misses).toBe(1);
    expect((await counter("assay_prefix_cache_tokens_saved_total")) - saved).toBe(2);
  });
});

describe("continuePacked", () => {
  it("drops the first n prefix tokens and moves sequence indices, keeping positions and the readout", () => {
    const full = pack([10, 11, 12, 13], [
      { suffix: [20, 21], labels: [[30], [31, 32]], terminator: 99 },
      { suffix: [22], labels: [[33]], terminator: 99 },
    ]);
    const c = continuePacked(full, 3);
    expect(Array.from(c.inputIds)).toEqual(Array.from(full.inputIds.subarray(3)));
    expect(Array.from(c.positionIds)).toEqual(Array.from(full.positionIds.subarray(3)));
    expect(Array.from(c.subtreeEnd)).toEqual(Array.from(full.subtreeEnd.subarray(3), (x) => x - 3n));
    expect(Array.from(c.gatherIdx)).toEqual(Array.from(full.gatherIdx, (x) => x - 3n));
    expect(Array.from(c.branchSlots)).toEqual(Array.from(full.branchSlots, (x) => x - 3n));
    expect(c.slotOf).toEqual(full.slotOf);
    expect(c.readout).toEqual(full.readout);
    expect(c.prefixLength).toBe(1);
    expect(c.promptTokens).toBe(full.promptTokens);
    expect(() => continuePacked(full, 4)).toThrow();
  });
});

describe("x-prefix-cache-tokens", () => {
  it("is sent on every response, the sum over the request's passes", () => {
    const t = new Timings();
    expect(t.headers()["x-prefix-cache-tokens"]).toBe("0");
    t.cached(100);
    t.cached(20);
    expect(t.headers()["x-prefix-cache-tokens"]).toBe("120");
  });
});
