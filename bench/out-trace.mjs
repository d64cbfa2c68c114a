// scratch: engine-level c8 trace of runs (not kept)
import { loadConfig } from "../dist/src/config/index.js";
import { EnginePipeline } from "../dist/src/pipeline/index.js";
import { Timings } from "../dist/src/pipeline/timings.js";
const env = { ...process.env, LOG_LEVEL: "silent", ASSAY_BATCH_PRELOAD: "1" };
const engine = await EnginePipeline.create(loadConfig(env));
const runs = [];
let t0 = performance.now();
engine.pool.onPassTimed = (model, shape, ms) => runs.push({ at: Math.round(performance.now() - t0), g: model.split("/").pop(), tokens: shape.tokens, ms: Math.round(ms) });
const S = ["parcel", "invoice", "jacket", "password", "subscription", "refund", "voucher", "delivery slot"];
const T = ["never arrived", "was charged twice", "is the wrong size", "stopped working", "was cancelled without notice", "is still pending", "cannot be applied", "was missed"];
const tickets = (n, o) => Array.from({ length: n }, (_, i) => `Ticket ${o + i}: my ${S[i % 8]} ${T[(i * 3) % 8]} (order ${70000 + 37 * i}).`);
const Q = { refund: { type: "noul", instructions: "Is the customer asking for money back?" } };
const post = (state) => engine.run({ model: "judge-latest", state, questions: Q }, { requestId: "x", orgId: "o", timings: new Timings() });
for (const s of tickets(2, 500)) await post(s);
const c = Number(process.argv[2] ?? 8);
for (const [label, conc] of [["c1", 1], [`c${c}`, c]]) {
  const jobs = tickets(24, label === "c1" ? 2000 : 3000);
  runs.length = 0; t0 = performance.now();
  let next = 0;
  await Promise.all(Array.from({ length: conc }, async () => { for (let i = next++; i < jobs.length; i = next++) await post(jobs[i]); }));
  const wall = performance.now() - t0;
  console.log(label, "wall", Math.round(wall), "ms, req/s", (24000 / wall).toFixed(2), "runs", runs.length, "sum run ms", runs.reduce((a, r) => a + r.ms, 0));
  console.log(runs.map((r) => `${r.at}:${r.g === "model.batch.onnx" ? "B" : "A"}${r.tokens}/${r.ms}`).join(" "));
}
await engine.close();
