/**
 * `npm run bench -- prefix`: the prefix cache (issue 16), against the same
 * engine without it in the same run.
 *
 *   second request  a state read once, then the same state with one new 4-option
 *                   question (the same organization): first / second, engine and HTTP
 *   cold cost       the primary cell (512×1×4) with the cache on but missing (a new
 *                   organization each time: a full pass that also keeps its keys and
 *                   values) against the engine without a cache, rounds alternating
 *   large request   64 questions × 8 options on a 512-token state (over the pass
 *                   limit): its time against one prefill of the state plus its
 *                   branches read against the cached state, and its answers against
 *                   each question asked alone
 *   carry (opt-in)  with the cache off, a request split into passes: against the
 *                   same request with a cache that only its own passes hit (the
 *                   later passes carry the first's state either way)
 *
 * Memory: the process RSS and the cache's bytes at the end.
 */
import os from "node:os";
import { Engine, passLimit, PrefixCache, type LoadedBuild } from "../src/engine/index.js";
import { loadConfig } from "../src/config/index.js";
import { prepare, readBranches } from "../src/families/general.js";
import { pack } from "../src/inference/pack.js";
import { EnginePipeline } from "../src/pipeline/index.js";
import { Timings } from "../src/pipeline/timings.js";
import type { ChoiceAnswer, Question, RequestEnvelope } from "../src/validate/schema.js";
import { choiceQuestions, fmtMs, machineNote, median, ratio, stateOf, write } from "./common.js";
import { startHttp } from "./latency.js";

export interface PrefixOptions {
  model: string;
  /** Tokens of the state in the second-request measurement. */
  stateTokens: number;
  rounds: number;
  coldRequests: number;
  bigQuestions: number;
  bigOptions: number;
  /** Questions of the carry request (`bigOptions` options each, on a `stateTokens` state). */
  carryQuestions: number;
  cacheMb: number;
  /** Which measurements to run: second, cold, large, answers (the large request's answers against each question alone), carry (opt-in). */
  parts: string[];
}

/** A state of about `tokens` tokens that no other round shares (its first words differ). */
function variant(lb: LoadedBuild, tokens: number, tag: string): string {
  return `Report ${tag}. ${stateOf(lb, tokens - 8)}`;
}

function question(i: number): Record<string, Question> {
  const q = Object.values(choiceQuestions(i + 1, 4))[i]!;
  return { [`q${i}`]: q };
}

export async function prefixScenario(o: PrefixOptions): Promise<void> {
  const log = (s: string) => console.error(s);
  const machine = machineNote();
  const config = loadConfig({ ...process.env, LOG_LEVEL: "silent", ASSAY_PREFIX_CACHE_MB: String(o.cacheMb) });
  const pipeline = await EnginePipeline.create(config);
  const lb = pipeline.build(o.model);
  const limit = passLimit(lb, config.maxPackedTokens);
  // The same pool without a cache or the pinned preamble (the engine before either): the baseline of every figure.
  const plain = new Engine(pipeline.pool, undefined, false);
  // The pinned preamble alone: what a miss adds on top of it.
  const pinned = new Engine(pipeline.pool);
  const http = await startHttp(pipeline);
  const md: string[] = [];
  const result: Record<string, unknown> = { machine, model: o.model, build: lb.build.manifest.build_hash, options: o };
  try {
    // 1. The second request on a state read before.
    if (o.parts.includes("second")) {
      log(`prefix: second request, ${o.stateTokens}-token state, ${o.rounds} rounds`);
      const rows: { layer: string; first: number; second: number; cached: number }[] = [];
      // HTTP rounds first: the engine-layer passes below are no request's admitted work, and admission would
      // count them as another caller's recent use of the lane (a flood the HTTP request must let through).
      const post = async (state: string, qs: Record<string, Question>) => {
        const env: RequestEnvelope = { model: o.model, state, questions: qs };
        const t0 = performance.now();
        const res = await fetch(http.url, {
          method: "POST",
          headers: { authorization: `Bearer ${http.key}`, "content-type": "application/json" },
          body: JSON.stringify(env),
        });
        const text = await res.text();
        if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${text.slice(0, 200)}`);
        return { ms: performance.now() - t0, cached: Number(res.headers.get("x-prefix-cache-tokens")) };
      };
      for (let r = 0; r < o.rounds; r++) {
        const hstate = variant(lb, o.stateTokens, `http-${r}`);
        // A question never asked before in this run: the request also reads its content-free prior.
        const h1 = await post(hstate, question(0));
        const h2 = await post(hstate, question(1 + r));
        rows.push({ layer: "http", first: h1.ms, second: h2.ms, cached: h2.cached });
        log(`  round ${r}: http ${fmtMs(h1.ms)} → ${fmtMs(h2.ms)} ms`);
      }
      for (let r = 0; r < o.rounds; r++) {
        const state = variant(lb, o.stateTokens, `engine-${r}`);
        const org = `bench-second-${r}`;
        const first = prepare(lb, state, question(0));
        const t = performance.now();
        await readBranches(pipeline.engine, lb, first, limit, { orgId: org });
        const firstMs = performance.now() - t;
        const second = prepare(lb, state, question(1 + r));
        const timings = new Timings();
        const t2 = performance.now();
        await readBranches(pipeline.engine, lb, second, limit, { orgId: org, timings });
        rows.push({ layer: "engine", first: firstMs, second: performance.now() - t2, cached: timings.cachedPrefixTokens });
        log(`  round ${r}: engine ${fmtMs(firstMs)} → ${fmtMs(rows.at(-1)!.second)} ms`);
      }
    const second: Record<string, { first_p50: number; second_p50: number; first_over_second: number | null; cached_tokens: number }> = {};
    for (const layer of ["engine", "http"]) {
      const rs = rows.filter((x) => x.layer === layer);
      const f = median(rs.map((x) => x.first));
      const s = median(rs.map((x) => x.second));
      second[layer] = { first_p50: Math.round(f), second_p50: Math.round(s), first_over_second: ratio(f, s, 1), cached_tokens: rs[0]!.cached };
    }
    result.second_request = { rows, ...second };
    md.push(
      `### Second request on a ${o.stateTokens}-token state, one new 4-option question (${o.rounds} rounds, medians)`,
      "",
      "| layer | first request ms | second ms | first / second | prefix tokens from the cache |",
      "|---|---:|---:|---:|---:|",
      ...Object.entries(second).map(([l, v]) => `| ${l} | ${fmtMs(v.first_p50)} | ${fmtMs(v.second_p50)} | ${v.first_over_second} | ${v.cached_tokens} |`),
      "",
    );
    }

    // 2. What a miss costs on the primary cell.
    if (o.parts.includes("cold")) {
      log(`prefix: cold cost, primary cell, ${o.coldRequests} rounds`);
      const primaryState = stateOf(lb, 512);
      const cell = prepare(lb, primaryState, choiceQuestions(1, 4));
      for (let i = 0; i < 2; i++) {
        await readBranches(plain, lb, cell, limit, {});
        await readBranches(pinned, lb, cell, limit, {});
        await readBranches(pipeline.engine, lb, cell, limit, { orgId: `bench-warm-${i}` });
    }
    const off: number[] = [];
    const pin: number[] = [];
    const cold: number[] = [];
    for (let i = 0; i < o.coldRequests; i++) {
      const runs: [number[], () => Promise<unknown>][] = [
        [off, () => readBranches(plain, lb, cell, limit, {})],
        [pin, () => readBranches(pinned, lb, cell, limit, {})],
        [cold, () => readBranches(pipeline.engine, lb, cell, limit, { orgId: `bench-cold-${i}` })],
      ];
      // Each order in turn, so that none of the three always runs first.
      for (let r = 0; r < i % 3; r++) runs.push(runs.shift()!);
      for (const [xs, fn] of runs) {
        const t = performance.now();
        await fn();
        xs.push(performance.now() - t);
      }
    }
    const coldRatio = ratio(median(cold), median(off), 3);
    const pinRatio = ratio(median(pin), median(off), 3);
    const missRatio = ratio(median(cold), median(pin), 3);
    result.cold = {
      off_p50: Math.round(median(off)),
      pinned_p50: Math.round(median(pin)),
      cold_p50: Math.round(median(cold)),
      cold_over_off: coldRatio,
      pinned_over_off: pinRatio,
      cold_over_pinned: missRatio,
      preamble_tokens: lb.preamble.length,
      packed_tokens: cell.packed.inputIds.length,
    };
    md.push(
      `### Cache on but missing: the primary cell (512×1×4, ${cell.packed.inputIds.length} packed tokens, a ${lb.preamble.length}-token preamble), ${o.coldRequests} rounds rotating the order`,
      "",
      "| no cache, no pinned preamble, p50 ms | pinned preamble only, p50 ms | cache on, every request a miss, p50 ms | miss / neither | pinned / neither | miss / pinned |",
      "|---:|---:|---:|---:|---:|---:|",
      `| ${fmtMs(median(off))} | ${fmtMs(median(pin))} | ${fmtMs(median(cold))} | ${coldRatio} | ${pinRatio} | ${missRatio} |`,
      "",
    );
    }

    // 3. A request over the pass limit.
    if (o.parts.includes("large")) {
      log(`prefix: large request, ${o.bigQuestions} × ${o.bigOptions} on 512 tokens`);
      const bigQs = choiceQuestions(o.bigQuestions, o.bigOptions);
      const bigState = variant(lb, 512, "large");
      const big = prepare(lb, bigState, bigQs);
      const prefillPass = pack(big.prefix.slice(0, -1), [{ suffix: big.prefix.slice(-1), labels: [[16]], terminator: lb.terminator }]);
      await plain.run(lb, prefillPass);
      let t = performance.now();
      await plain.run(lb, prefillPass);
      const prefillMs = performance.now() - t;
      const bigTimings = new Timings();
      t = performance.now();
      await readBranches(pipeline.engine, lb, big, limit, { orgId: "bench-large", timings: bigTimings });
      const bigMs = performance.now() - t;
      // The same branches again, every pass now against the cached state: the branch rate.
      t = performance.now();
      await readBranches(pipeline.engine, lb, big, limit, { orgId: "bench-large" });
      const branchesMs = performance.now() - t;
      const bound = prefillMs + branchesMs;
      // Answers: the whole request through the pipeline, then each question alone.
      const org = "bench-large-answers";
      const whole = !o.parts.includes("answers") ? null : await pipeline.run({ model: o.model, state: bigState, questions: bigQs }, { requestId: "large", orgId: org, timings: new Timings() });
      let maxDp = Number.NaN;
      if (o.parts.includes("answers")) {
        maxDp = 0;
        for (const [id, q] of Object.entries(bigQs)) {
          const alone = await pipeline.run({ model: o.model, state: bigState, questions: { [id]: q } }, { requestId: `alone-${id}`, orgId: org, timings: new Timings() });
          const a = whole!.answers[id] as ChoiceAnswer;
          const b = alone.answers[id] as ChoiceAnswer;
          for (const k of Object.keys(a.probabilities)) maxDp = Math.max(maxDp, Math.abs(a.probabilities[k]! - b.probabilities[k]!));
      }
    }
    result.large = {
      packed_tokens: big.packed.inputIds.length,
      prefix_tokens: big.prefix.length,
      passes_cached_tokens: bigTimings.cachedPrefixTokens,
      ms: Math.round(bigMs),
      prefill_ms: Math.round(prefillMs),
      branches_against_cache_ms: Math.round(branchesMs),
      over_bound: ratio(bigMs, bound, 3),
      max_abs_dp_vs_alone: Number.isNaN(maxDp) ? null : +maxDp.toFixed(6),
    };
    md.push(
      `### ${o.bigQuestions} questions × ${o.bigOptions} options on a 512-token state (${big.packed.inputIds.length.toLocaleString("en-US")} packed tokens as one sequence; pass limit ${limit.toLocaleString("en-US")})`,
      "",
      "| request ms | prefix tokens from the cache, over its passes | one prefill of the state ms | its branches against the cached state ms | request / (prefill + branches) | max abs Δp vs each question alone |",
      "|---:|---:|---:|---:|---:|---:|",
      `| ${fmtMs(bigMs)} | ${bigTimings.cachedPrefixTokens.toLocaleString("en-US")} | ${fmtMs(prefillMs)} | ${fmtMs(branchesMs)} | ${ratio(bigMs, bound, 3)} | ${Number.isNaN(maxDp) ? "not run" : maxDp.toFixed(6)} |`,
      "",
    );
    }
    // 4. A request split into passes, with the cache off: its later passes carry the state (opt-in: --parts carry).
    if (o.parts.includes("carry")) {
      log(`prefix: carry, ${o.carryQuestions} × ${o.bigOptions} on ${o.stateTokens} tokens, ${o.rounds} rounds`);
      const qs = choiceQuestions(o.carryQuestions, o.bigOptions);
      const off = new Engine(pipeline.pool);
      // The baseline: a cache of its own, each request from a new organization, so only the request's own passes hit it.
      const on = new Engine(pipeline.pool, new PrefixCache(1 << 30, "organization"));
      const ms: Record<"off" | "on", number[]> = { off: [], on: [] };
      let passes = 0;
      let packedTokens = 0;
      let maxDlp = 0;
      for (let r = 0; r <= o.rounds; r++) {
        const req = prepare(lb, variant(lb, o.stateTokens, `carry ${r}`), qs);
        packedTokens = req.packed.inputIds.length;
        const read: Partial<Record<"off" | "on", number[][]>> = {};
        for (const side of r % 2 ? (["on", "off"] as const) : (["off", "on"] as const)) {
          const t = performance.now();
          const out = await (side === "on" ? on : off).scoreMany(lb, req.prefix, req.encoded, limit, { orgId: `bench-carry-${r}-${side}` });
          // Round 0 warms both sides up.
          if (r > 0) ms[side].push(performance.now() - t);
          read[side] = out.lps as number[][];
          passes = out.passes;
        }
        read.off!.forEach((row, i) => row.forEach((x, j) => (maxDlp = Math.max(maxDlp, Math.abs(x - read.on![i]![j]!)))));
      }
      const carryRatio = ratio(median(ms.off), median(ms.on), 3);
      result.carry = { passes, packed_tokens: packedTokens, off_ms: ms.off.map(Math.round), on_ms: ms.on.map(Math.round), off_over_on: carryRatio, max_abs_dlp: maxDlp };
      md.push(
        `### Cache off, a request of ${o.carryQuestions} × ${o.bigOptions} options on a ${o.stateTokens}-token state (${packedTokens.toLocaleString("en-US")} packed tokens, ${passes} passes), ${o.rounds} rounds alternating`,
        "",
        "| cache off, p50 ms | cache on (the request's own passes only), p50 ms | off / on | max abs Δ log-prob |",
        "|---:|---:|---:|---:|",
        `| ${fmtMs(median(ms.off))} | ${fmtMs(median(ms.on))} | ${carryRatio} | ${maxDlp} |`,
        "",
      );
    }

    const rss = process.memoryUsage().rss;
    result.memory = { rss_mb: Math.round(rss / 2 ** 20), cache_mb: +(pipeline.engine.prefixes.bytes / 2 ** 20).toFixed(1), budget_mb: o.cacheMb };
    md.push(`Memory at the end: process RSS ${Math.round(rss / 2 ** 20).toLocaleString("en-US")} MB; the cache holds ${(pipeline.engine.prefixes.bytes / 2 ** 20).toFixed(1)} MB of its ${o.cacheMb} MB budget.`, "");
  } finally {
    await http.close();
    await pipeline.close();
  }
  const head = [
    `## prefix (${new Date().toISOString()})`,
    "",
    `model ${o.model} → build ${lb.build.manifest.build_hash}; ${machine.cpu}; load ${machine.loadStart} at the start, ${os.loadavg()[0]!.toFixed(2)} at the end`,
    "",
  ];
  write("prefix", result, [...head, ...md].join("\n"));
}
