/**
 * Admission by estimated work, without a model: the per-build cost model
 * (src/inference/cost.ts), the fair queue (fair-queue.ts) and the admission
 * policy (work.ts).
 */
import { describe, expect, it } from "vitest";
import { CostModel, GPU_SPEED_PRIOR_MS, attentionPairs, priorCoefficients, shapeOf, type PassShape } from "../../src/inference/cost.js";
import { FairQueue } from "../../src/inference/fair-queue.js";
import { pack } from "../../src/inference/pack.js";
import { DEADLINE_MARGIN, FINISH_GRACE, SAFETY, SAFETY_MAX, admissionSafety, fairFinishMs, judge, likelyEscalated, refusal } from "../../src/inference/work.js";

const shape = (prefix: number, branches: number, width: number): PassShape => ({ tokens: prefix + branches * width, prefix, branches, width });

describe("pass shapes", () => {
  it("a packed request's shape: packed length, prefix, blocks and the padded block width", () => {
    const p = pack([1, 2, 3, 4, 5], [
      { suffix: [10, 11], labels: [[20], [21]], terminator: 0 },
      { suffix: [12, 13, 14, 15], labels: [[20], [21]], terminator: 0 },
    ]);
    expect(shapeOf(p)).toEqual({ tokens: 11, prefix: 5, branches: 2, width: 4 });
    expect(shapeOf(p, 300)).toEqual({ tokens: 11, prefix: 5, branches: 2, width: 4, past: 300 });
  });

  it("attention pairs: the prefix causally, each block against the prefix and its own padded tokens", () => {
    expect(attentionPairs({ tokens: 4, prefix: 4, branches: 0, width: 0 })).toBe(10);
    expect(attentionPairs({ tokens: 7, prefix: 4, branches: 1, width: 3 })).toBe(10 + 3 * (4 + 2));
  });

  it("attention pairs of a pass that continues keys and values: every row also attends to them", () => {
    // A cache hit: 2 prefix tokens and one 3-wide block after 2,000 held keys.
    expect(attentionPairs({ tokens: 5, prefix: 2, branches: 1, width: 3, past: 2000 })).toBe(2000 * (2 + 3) + 3 + 3 * (2 + 2));
    expect(attentionPairs({ tokens: 5, prefix: 2, branches: 1, width: 3, past: 0 })).toBe(attentionPairs({ tokens: 5, prefix: 2, branches: 1, width: 3 }));
  });
});

describe("the cost model", () => {
  const prior = priorCoefficients({ parameters: 630_167_424, hiddenSize: 896, layers: 24 }, "cpu", 2);

  it("the prior for the reference build on 2 threads reproduces the recorded passes within 15%", () => {
    const m = new CostModel(prior);
    // docs/experiments/latency-and-throughput.md: 164, 612 and 2,148 packed tokens (one question, 4 options).
    for (const [tokens, ms] of [
      [164, 325],
      [612, 1467],
      [2148, 8179],
    ] as const) {
      const est = m.estimate({ tokens, prefix: tokens - 20, branches: 1, width: 20 });
      expect(Math.abs(est - ms) / ms).toBeLessThan(0.15);
    }
  });

  it("scales the prior with the build's size, the threads and the provider", () => {
    const big = priorCoefficients({ parameters: 1_543_714_304, hiddenSize: 1536, layers: 28 }, "cpu", 2);
    expect(big.perToken / prior.perToken).toBeCloseTo(1_543_714_304 / 630_167_424, 5);
    expect(big.perPair / prior.perPair).toBeCloseTo((1536 * 28) / (896 * 24), 5);
    const one = priorCoefficients({ parameters: 630_167_424, hiddenSize: 896, layers: 24 }, "cpu", 1);
    expect(one.perToken / prior.perToken).toBeCloseTo(1.78, 2);
    expect(priorCoefficients(null, "cuda", 2).perToken).toBeLessThan(prior.perToken / 10);
  });

  it("learns a machine twice as slow as the prior within a few passes, on every shape", () => {
    const m = new CostModel(prior);
    const truth = new CostModel({ perPass: 20, perToken: prior.perToken * 2, perPair: prior.perPair * 2 });
    const shapes = [shape(100, 2, 20), shape(600, 8, 30), shape(2000, 16, 40), shape(50, 30, 300), shape(4000, 4, 50)];
    for (let i = 0; i < 15; i++) for (const s of shapes) m.observe(s, truth.estimate(s));
    for (const s of [...shapes, shape(1200, 64, 20), shape(7000, 2, 30)]) {
      expect(Math.abs(m.estimate(s) - truth.estimate(s)) / truth.estimate(s)).toBeLessThan(0.1);
    }
    expect(m.passes).toBe(75);
  });

  it("passes of one shape only move that shape's estimate; the others keep the prior's proportions", () => {
    const m = new CostModel(prior);
    const s = shape(500, 4, 25);
    for (let i = 0; i < 40; i++) m.observe(s, 3 * new CostModel(prior).estimate(s));
    expect(m.estimate(s) / new CostModel(prior).estimate(s)).toBeCloseTo(3, 1);
    const c = m.coefficients;
    expect(c.perPass).toBeGreaterThanOrEqual(0);
    expect(c.perToken).toBeGreaterThan(0);
    expect(c.perPair).toBeGreaterThanOrEqual(0);
    // A much longer pass is still estimated as longer (no negative coefficient, no collapse).
    expect(m.estimate(shape(6000, 4, 25))).toBeGreaterThan(m.estimate(s) * 5);
  });

  it("follows a change of load: recent passes outweigh old ones", () => {
    const m = new CostModel(prior);
    const s = shape(800, 8, 30);
    const base = new CostModel(prior).estimate(s);
    for (let i = 0; i < 30; i++) m.observe(s, base);
    for (let i = 0; i < 20; i++) m.observe(s, 2 * base);
    expect(m.estimate(s) / base).toBeGreaterThan(1.8);
  });

  it("a slow warm-up pass (mostly fixed overhead) moves the small shapes, not the estimate of a large pass", () => {
    const m = new CostModel(prior);
    const tiny = shape(20, 1, 8);
    const large = shape(8000, 4, 40);
    const before = m.estimate(large);
    m.observe(tiny, 3 * m.estimate(tiny));
    expect(m.estimate(tiny)).toBeGreaterThan(2 * new CostModel(prior).estimate(tiny));
    expect(m.estimate(large) / before).toBeLessThan(1.1);
  });

  it("on a GPU, whose prior is a guess, the boot's warm-up pass sets the pace of every shape", () => {
    const gpu = priorCoefficients({ parameters: 630_167_424, hiddenSize: 896, layers: 24 }, "webgpu", 2);
    const warmUp = shape(60, 1, 20);
    const request = shape(600, 8, 30);
    // A device 300 times slower than the prior guessed (llvmpipe, a software Vulkan device, was about that).
    const slow = (m: CostModel) => m.observe(warmUp, 300 * new CostModel(gpu).estimate(warmUp));
    const guessed = new CostModel(gpu, GPU_SPEED_PRIOR_MS);
    slow(guessed);
    const learned = guessed.estimate(request) / new CostModel(gpu).estimate(request);
    expect(learned).toBeGreaterThan(100);
    // With the CPU's trust in its prior, the same pass moves it far less: the request then ran past its deadline.
    const trusted = new CostModel(gpu);
    slow(trusted);
    expect(trusted.estimate(request) / new CostModel(gpu).estimate(request)).toBeLessThan(learned / 5);
  });

  it("ignores timings that are not a positive finite number", () => {
    const m = new CostModel(prior);
    const before = m.estimate(shape(300, 2, 10));
    m.observe(shape(300, 2, 10), 0);
    m.observe(shape(300, 2, 10), Number.NaN);
    expect(m.estimate(shape(300, 2, 10))).toBe(before);
    expect(m.passes).toBe(0);
  });

  it("overrun: the spread of recent passes against the estimate made before each, 1 until there are enough", () => {
    const m = new CostModel(prior);
    const big = shape(1_500, 8, 40);
    expect(m.overrun()).toBe(1);
    // A machine whose mean pace holds but one pass in three runs 1.6× long (the other core busy).
    for (let i = 0; i < 30; i++) m.observe(big, (i % 3 === 2 ? 1.6 : 0.85) * m.estimate(big));
    expect(m.overrun()).toBeGreaterThan(1.3);
    // Steady passes bring it back down once they fill the window.
    for (let i = 0; i < 40; i++) m.observe(big, m.estimate(big));
    expect(m.overrun()).toBeLessThan(1.05);
    // Tiny passes (timer noise, fixed overhead) are not counted.
    const n = new CostModel(prior);
    const slow = 3 * n.estimate(shape(20, 1, 4));
    for (let i = 0; i < 30; i++) n.observe(shape(20, 1, 4), slow);
    expect(n.overrun()).toBe(1);
  });
});

describe("the fair queue", () => {
  interface Item {
    org: string;
    cost: number;
    rank: number;
    name: string;
  }
  let rank = 0;
  const item = (org: string, cost: number, name: string, r = rank++): Item => ({ org, cost, rank: r, name });
  const drain = (q: FairQueue<Item>) => {
    const out: string[] = [];
    for (let x = q.shift(); x; x = q.shift()) out.push(x.name);
    return out;
  };

  it("a newcomer's pass goes next, ahead of a backlog of another organization", () => {
    const q = new FairQueue<Item>();
    for (let i = 0; i < 40; i++) q.push(item("flood", 1000, `a${i}`));
    expect(q.shift()!.name).toBe("a0");
    q.push(item("small", 100, "b0"));
    expect(q.shift()!.name).toBe("b0");
    expect(q.length).toBe(39);
  });

  it("shares service equally by estimated work, whatever the pass sizes", () => {
    const q = new FairQueue<Item>();
    for (let i = 0; i < 10; i++) q.push(item("big", 1000, `B${i}`));
    for (let i = 0; i < 100; i++) q.push(item("small", 100, `s${i}`));
    const order = drain(q).slice(0, 44);
    // About 10 small passes (1,000 ms) for every big one (1,000 ms).
    const big = order.filter((n) => n.startsWith("B")).length;
    expect(big).toBeGreaterThanOrEqual(3);
    expect(big).toBeLessThanOrEqual(5);
  });

  it("round-robin between organizations with equal passes; FIFO by rank within one", () => {
    const q = new FairQueue<Item>();
    q.push(item("a", 10, "a1", 1));
    q.push(item("a", 10, "a3", 3));
    q.push(item("a", 10, "a2", 2));
    q.push(item("b", 10, "b1", 4));
    q.push(item("c", 10, "c1", 5));
    expect(drain(q)).toEqual(["a1", "b1", "c1", "a2", "a3"]);
  });

  it("idleness earns no credit: an organization that was away restarts at the current virtual time", () => {
    const q = new FairQueue<Item>();
    q.push(item("a", 10, "a0"));
    q.shift();
    for (let i = 0; i < 5; i++) q.push(item("b", 10, `b${i}`));
    for (let i = 0; i < 3; i++) q.shift();
    // "a" comes back after b has been served 30 ms: it alternates with b, it does not run 3 passes first.
    for (let i = 1; i < 4; i++) q.push(item("a", 10, `a${i}`));
    expect(drain(q)).toEqual(["a1", "b3", "a2", "b4", "a3"]);
  });

  it("shiftFirst (the express worker's pick): the first pass that fits, organizations by virtual time, charged like any pass", () => {
    const q = new FairQueue<Item>();
    for (let i = 0; i < 3; i++) q.push(item("flood", 1000, `F${i}`));
    q.push(item("flood", 100, "f-short"));
    q.push(item("small", 100, "s0"));
    q.push(item("small", 100, "s1"));
    const short = (x: Item) => x.cost <= 200;
    // The main worker takes the flood's head; "small" is now furthest behind.
    expect(q.shift()!.name).toBe("F0");
    // Its head goes beside, though the flood has a short pass queued too.
    expect(q.shiftFirst(short)!.name).toBe("s0");
    expect(q.shiftFirst((x) => short(x) && x.org !== "small")!.name).toBe("f-short");
    expect(q.shiftFirst((x) => x.cost < 10)).toBeUndefined();
    expect(q.length).toBe(3);
    // s0 and f-short were charged to their organizations: "small" (100) is still behind the flood (1,100).
    expect(drain(q)).toEqual(["s1", "F1", "F2"]);
  });

  it("removes a cancelled pass", () => {
    const q = new FairQueue<Item>();
    const x = item("a", 10, "x");
    q.push(x);
    q.push(item("a", 10, "y"));
    expect(q.remove(x)).toBe(true);
    expect(q.remove(x)).toBe(false);
    expect(drain(q)).toEqual(["y"]);
  });
});

describe("the admission policy", () => {
  const base = { elapsedMs: 5, defaultMs: 60_000, maxMs: 600_000 };

  it("admits what finishes within the default deadline with the safety headroom", () => {
    expect(judge({ ...base, ownMs: 2_000, waitMs: 10_000 })).toEqual({ deadlineMs: 60_000, refused: null, retryAfterS: 0 });
    expect(judge({ ...base, ownMs: 2_000, waitMs: 40_000 }).refused).toBeNull();
  });

  it("an admitted request runs until twice its estimated finish where that is later than its deadline, up to the cap", () => {
    // Admitted at 42 s estimated (52.5 s with the headroom): a mis-estimate costs time, not the work done.
    expect(judge({ ...base, ownMs: 2_000, waitMs: 40_000 })).toEqual({ deadlineMs: 5 + 42_000 * FINISH_GRACE, refused: null, retryAfterS: 0 });
    expect(FINISH_GRACE).toBeGreaterThan(SAFETY_MAX);
    // Never past the cap: a request whose raised deadline is at the cap keeps it.
    expect(judge({ ...base, ownMs: 300_000, waitMs: 100_000 }).deadlineMs).toBe(600_000);
    // The headroom still decides admission: the grace never admits what the headroom refuses.
    expect(judge({ ...base, ownMs: 2_000, waitMs: 47_000 }).refused).toBe("deadline");
  });

  it("refuses at once what would not finish in time, with the seconds until it would fit", () => {
    const j = judge({ ...base, ownMs: 2_000, waitMs: 60_000 });
    expect(j.refused).toBe("deadline");
    // It fits once the work ahead is down to 60 / 1.25 − 2 = 46 s: 14 s from now.
    expect(j.retryAfterS).toBe(14);
    expect(judge({ ...base, ownMs: 2_000, waitMs: 46_100 }).retryAfterS).toBe(1);
  });

  it("raises the deadline of a request whose own work needs more than the default, up to the cap", () => {
    expect(judge({ ...base, ownMs: 40_000, waitMs: 0 })).toEqual({ deadlineMs: 40_000 * DEADLINE_MARGIN, refused: null, retryAfterS: 0 });
    // Two such requests sent together: the second waits for the first and is still admitted.
    expect(judge({ ...base, ownMs: 40_000, waitMs: 40_000 }).refused).toBeNull();
    // ... though the first is the larger: a 64 s code search request behind a 92 s one (the dev data's pair
    // that a margin of 3 refused).
    expect(judge({ ...base, ownMs: 64_000, waitMs: 92_000 }).refused).toBeNull();
    expect(judge({ ...base, ownMs: 300_000, waitMs: 0 }).deadlineMs).toBe(600_000);
  });

  it("refuses up front only work that cannot finish by the cap even alone (422, not 529)", () => {
    const j = judge({ ...base, ownMs: 600_000 / SAFETY + 1, waitMs: 0 });
    expect(j.refused).toBe("too_large");
    const e = refusal("too_large", j, { ...base, ownMs: 490_000, waitMs: 0 });
    expect(e.status).toBe(422);
    expect(e.message).toMatch(/estimated at 490 s .*longest deadline of 600 s \(ASSAY_REQUEST_TIMEOUT_MAX_MS\)/);
  });

  it("a 529's detail names the estimated wait, the request's own work and its deadline", () => {
    const n = { ...base, ownMs: 2_500, waitMs: 61_000 };
    const j = judge(n);
    const e = refusal("deadline", j, n);
    expect(e.status).toBe(529);
    expect(e.retryAfterSeconds).toBe(j.retryAfterS);
    expect(e.message).toMatch(/about 61 s of queued work .* needs about 2\.5 s; it would not finish within its deadline of 60 s/);
    expect(e.message).toContain("nothing was charged");
  });

  it("the headroom rises with the recent overrun, from SAFETY up to SAFETY_MAX, and admits less", () => {
    expect(admissionSafety(1)).toBe(SAFETY);
    expect(admissionSafety(1.1)).toBe(SAFETY);
    expect(admissionSafety(1.4)).toBeCloseTo(1.54, 5);
    expect(admissionSafety(5)).toBe(SAFETY_MAX);
    expect(admissionSafety(Number.NaN)).toBe(SAFETY);
    // 42 s of work fits 60 s at 1.25 (52.5 s), not at 1.54 (64.7 s).
    expect(judge({ ...base, ownMs: 2_000, waitMs: 40_000 }, admissionSafety(1.4)).refused).toBe("deadline");
    // A slow spell makes a request wait, not "too large": that is judged at the base headroom.
    expect(judge({ ...base, ownMs: 400_000, waitMs: 0 }, SAFETY_MAX).refused).toBe("deadline");
    expect(judge({ ...base, ownMs: 400_000, waitMs: 0 }).refused).toBeNull();
  });

  it("no cap below the default: a smaller ASSAY_REQUEST_TIMEOUT_MAX_MS is read as the default", () => {
    expect(judge({ elapsedMs: 0, defaultMs: 60_000, maxMs: 1_000, ownMs: 30_000, waitMs: 0 })).toEqual({ deadlineMs: 60_000, refused: null, retryAfterS: 0 });
  });

  it("fair finish: own backlog first, each other organization's backlog up to as much again", () => {
    const backlogs = new Map([
      ["flood", 100_000],
      ["other", 300],
    ]);
    // A small request of a third organization waits for the running pass, 300 ms of "other" and as much of "flood" as its own work.
    expect(fairFinishMs("small", 500, 1_000, backlogs)).toBe(1_000 + 500 + 500 + 300);
    // The flooding organization's next request waits behind its own backlog and all of the others'.
    expect(fairFinishMs("flood", 500, 1_000, backlogs)).toBe(1_000 + 100_500 + 300);
  });

  it("fair finish counts what other organizations keep sending at their recent rate, never more than the request's own share", () => {
    const backlogs = new Map([["flood", 20_000]]);
    const rates = new Map([
      ["flood", 0.8],
      ["trickle", 0.2],
    ]);
    // The flood's next request: the trickle takes a fifth of the lane meanwhile, T = (1,000 + 20,500) / 0.8.
    expect(fairFinishMs("flood", 500, 1_000, backlogs, rates)).toBeCloseTo(21_500 / 0.8, -1);
    // The trickle's request waits for no more of the flood than its own 500 ms, whatever the flood's rate.
    expect(fairFinishMs("trickle", 500, 1_000, backlogs, rates)).toBe(1_000 + 500 + 500);
  });
});

describe("escalation planned at admission", () => {
  it("plans the longest half of the items for the large build", () => {
    const cost = [10, 500, 40, 300, 20];
    expect(likelyEscalated([0, 1, 2, 3, 4], (i) => cost[i]!).sort()).toEqual([1, 2, 3]);
    expect(likelyEscalated([0, 2, 4], (i) => cost[i]!)).toEqual([2, 4]);
    expect(likelyEscalated([], (i) => cost[i]!)).toEqual([]);
  });
});
