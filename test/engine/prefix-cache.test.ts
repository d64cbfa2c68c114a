/**
 * The prefix cache on the real exported models (never a stub): a pass that
 * continues cached keys and values reads the same log-probabilities as the
 * whole pass (to 1e-4), within one request of several passes and across
 * requests; entries are found only by the organization that made them unless
 * the cache is shared; the response says how many prefix tokens it saved.
 *
 * Cost: short passes, on the 0.5B build alone (the small deployment).
 */
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import {
  branchCost,
  COMPUTED_PREFIX_TOKENS,
  Engine,
  LONG_STATE_CHUNKS,
  NEUTRAL_STATE,
  preambleIds,
  prefillChunkSizes,
  PrefixCache,
  type LoadedBuild,
  type ScoreContext,
} from "../../src/engine/index.js";
import type { PassShape } from "../../src/inference/cost.js";
import type { PackedRequest } from "../../src/inference/pack.js";
import { prepare, readBranches } from "../../src/families/general.js";
import { encodeBranches, plannedPasses, scoreYesNo } from "../../src/families/yesno.js";
import { factcheckClaim } from "../../src/prompt/families.js";
import { buildPrefix } from "../../src/prompt/index.js";
import type { EnginePipeline } from "../../src/pipeline/index.js";
import { Timings } from "../../src/pipeline/timings.js";
import { metrics } from "../../src/observability/metrics.js";
import type { NoulAnswer, Question, RequestEnvelope, SystemOneResponse } from "../../src/validate/schema.js";
import { smallDeployment, startEngine } from "./engine.js";

const TOL = 1e-4;

const STATE =
  "Order 4411 was placed on 3 March for two pairs of running shoes (size 42, blue) and one rain jacket. " +
  "The shoes shipped on 5 March from the Leeds warehouse and arrived on 7 March. The jacket was out of stock; " +
  "the customer was told it would ship within ten days, but on 20 March it had still not shipped. " +
  "The customer wrote on 21 March: the shoes fit well and she likes them, but she wants the jacket cancelled and " +
  "the money for it returned to her card, not as store credit. She also asked whether the delivery fee would be " +
  "refunded, since she paid for one delivery and received only part of the order.";

const QUESTIONS: Record<string, Question> = {
  refund: { type: "noul", instructions: "Is the customer asking for her money back?" },
  shoes: { type: "noul", instructions: "The customer is unhappy with the shoes." },
  topic: { type: "choice", instructions: "What is the message mainly about?", criteria: { delivery: null, sizing: null, cancellation: null, payment: null } },
  mood: { type: "score", instructions: "How satisfied is the customer?", criteria: ["very unhappy", "unhappy", "neutral", "happy", "very happy"] },
};

const savedByPreamble = async () => (await metrics.preambleTokensSaved.get()).values[0]?.value ?? 0;

const maxDiff = (a: number[][], b: number[][]) => Math.max(...a.flatMap((row, i) => row.map((x, j) => Math.abs(x - b[i]![j]!))));

let pipeline: EnginePipeline;
/** The same pool without a cache or the pinned preamble: every pass computes its whole prefix, the reference reading. */
let plain: Engine;

/**
 * What the cache keeps and reads is the same on every build (its key/value layout comes from the manifest):
 * the small deployment, every name on the 0.5B. Both builds ran here until 2026-12-03, the same readings.
 */
const MODELS = ["vendor/judge-9B"];

beforeAll(async () => {
  pipeline = await startEngine({ ...smallDeployment(), ASSAY_PREFIX_CACHE_MB: "256", ASSAY_PREFIX_CACHE_SCOPE: "organization" });
  plain = new Engine(pipeline.pool, undefined, false);
}, 300_000);

afterAll(async () => {
  await pipeline?.close();
});

function ctx(orgId: string): ScoreContext & { timings: Timings } {
  return { orgId, timings: new Timings() };
}

describe("prefix cache", () => {
  for (const model of MODELS) {
    it(`${model}: a pass continuing the cached prefix reads what the whole pass reads`, async () => {
      const lb = pipeline.build(model);
      expect(lb.build.manifest.kv).toBeDefined();
      const { packed } = prepare(lb, STATE, QUESTIONS);
      const ref = await plain.run(lb, packed);
      const miss = ctx(`org-${model}`);
      const first = await pipeline.engine.run(lb, packed, miss);
      expect(miss.timings.cachedPrefixTokens).toBe(0);
      const hit = ctx(`org-${model}`);
      const second = await pipeline.engine.run(lb, packed, hit);
      expect(hit.timings.cachedPrefixTokens).toBe(packed.prefixLength - COMPUTED_PREFIX_TOKENS);
      expect(maxDiff(first, ref)).toBeLessThanOrEqual(TOL);
      expect(maxDiff(second, ref)).toBeLessThanOrEqual(TOL);
    }, 120_000);
  }

  for (const model of MODELS) {
    it(`${model}: passes that start from the preamble's keys and values, with and without the worked examples, read what the whole pass reads`, async () => {
      const lb = pipeline.build(model);
      const withExamples: LoadedBuild = { ...lb, style: { ...lb.style, demonstrations: true }, labelCache: new Map() };
      withExamples.preamble = preambleIds(lb.tokenizer, withExamples.style);
      expect(withExamples.preamble.length).toBeGreaterThan(300);
      for (const b of [lb, withExamples]) {
        expect(b.preamble.length).toBeGreaterThanOrEqual(30);
        const { packed } = prepare(b, STATE, QUESTIONS);
        expect(Array.from(packed.inputIds.subarray(0, b.preamble.length), Number)).toEqual(b.preamble);
        // A new organization each time: a prefix cache miss, so the pass starts from the preamble alone.
        const before = await savedByPreamble();
        const got = await pipeline.engine.run(b, packed, ctx(`org-preamble-${model}-${b.preamble.length}`));
        expect((await savedByPreamble()) - before).toBe(b.preamble.length);
        expect(maxDiff(got, await plain.run(b, packed))).toBeLessThanOrEqual(TOL);
      }
    }, 180_000);
  }

  it("admission plans a pass as it will run: less the preamble on a miss, its last prefix tokens and questions on a hit", async () => {
    const lb = pipeline.build("vendor/judge-9B");
    const { packed, prefix } = prepare(lb, STATE, QUESTIONS);
    const plan = (orgId: string) => pipeline.engine.planGeneral(lb, [packed], [], false, { prefix, orgId, limit: 8192 })[0]!.shape;
    // What is not computed again is still attended to: the pass continues it (its attention counts in the estimate).
    expect(plan("org-plan")).toMatchObject({ prefix: prefix.length - lb.preamble.length, tokens: packed.inputIds.length - lb.preamble.length, past: lb.preamble.length });
    await pipeline.engine.run(lb, packed, ctx("org-plan"));
    expect(plan("org-plan")).toMatchObject({
      prefix: COMPUTED_PREFIX_TOKENS,
      tokens: packed.inputIds.length - prefix.length + COMPUTED_PREFIX_TOKENS,
      past: prefix.length - COMPUTED_PREFIX_TOKENS,
    });
    // Another organization's plan does not see the entry.
    expect(plan("org-plan-other").prefix).toBe(prefix.length - lb.preamble.length);
  }, 120_000);

  it("admission plans a content-free prior pass as it runs: the neutral state computed after the pinned preamble, and none once the prior is cached", async () => {
    const lb = pipeline.build("vendor/judge-9B");
    // Questions no other test reads, so the prior cache holds none of them and the pass runs.
    const { packed, prefix, encoded } = prepare(lb, STATE, { p0: { type: "noul", instructions: "The parcel was left with a neighbour on 9 March." } });
    const priors = [{ neutral: NEUTRAL_STATE, branches: encoded }];
    const plan = () => pipeline.engine.planGeneral(lb, [packed], priors, false, { prefix, orgId: "org-prior-plan", limit: 8192 });
    const planned = plan();
    expect(planned).toHaveLength(2);
    const seen: PassShape[] = [];
    pipeline.pool.onPassTimed = (_model, shape) => seen.push(shape);
    try {
      await pipeline.engine.prior(lb, NEUTRAL_STATE, encoded, 8192, ctx("org-prior-plan"));
    } finally {
      pipeline.pool.onPassTimed = null;
    }
    expect(seen).toHaveLength(1);
    expect(planned[1]!.shape).toEqual(seen[0]);
    expect(seen[0]!.past).toBe(lb.preamble.length);
    // Read once, the prior is the cache's: the next request asking it plans no prior pass.
    expect(plan()).toHaveLength(1);
  }, 120_000);

  it("the yes/no families' admission plans the same way: a second batch on a cached document is planned as a hit", async () => {
    const lb = pipeline.build("vendor/judge-9B");
    const enc = encodeBranches(lb, buildPrefix(lb.style, STATE), [factcheckClaim(lb.style, "The shoes arrived on 7 March.")]);
    const limit = 8192;
    const before = plannedPasses(pipeline.engine, lb, enc, limit, "org-plan-yesno")[0]!.shape;
    expect(before.prefix).toBe(enc.prefix.length - lb.preamble.length);
    await scoreYesNo(pipeline.engine, lb, enc, limit, ctx("org-plan-yesno"));
    expect(plannedPasses(pipeline.engine, lb, enc, limit, "org-plan-yesno")[0]!.shape.prefix).toBe(COMPUTED_PREFIX_TOKENS);
  }, 120_000);

  for (const model of MODELS) {
    it(`${model}: a wide question among narrow ones, read in passes split by width, reads as it reads alone`, async () => {
      const lb = pipeline.build(model);
      // One 4-option question (its four presentations share one wide block) among six statements (narrow blocks).
      const qs: Record<string, Question> = { topic: QUESTIONS.topic! };
      for (const [i, s] of ["The shoes arrived on 7 March.", "The jacket shipped.", "The order had three items.", "The shoes were size 44.", "The customer wants store credit.", "The shoes came from Leeds."].entries())
        qs[`s${i}`] = { type: "noul", instructions: s };
      const prepared = prepare(lb, STATE, qs);
      const { prefix, encoded } = prepared;
      expect(pipeline.engine.onePass(lb, prefix.length, encoded, 8192)).toBe(false);
      const many = await pipeline.engine.scoreMany(lb, prefix, encoded, 8192, ctx("org-widths"));
      expect(many.passes).toBe(2);
      for (const q of prepared.questions) {
        const alone = prepare(lb, STATE, { [q.id]: qs[q.id]! });
        const one = await plain.run(lb, alone.packed);
        expect(maxDiff(q.blocks.map((b) => many.lps[b]!), one), q.id).toBeLessThanOrEqual(TOL);
      }
    }, 180_000);
  }

  it("another question on a cached state: read from the cache, as it reads alone", async () => {
    const lb = pipeline.build("vendor/judge-9B");
    await pipeline.engine.run(lb, prepare(lb, STATE, QUESTIONS).packed, ctx("org-new-question"));
    const { packed } = prepare(lb, STATE, { late: { type: "noul", instructions: "The jacket has shipped." } });
    const c = ctx("org-new-question");
    const got = await pipeline.engine.run(lb, packed, c);
    expect(c.timings.cachedPrefixTokens).toBe(packed.prefixLength - COMPUTED_PREFIX_TOKENS);
    expect(maxDiff(got, await plain.run(lb, packed))).toBeLessThanOrEqual(TOL);
  }, 120_000);

  it("hits on a long state, then a short one, then the long one again read what their whole passes read (the worker's kept buffer outgrows the keys it is handed)", async () => {
    const lb = pipeline.build("vendor/judge-9B");
    const long = prepare(lb, `${STATE}\n\n${STATE}\n\n${STATE}`, QUESTIONS).packed;
    const short = prepare(lb, STATE, { late: { type: "noul", instructions: "The jacket has shipped." } }).packed;
    expect(long.prefixLength).toBeGreaterThan(2 * short.prefixLength);
    for (const p of [long, short]) await pipeline.engine.run(lb, p, ctx("org-buffer"));
    for (const p of [long, short, long]) {
      const c = ctx("org-buffer");
      const got = await pipeline.engine.run(lb, p, c);
      expect(c.timings.cachedPrefixTokens).toBe(p.prefixLength - COMPUTED_PREFIX_TOKENS);
      expect(maxDiff(got, await plain.run(lb, p))).toBeLessThanOrEqual(TOL);
    }
  }, 120_000);

  it("is partitioned by organization: another organization's same state is computed again", async () => {
    const lb = pipeline.build("vendor/judge-9B");
    const { packed } = prepare(lb, STATE, QUESTIONS);
    await pipeline.engine.run(lb, packed, ctx("org-a"));
    const b = ctx("org-b");
    await pipeline.engine.run(lb, packed, b);
    expect(b.timings.cachedPrefixTokens).toBe(0);
    const a = ctx("org-a");
    await pipeline.engine.run(lb, packed, a);
    expect(a.timings.cachedPrefixTokens).toBe(packed.prefixLength - COMPUTED_PREFIX_TOKENS);
  }, 120_000);

  it("shared: any organization hits", async () => {
    const lb = pipeline.build("vendor/judge-9B");
    const shared = new Engine(pipeline.pool, new PrefixCache(64 << 20, "shared"));
    const { packed } = prepare(lb, STATE, QUESTIONS);
    await shared.run(lb, packed, ctx("org-a"));
    const b = ctx("org-b");
    await shared.run(lb, packed, b);
    expect(b.timings.cachedPrefixTokens).toBe(packed.prefixLength - COMPUTED_PREFIX_TOKENS);
  }, 120_000);

  it("the content-free prior cache has the same partitions: another organization's question is read again, and reads the same", async () => {
    const lb = pipeline.build("vendor/judge-9B");
    // A claim no other test reads: a cached prior answers sooner, so org-b must not find org-a's.
    const { encoded } = prepare(lb, STATE, { p: { type: "noul", instructions: "The warehouse in Leeds closed on 30 March." } });
    const passesRun = async (engine: Engine, org: string) => {
      let n = 0;
      pipeline.pool.onPassTimed = () => n++;
      try {
        return { reading: await engine.prior(lb, NEUTRAL_STATE, encoded, 8192, ctx(org)), passes: n };
      } finally {
        pipeline.pool.onPassTimed = null;
      }
    };
    // (At least one pass: the build's preamble may be computed first.)
    const a = await passesRun(pipeline.engine, "org-prior-a");
    expect(a.passes).toBeGreaterThanOrEqual(1);
    expect((await passesRun(pipeline.engine, "org-prior-a")).passes).toBe(0);
    expect(pipeline.engine.planPrior(lb, NEUTRAL_STATE, encoded, 8192, "org-prior-b")).toHaveLength(1);
    const b = await passesRun(pipeline.engine, "org-prior-b");
    expect(b.passes).toBeGreaterThanOrEqual(1);
    expect(maxDiff(b.reading, a.reading)).toBeLessThanOrEqual(TOL);
    // Shared (a single-tenant deployment): the second organization's request reads the first's entry.
    const shared = new Engine(pipeline.pool, new PrefixCache(0, "shared"));
    expect((await passesRun(shared, "org-prior-a")).passes).toBeGreaterThanOrEqual(1);
    expect(shared.planPrior(lb, NEUTRAL_STATE, encoded, 8192, "org-prior-b")).toHaveLength(0);
    expect((await passesRun(shared, "org-prior-b")).passes).toBe(0);
  }, 120_000);

  it("a request read in several passes computes its state once and reads as in one pass", async () => {
    const lb = pipeline.build("vendor/judge-9B");
    const prepared = prepare(lb, STATE, QUESTIONS);
    const { prefix, encoded } = prepared;
    // A limit that fits the prefix and one question's block (its presentations behind their stem): a pass per question.
    const limit = prefix.length + Math.max(...prepared.questions.map((q) => q.blocks.reduce((s, b) => s + branchCost(encoded[b]!), 0)));
    const c = ctx("org-passes");
    const many = await pipeline.engine.scoreMany(lb, prefix, encoded, limit, c);
    expect(many.passes).toBeGreaterThan(2);
    expect(c.timings.cachedPrefixTokens).toBe((many.passes - 1) * (prefix.length - COMPUTED_PREFIX_TOKENS));
    const one = await plain.run(lb, prepared.packed);
    expect(maxDiff(many.lps as number[][], one)).toBeLessThanOrEqual(TOL);
  }, 120_000);

  it("with the cache off, a request read in several passes still computes its state once (carried from its first pass), as planned, and reads as in one pass", async () => {
    const lb = pipeline.build("vendor/judge-9B");
    const prepared = prepare(lb, STATE, QUESTIONS);
    const { prefix, encoded } = prepared;
    const limit = prefix.length + Math.max(...prepared.questions.map((q) => q.blocks.reduce((s, b) => s + branchCost(encoded[b]!), 0)));
    const held = prefix.length - COMPUTED_PREFIX_TOKENS;
    const off = new Engine(pipeline.pool);
    expect(off.prefixes.enabled).toBe(false);
    // Every pass as the pool runs it (the spy calls the real pool through): the state tokens it computes, past what it continues.
    const ran: { from: number; to: number }[] = [];
    const infer = pipeline.pool.infer.bind(pipeline.pool);
    const spy = vi.spyOn(pipeline.pool, "infer").mockImplementation((model, packed, signal, kv) => {
      const from = kv?.past?.tokens ?? 0;
      ran.push({ from, to: from + (packed as PackedRequest).prefixLength });
      return infer(model, packed, signal, kv);
    });
    try {
      const c = ctx("org-carry");
      const many = await off.scoreMany(lb, prefix, encoded, limit, c);
      expect(many.passes).toBeGreaterThan(2);
      // The request's passes (after the preamble's own, on this fresh engine): the first computes the state, the rest continue it.
      const passes = ran.slice(-many.passes);
      expect(passes[0]!.to).toBe(prefix.length);
      expect(passes[0]!.from).toBeLessThan(held);
      for (const p of passes.slice(1)) expect(p).toEqual({ from: held, to: prefix.length });
      // Nothing came from the cache (the header counts the cache's tokens only).
      expect(c.timings.cachedPrefixTokens).toBe(0);
      const planned = off.planAsRun(lb, prefix, encoded, limit);
      expect(planned).toHaveLength(many.passes);
      for (const { shape } of planned.slice(1)) expect({ prefix: shape.prefix, past: shape.past }).toEqual({ prefix: COMPUTED_PREFIX_TOKENS, past: held });
      const one = await plain.run(lb, prepared.packed);
      expect(maxDiff(many.lps as number[][], one)).toBeLessThanOrEqual(TOL);
    } finally {
      spy.mockRestore();
    }
  }, 120_000);

  it("fact check and code search read through the same cache: a second batch of claims, a second question on the same items", async () => {
    const run = async (model: string, state: unknown, questions: Record<string, unknown>) => {
      const t = new Timings();
      const r = await pipeline.run({ model, state, questions } as RequestEnvelope, { requestId: model, orgId: "org-families", timings: t });
      return { r, cached: t.cachedPrefixTokens };
    };
    const doc = STATE;
    const first = await run("judge-factcheck-lite", doc, { a: { type: "noul", instructions: "The shoes arrived on 7 March." } });
    const again = await run("judge-factcheck-lite", doc, { b: { type: "noul", instructions: "The jacket shipped on 20 March." } });
    expect(first.cached).toBe(0);
    expect(again.cached).toBeGreaterThan(100);
    const cs = { query: "Where is the refund for a cancelled order line computed?", items: [
      { id: "n0", path: "orders/refunds.py", kind: "file", filePreview: { text: "def refund_line(order, line):\n    return line.price * line.qty\n" } },
      { id: "n1", path: "README.md", kind: "file", filePreview: { text: "# Shop\nAn online shop." } },
    ] };
    const c1 = await run("judge-codegrep-lite", cs, { q0: { type: "noul" }, q1: { type: "noul" } });
    const c2 = await run("judge-codegrep-lite", { ...cs, items: cs.items.slice(0, 1) }, { q0: { type: "noul" } });
    expect(c1.cached).toBe(0);
    expect(c2.cached).toBeGreaterThan(0);
    // The model's own reading through the cache; `noul` reads the whole request (its other items), so it may move.
    const raw = (r: SystemOneResponse) => (r.details as Record<string, { raw: number }>).q0!.raw;
    expect(Math.abs(raw(c2.r) - raw(c1.r))).toBeLessThanOrEqual(TOL);
  }, 120_000);

  it("a state longer than a pass is computed in chunks and its branches read against it, as in one pass", async () => {
    const lb = pipeline.build("vendor/judge-9B");
    const prepared = prepare(lb, STATE, QUESTIONS);
    const { prefix, encoded } = prepared;
    // A pass limit below the state's length: only the chunked path can read it.
    const limit = 100;
    expect(prefix.length).toBeGreaterThan(limit);
    // Admission plans the chunks while the state is not cached for the organization.
    const prefills = (org: string) => pipeline.engine.planAsRun(lb, prefix, encoded, limit, org).filter((p) => p.prefill).length;
    expect(prefills("org-long")).toBeGreaterThan(1);
    for (const cache of [pipeline.engine, plain]) {
      const c = ctx("org-long");
      const long = await cache.scoreMany(lb, prefix, encoded, limit, c);
      expect(long.passes).toBeGreaterThan(prepared.questions.length);
      const one = await plain.run(lb, prepared.packed);
      expect(maxDiff(long.lps as number[][], one)).toBeLessThanOrEqual(TOL);
    }
    // With the cache, the state's keys and values are kept: the same state again starts from them.
    const again = ctx("org-long");
    await pipeline.engine.scoreMany(lb, prefix, encoded.slice(0, 1), limit, again);
    expect(again.timings.cachedPrefixTokens).toBe(prefix.length - COMPUTED_PREFIX_TOKENS);
    // …and plans it as it runs: the branch passes alone, each against the whole state; another organization's plan keeps the chunks.
    const planned = pipeline.engine.planAsRun(lb, prefix, encoded, limit, "org-long");
    expect(planned.filter((p) => p.prefill)).toEqual([]);
    expect(planned.every((p) => p.shape.past === prefix.length - COMPUTED_PREFIX_TOKENS)).toBe(true);
    expect(prefills("org-long-other")).toBeGreaterThan(1);
  }, 120_000);

  it("a state over two state chunks is computed apart from its questions, in the planned chunks, and reads what its one pass reads", async () => {
    const lb = pipeline.build("vendor/judge-9B");
    const prepared = prepare(lb, STATE, QUESTIONS);
    const { prefix, encoded } = prepared;
    const limit = 8192;
    const chunk = 48;
    expect(prefix.length).toBeGreaterThan(LONG_STATE_CHUNKS * chunk);
    expect(prepared.packed.inputIds.length).toBeLessThan(limit);
    // At 0, the state fits one pass with its questions and is read in it; with a chunk, apart.
    expect(new Engine(pipeline.pool, undefined, true, { stateChunk: 0 }).onePass(lb, prefix.length, encoded, limit)).toBe(true);
    const chunked = new Engine(pipeline.pool, undefined, true, { stateChunk: chunk });
    expect(chunked.onePass(lb, prefix.length, encoded, limit)).toBe(false);
    const planned = chunked.plan(lb, prefix.length, encoded, limit);
    const prefills = planned.filter((p) => p.prefill);
    expect(prefills.map((p) => p.shape.prefix)).toEqual(prefillChunkSizes(prefix.length - COMPUTED_PREFIX_TOKENS, chunk));
    expect(prefills.length).toBeGreaterThan(2);
    // Each chunk's attention within chunk² pairs, whatever the pass limit.
    for (const p of prefills) expect(p.shape.prefix * ((p.shape.past ?? 0) + p.shape.prefix)).toBeLessThanOrEqual(chunk * chunk);
    const long = await chunked.scoreMany(lb, prefix, encoded, limit, {});
    expect(long.passes).toBe(planned.length);
    expect(maxDiff(long.lps as number[][], await plain.run(lb, prepared.packed))).toBeLessThanOrEqual(TOL);
    // The general family's reading takes the same path (its fast path is for one pass only).
    expect(maxDiff(await readBranches(chunked, lb, prepared, limit, {}), long.lps as number[][])).toBe(0);
  }, 120_000);

  it("with a pair bound, every pass holds at most that many scores per layer (a block wider than it alone), and the readings are the one pass's", async () => {
    const lb = pipeline.build("vendor/judge-9B");
    const prepared = prepare(lb, STATE, QUESTIONS);
    const { prefix, encoded } = prepared;
    const limit = 8192;
    const kv = lb.build.manifest.kv!;
    const heads = lb.build.manifest.hidden_size / kv.head_dim;
    expect(new Engine(pipeline.pool, undefined, true).onePass(lb, prefix.length, encoded, limit)).toBe(true);
    const one = await plain.run(lb, prepared.packed);
    const scores = (s: PassShape) => {
      const keys = (s.past ?? 0) + s.prefix;
      return { state: s.prefix * keys, branches: s.branches * s.width * (keys + s.width) };
    };
    // Under the state's own scores (prefix²): the state in chunks, then its blocks; over them: one pass
    // with the state, the blocks in as many passes as the bound calls for, some sharing a pass.
    for (const [share, chunked] of [
      [0.9, true],
      [1.5, false],
    ] as const) {
      const pairs = Math.floor(share * prefix.length * prefix.length);
      const bounded = new Engine(pipeline.pool, undefined, true, { attentionBytes: pairs * 4 * heads });
      expect(bounded.onePass(lb, prefix.length, encoded, limit)).toBe(false);
      const planned = bounded.plan(lb, prefix.length, encoded, limit);
      expect(planned.filter((p) => p.prefill).length > 1).toBe(chunked);
      if (!chunked) expect(planned.some((p) => p.shape.branches > 1)).toBe(true);
      for (const { shape } of planned) {
        expect(scores(shape).state).toBeLessThanOrEqual(pairs);
        if (shape.branches > 1) expect(scores(shape).branches).toBeLessThanOrEqual(pairs);
      }
      const read = await bounded.scoreMany(lb, prefix, encoded, limit, {});
      expect(read.passes).toBe(planned.length);
      expect(maxDiff(read.lps as number[][], one)).toBeLessThanOrEqual(TOL);
    }
  }, 120_000);

  it("through the pipeline, a state longer than ASSAY_MAX_PACKED_TOKENS is answered as with a larger limit, and billed the same", async () => {
    const small = await startEngine({ ...smallDeployment(), ASSAY_MAX_PACKED_TOKENS: "128", ASSAY_PREFIX_CACHE_MB: "0" });
    try {
      const env = { model: "vendor/judge-9B", state: STATE, questions: QUESTIONS };
      const a = await small.run(env, { requestId: "small", orgId: "org-small", timings: new Timings() });
      const b = await pipeline.run(env, { requestId: "large", orgId: "org-small", timings: new Timings() });
      expect(a.usage).toEqual(b.usage);
      for (const id of ["refund", "shoes"]) expect(Math.abs((a.answers[id] as NoulAnswer).noul - (b.answers[id] as NoulAnswer).noul)).toBeLessThanOrEqual(TOL);
    } finally {
      await small.close();
    }
  }, 180_000);

  it("through the pipeline: the second request's answers equal the first's, and it says what it saved", async () => {
    const env = { model: "vendor/judge-9B", state: STATE, questions: QUESTIONS };
    const t1 = new Timings();
    const r1 = await pipeline.run(env, { requestId: "a", orgId: "org-pipeline", timings: t1 });
    const t2 = new Timings();
    const r2 = await pipeline.run(env, { requestId: "b", orgId: "org-pipeline", timings: t2 });
    // The first request computes its state once (a later pass of it, its narrow blocks split from the
    // wide ones by the planner, continues it from the cache); the second takes it in every pass.
    const lb = pipeline.build("vendor/judge-9B");
    const { prefix, encoded } = prepare(lb, STATE, QUESTIONS);
    const passes = pipeline.engine.plan(lb, prefix.length, encoded, Number.MAX_SAFE_INTEGER).length;
    expect(Number(t2.headers()["x-prefix-cache-tokens"])).toBe(passes * (prefix.length - COMPUTED_PREFIX_TOKENS));
    expect(Number(t1.headers()["x-prefix-cache-tokens"])).toBeLessThan(Number(t2.headers()["x-prefix-cache-tokens"]));
    // Billing is unchanged by the cache.
    expect(r2.usage).toEqual(r1.usage);
    expect(Math.abs((r2.answers.refund as NoulAnswer).noul - (r1.answers.refund as NoulAnswer).noul)).toBeLessThanOrEqual(TOL);
    expect(Math.abs((r2.answers.shoes as NoulAnswer).noul - (r1.answers.shoes as NoulAnswer).noul)).toBeLessThanOrEqual(TOL);
  }, 120_000);
});
