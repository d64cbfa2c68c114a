import { describe, expect, it } from "vitest";
import { DEFAULT_BAND, escalate, fitBand, unsureIndices } from "../../src/families/escalation.js";
import { chunkRanges } from "../../src/families/factcheck.js";
import { crossValidateRecall, factCheckReadByLarge, foldsByGroup, type ScoredItem } from "../../src/eval/family-fit.js";
import { MIN_SPLIT_PAIRS, planPasses, SPLIT_WIDTH } from "../../src/engine/index.js";
import { ModelLifecycle, type ModelLoader } from "../../src/models/lifecycle.js";
import { inSchedule, parseSchedule } from "../../src/models/schedule.js";
import { AssayError } from "../../src/errors/catalogue.js";
import { adjustForRecall } from "../../src/probability/recall.js";
import { fitRecallThreshold, recallAt } from "../../src/eval/fitting.js";

describe("schedule", () => {
  const s = parseSchedule("mon-fri 07:30-19:00 America/Los_Angeles");
  it("is on during Pacific weekday hours and off outside them", () => {
    // 2026-11-23 is a Monday; PST is UTC-8.
    expect(inSchedule(s, new Date("2026-11-23T15:30:00Z"))).toBe(true); // 07:30 PST
    expect(inSchedule(s, new Date("2026-11-23T15:29:00Z"))).toBe(false); // 07:29
    expect(inSchedule(s, new Date("2026-11-24T02:59:00Z"))).toBe(true); // Mon 18:59
    expect(inSchedule(s, new Date("2026-11-24T03:00:00Z"))).toBe(false); // Mon 19:00
    expect(inSchedule(s, new Date("2026-11-22T18:00:00Z"))).toBe(false); // Sunday 10:00
    // Daylight saving: 2026-07-06 is a Monday, PDT is UTC-7.
    expect(inSchedule(s, new Date("2026-07-06T14:30:00Z"))).toBe(true);
    expect(inSchedule(s, new Date("2026-07-06T14:29:00Z"))).toBe(false);
  });
  it("handles windows past midnight, always and never", () => {
    const night = parseSchedule("fri 22:00-02:00 UTC");
    expect(inSchedule(night, new Date("2026-11-27T23:00:00Z"))).toBe(true); // Fri 23:00
    expect(inSchedule(night, new Date("2026-11-28T01:00:00Z"))).toBe(true); // Sat 01:00, Friday's window
    expect(inSchedule(night, new Date("2026-11-29T01:00:00Z"))).toBe(false); // Sun 01:00
    expect(inSchedule(parseSchedule("always"))).toBe(true);
    expect(inSchedule(parseSchedule("never"))).toBe(false);
  });
  it("rejects malformed schedules with a reason", () => {
    expect(() => parseSchedule("weekdays 7-19")).toThrow(/expected/);
    expect(() => parseSchedule("mon-fri 07:30-19:00 Mars/Olympus")).toThrow(/time zone/);
    expect(() => parseSchedule("mon-fry 07:30-19:00 UTC")).toThrow(/unknown day/);
  });
});

/**
 * A loader that records calls and resolves when told: the lifecycle's
 * state machine is tested without onnxruntime (the real load path is
 * exercised by test/engine/codesearch.test.ts).
 */
class ManualLoaderForLifecycleTests implements ModelLoader {
  calls: [string, boolean][] = [];
  pending: (() => void)[] = [];
  setLoaded(p: string, loaded: boolean): Promise<{ loadMs: number }[]> {
    this.calls.push([p, loaded]);
    if (!loaded) return Promise.resolve([{ loadMs: 0 }]);
    return new Promise((resolve) => this.pending.push(() => resolve([{ loadMs: 4_000 }])));
  }
  estimateLoadMs(): number {
    return 2_000;
  }
}

describe("model lifecycle", () => {
  it("answers 503 with Retry-After while a scheduled build loads, then serves it; unloads when idle", async () => {
    let now = Date.parse("2026-11-22T12:00:00Z");
    const loader = new ManualLoaderForLifecycleTests();
    const lc = new ModelLifecycle(loader, { schedule: parseSchedule("never"), idleUnloadMs: 60_000, clock: () => now });
    lc.register("big", "/nonexistent/model.onnx", "scheduled");
    expect(lc.bootBuilds()).toEqual([]);
    let err: unknown;
    try {
      lc.acquire("big", "judge-codegrep-max");
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(AssayError);
    expect((err as AssayError).status).toBe(503);
    expect((err as AssayError).retryAfterSeconds).toBeGreaterThanOrEqual(1);
    expect(lc.state("big")).toBe("loading");
    expect(() => lc.acquire("big", "x")).toThrow(/starting/);
    expect(loader.calls).toEqual([["/nonexistent/model.onnx", true]]); // one load, joined
    loader.pending.shift()!();
    await lc.load("big");
    expect(lc.state("big")).toBe("loaded");
    const release = lc.acquire("big", "x");
    now += 120_000;
    await lc.tick();
    expect(lc.state("big")).toBe("loaded"); // in use
    release();
    await lc.tick();
    expect(lc.state("big")).toBe("loaded"); // just released: idle time starts now
    now += 61_000;
    await lc.tick();
    expect(lc.state("big")).toBe("unloaded");
    expect(loader.calls.at(-1)).toEqual(["/nonexistent/model.onnx", false]);
  });
  it("loads scheduled builds inside the schedule", async () => {
    const loader = new ManualLoaderForLifecycleTests();
    const lc = new ModelLifecycle(loader, { schedule: parseSchedule("always"), idleUnloadMs: 0 });
    lc.register("small", "/a.onnx", "always");
    lc.register("big", "/b.onnx", "scheduled");
    expect(lc.bootBuilds().sort()).toEqual(["big", "small"]);
    const t = lc.tick();
    loader.pending.forEach((f) => f());
    await t;
    expect(lc.state("big")).toBe("loaded");
  });
});

describe("escalation", () => {
  it("rescoring only the unsure items, keeping the rest", async () => {
    const small = [0.05, 0.5, 0.95, 0.3];
    let asked: number[] = [];
    const out = await escalate(small, DEFAULT_BAND, () => () => {}, async (idx) => {
      asked = idx;
      return idx.map(() => 0.9);
    });
    expect(asked).toEqual([1, 3]);
    expect(out.final).toEqual([0.05, 0.9, 0.95, 0.9]);
    expect(out.escalated).toEqual([false, true, false, true]);
  });
  it("never touches the large model when nothing is unsure", async () => {
    let acquired = false;
    await escalate([0.01, 0.99], DEFAULT_BAND, () => {
      acquired = true;
      return () => {};
    }, async () => []);
    expect(acquired).toBe(false);
  });
  it("simulates judge-factcheck as served: a document of several windows always reads with the large build", () => {
    const band = { lo: 0.4, hi: 0.6 };
    const claim = (windows?: number): ScoredItem => ({ group: "d", id: "wice-1", raw: 0.9, label: true, ...(windows ? { windows } : {}) });
    expect(factCheckReadByLarge(claim(), 0.5, band)).toBe(true);
    expect(factCheckReadByLarge(claim(), 0.9, band)).toBe(false);
    expect(factCheckReadByLarge(claim(1), 0.1, band)).toBe(false);
    expect(factCheckReadByLarge(claim(3), 0.9, band)).toBe(true);
    expect(factCheckReadByLarge(claim(2), 0.1, band)).toBe(true);
  });

  it("fits a band holding the given share of scores around the center", () => {
    const scores = Array.from({ length: 100 }, (_, i) => i / 100);
    const b = fitBand(scores, 0.3, 0.2);
    expect(unsureIndices(scores, b).length).toBeGreaterThanOrEqual(20);
    expect(unsureIndices(scores, b).length).toBeLessThanOrEqual(22);
    expect(b.lo).toBeLessThan(0.3);
    expect(b.hi).toBeGreaterThan(0.3);
  });
});

describe("recall adjustment", () => {
  it("keeps the target share of needed items at noul > 0.5, monotonically", () => {
    const needed = Array.from({ length: 40 }, (_, i) => 0.01 + i * 0.02);
    const t = fitRecallThreshold(needed, 0.95);
    const kept = needed.filter((r) => adjustForRecall(r, { target: 0.95, threshold: t }) > 0.5).length;
    expect(kept).toBe(38);
    const xs = [0.001, 0.01, 0.2, 0.5, 0.9, 0.999];
    const ys = xs.map((x) => adjustForRecall(x, { target: 0.95, threshold: t }));
    for (let i = 1; i < ys.length; i++) expect(ys[i]!).toBeGreaterThan(ys[i - 1]!);
    expect(adjustForRecall(t, { target: 0.95, threshold: t })).toBeCloseTo(0.5, 9);
  });
  it("counts overflowed items as kept", () => {
    const r = recallAt([{ raw: 0, needed: true, overflow: true }, { raw: 0.1, needed: false }], null);
    expect(r.recall).toBe(1);
    expect(r.keptFraction).toBe(0.5);
  });
  it("cross-validates by query: no fold shares a group with its training folds", () => {
    const items: ScoredItem[] = [];
    for (let g = 0; g < 10; g++) for (let i = 0; i < 10; i++) items.push({ group: `g${g}`, id: `q${i}`, raw: (i + 1) / 30, label: i >= 7 });
    const folds = foldsByGroup(items, 5);
    const groups = folds.map((f) => new Set(f.map((i) => i.group)));
    for (let a = 0; a < groups.length; a++)
      for (let b = a + 1; b < groups.length; b++) for (const g of groups[a]!) expect(groups[b]!.has(g)).toBe(false);
    const cv = crossValidateRecall(items, 0.95);
    expect(cv.adjusted.recall).toBeGreaterThanOrEqual(0.95);
    expect(cv.uncorrected.recall).toBeLessThan(cv.adjusted.recall);
  });
});

describe("packing and chunking", () => {
  it("splits branches into passes whose padded size stays under the token limit, longest first", () => {
    const costs = [50, 400, 30, 300, 200, 40];
    const passes = planPasses(100, costs, 600);
    // Padded: every branch of a pass counts as long as the pass's longest.
    for (const p of passes) expect(100 + p.length * Math.max(...p.map((i) => costs[i]!))).toBeLessThanOrEqual(600);
    expect(passes.flat().sort()).toEqual([0, 1, 2, 3, 4, 5]);
    expect(passes).toEqual([[1], [3], [4, 0], [5, 2]]);
  });
  it("with splitWidths, a narrower block starts a pass of its own where the padding it saves is worth a pass", () => {
    expect([SPLIT_WIDTH, MIN_SPLIT_PAIRS]).toEqual([0.9, 70_000]);
    // One wide block (a 4-option question's shared presentations), two mid-width ones and narrow statements.
    const costs = [30, 180, 35, 32, 95, 91];
    expect(planPasses(500, costs, 8192)).toEqual([[1, 4, 5, 2, 3, 0]]);
    // 95 after 180 saves 5 blocks × 85 slots × 680 keys; 30 after 35 only 1 × 5 × 535: not worth a pass.
    expect(planPasses(500, costs, 8192, true)).toEqual([[1], [4, 5], [2, 3, 0]]);
    // Blocks alike in width (within a tenth of the longest) stay in one pass either way.
    expect(planPasses(500, [60, 58, 61, 59, 56], 8192, true)).toEqual([[2, 0, 3, 1, 4]]);
    // Code search items: at SPLIT_WIDTH of the longest a wide item starts a new pass, a narrow one at the same share does not.
    expect(planPasses(800, [1000, 900], 8192, true)).toEqual([[0], [1]]);
    expect(planPasses(100, [40, 36], 8192, true)).toEqual([[0, 1]]);
  });
  it("with a pair bound, each pass's padded branch scores stay within it; a block wider than the bound goes alone", () => {
    const costs = [548, 546, 547, 540, 30];
    // 4,045 keys of state before every pass: two 548-wide blocks hold 2 × 548 × 4,593 = 5.03M pairs.
    const bound = 4_800_000;
    const passes = planPasses(2, costs, 8192, true, bound, 4045);
    for (const p of passes) {
      const w = Math.max(...p.map((i) => costs[i]!));
      if (p.length > 1) expect(p.length * w * (4045 + 2 + w)).toBeLessThanOrEqual(bound);
    }
    expect(passes).toEqual([[0], [2], [1], [3], [4]]);
    // Without it, the token limit alone: the four wide blocks in one pass (the narrow one apart: its padding is worth a pass).
    expect(planPasses(2, costs, 8192, true, Infinity, 4045)).toEqual([[0, 2, 1, 3], [4]]);
    // A block over the bound by itself still runs, in a pass of its own.
    expect(planPasses(100, [3000, 20, 20], 8192, false, 1_000_000)).toEqual([[0], [1, 2]]);
  });
  it("covers a long document with overlapping chunks and never cuts it", () => {
    expect(chunkRanges(100, 2048, 256)).toEqual([[0, 100]]);
    const r = chunkRanges(5000, 2048, 256);
    expect(r[0]).toEqual([0, 2048]);
    expect(r.at(-1)![1]).toBe(5000);
    for (let i = 1; i < r.length; i++) expect(r[i]![0]).toBe(r[i - 1]![1] - 256);
  });
});
