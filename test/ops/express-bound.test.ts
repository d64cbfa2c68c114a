/**
 * What counts as a short pass follows the build (ASSAY_EXPRESS_MAX_TOKENS):
 * on the real engine behind the real app, a request of another organization
 * the size of the primary cell (a few hundred words, one 4-option question)
 * runs on the express worker beside a long pass, though its estimate is far
 * above ASSAY_EXPRESS_MAX_MS. With the bound in ms alone, such a request on
 * the 1.5B waited 30–40 s behind a flood's pass or was refused 529
 * (docs/experiments/admission-and-fairness.md). The ms bound is set to 1 here,
 * so only the token bound can send the request beside: the outcome does not
 * depend on how fast this machine is, nor on which build reads, so it runs on
 * the small deployment (test/engine/engine.ts, every name on the 0.5B), where
 * the long pass the request goes beside is a third as long on 2 cores.
 */
import { afterAll, beforeAll, expect, it } from "vitest";
import { testHooks } from "../../src/inference/test-hooks.js";
import type { EnginePipeline } from "../../src/pipeline/index.js";
import { smallDeployment } from "../engine/engine.js";
import { makeOpsApp, sample, startFaultyEngine, until, type OpsApp } from "./helpers.js";

let engine: EnginePipeline;
let t: OpsApp | null = null;

beforeAll(async () => {
  engine = await startFaultyEngine({ ...smallDeployment(), ASSAY_QUEUE_MAX: "64", ASSAY_MODEL_SCHEDULE: "never", ASSAY_EXPRESS_MAX_MS: "1", ASSAY_EXPRESS_MAX_TOKENS: "1024" });
});
afterAll(async () => {
  await t?.close();
  await engine?.close();
});

const WORDS = ["the", "parcel", "arrived", "late", "and", "the", "box", "was", "crushed", "so", "I", "called", "support"];
const text = (words: number, seed: number) => Array.from({ length: words }, (_, i) => WORDS[(i * 7 + seed) % WORDS.length]).join(" ");

it("a primary-cell-sized request of another organization runs beside a long pass, above ASSAY_EXPRESS_MAX_MS", async () => {
  const lb = engine.build("judge-latest");
  await engine.pool.preloadExpress(lb.build.onnxPath);
  const long = { model: "judge-latest", state: text(2_500, 1), questions: { late: { type: "noul", instructions: "The delivery was late." } } };
  const mid = {
    model: "judge-latest",
    state: `Mail: ${text(300, 2)}`,
    questions: { topic: { type: "choice", instructions: "What is the mail about?", criteria: { delivery: null, billing: null, product: null, account: null } } },
  };
  const midEst = engine.estimateGeneralMs(mid);
  const bound = engine.pool.costModel(lb.build.onnxPath).estimate({ tokens: 1024, prefix: 1024, branches: 0, width: 0 });
  // The premises: above the ms bound, within the token bound, and short beside the long pass.
  expect(midEst, `mid ${midEst} ms, the 1,024-token bound ${bound} ms`).toBeGreaterThan(1);
  expect(midEst).toBeLessThan(bound);
  expect(engine.estimateGeneralMs(long)).toBeGreaterThan(3 * midEst);

  t = await makeOpsApp(engine);
  const other = t.accounts.createKey("epsilon");
  const metrics = async () => (await t!.app.inject({ method: "GET", url: "/metrics" })).body;
  const before = sample(await metrics(), "assay_express_passes_total", {});
  const release = testHooks(engine.pool).injectFaultForTest("stall");
  const a = t.app.inject({ method: "POST", url: "/v1/systemone", headers: { authorization: `Bearer ${t.key}` }, payload: long });
  try {
    await until(() => engine.pool.running === 1, "the long request to reach the worker", { pending: a });
    // The long pass is held until released: the answer can only come from the express worker.
    const b = await t.app.inject({ method: "POST", url: "/v1/systemone", headers: { authorization: `Bearer ${other.key}` }, payload: mid });
    expect(b.statusCode, b.body).toBe(200);
    expect(sample(await metrics(), "assay_express_passes_total", {})).toBeGreaterThan(before);
  } finally {
    // Released and finished before the engine closes, whatever failed above.
    release();
    await a;
  }
  expect((await a).statusCode).toBe(200);
});
