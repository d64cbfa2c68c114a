/**
 * Ready means ready for a burst: what the server loads before /readyz answers 200
 * (EnginePipeline.preloadForServing, as src/main.ts calls it) leaves nothing for the first burst to
 * wait for. Eight small requests sent at once right after it finish in about the time a later burst
 * of eight takes (measured in the same run: a ratio, not an absolute time). Before, the first batch
 * loaded the build's batch graph and each of the eight waited for it (on the 0.5B: 6.1 s against
 * 1.0 s for a later burst; on the 1.5B, 20 s each); and each of them read the new question's
 * content-free prior again (now once: Engine.prior). The small deployment (the 0.5B); batching as
 * the server runs it.
 *
 * Not one request's time: eight requests are eight passes' worth of work, which batching on 2 cores
 * runs at 1.1-1.55x the throughput of one at a time, so eight take about 7x one (logged, not asserted).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { EnginePipeline } from "../../src/pipeline/index.js";
import { ask, smallDeployment, startEngine } from "./engine.js";

/** The first burst against a later one: 1.2-1.5x measured (the first runs of the batch graph's shapes); 6x before. */
const BOUND = 2.5;

const burst = (round: string) => Array.from({ length: 8 }, (_, i) => `${round} message ${i}: the parcel is late again, and nobody answers the phone.`);
const QUESTION = { topic: { type: "choice" as const, instructions: "What is it about?", criteria: { delivery: null, billing: null, product: null } } };

let engine: EnginePipeline | undefined;

beforeAll(async () => {
  engine = await startEngine({ ...smallDeployment(), ASSAY_BATCH_PRELOAD: "0" });
  await engine.preloadForServing();
}, 300_000);

afterAll(async () => {
  await engine?.close();
});

describe("right after readiness", () => {
  it("a burst of 8 small requests finishes in about the time a later burst takes", async () => {
    const time = async (states: string[]) => {
      const t0 = performance.now();
      const out = await Promise.all(states.map((s) => ask(engine!, s, QUESTION, "vendor/judge-9B")));
      expect(out.every((a) => a.answers.topic?.type === "choice")).toBe(true);
      return performance.now() - t0;
    };
    const first = await time(burst("First"));
    const later = await time(burst("Later"));
    const oneMs = await time(["Alone: my invoice shows a charge I do not recognise."]);
    console.log(`[ready-burst] first burst of 8 ${first.toFixed(0)} ms, a later one ${later.toFixed(0)} ms, one request alone ${oneMs.toFixed(0)} ms`);
    expect(first / later).toBeLessThanOrEqual(BOUND);
  }, 300_000);
});
