/**
 * Closing the inference pool while a worker is inside onnxruntime: creating a
 * session, or running a pass (a drain's deadline cancels a request whose pass
 * runs on: onnxruntime-node cannot stop a run). A worker thread terminated
 * there throws a native error through N-API and aborts the whole process
 * ("terminate called after throwing an instance of 'Napi::Error'", exit 134):
 * it took down a CI run when a test's app closed during the express worker's
 * lazy load, and a server's shutdown past its drain deadline. close() lets
 * what the workers hold finish first. If it did not, this file's process
 * would abort and the run would report it failed.
 */
import path from "node:path";
import { describe, expect, it } from "vitest";
import { ROOT, loadConfig } from "../../src/config/index.js";
import { InferencePool } from "../../src/inference/pool.js";
import { Timings } from "../../src/pipeline/timings.js";
import type { RequestEnvelope } from "../../src/validate/schema.js";
import { startEngine } from "./engine.js";

const MODEL = path.join(ROOT, "models", "cache", "qwen2.5-coder-1.5b-instruct", "model.onnx");

describe("closing the pool during a model load", () => {
  it("waits for the load under way, then closes; the process lives on", async () => {
    const pool = new InferencePool(loadConfig({ ...process.env, LOG_LEVEL: "silent" }));
    const load = pool.setLoaded(MODEL, true);
    // Give the worker time to start, well inside the session's creation (seconds for the 1.5B build).
    await new Promise((r) => setTimeout(r, 300));
    await pool.close();
    // Still here, and the load was let finish rather than cut.
    const settled = await load.then(
      (r) => (r.every((x) => x.ok) ? "loaded" : "failed"),
      (e: unknown) => `rejected: ${String(e)}`,
    );
    expect(settled).toBe("loaded");
  });
});

describe("closing the pool during a pass", () => {
  it("lets the pass in the worker finish, fails the request as shut down (503), and the process lives on", async () => {
    const pipeline = await startEngine();
    // The small build, a state long enough that its pass outlasts the wait below on any machine here.
    const state = "The quarterly report describes revenue, costs and the outlook for the next year. ".repeat(60);
    const questions = Object.fromEntries(
      Array.from({ length: 8 }, (_, i) => [`q${i}`, { type: "choice", instructions: `Which area does paragraph ${i} concern?`, criteria: { revenue: null, costs: null, outlook: null, staff: null } }]),
    );
    let passEnded = 0;
    pipeline.pool.onPassTimed = () => (passEnded = performance.now());
    const request = pipeline.run({ model: "vendor/judge-9B", state, questions } as RequestEnvelope, { requestId: "close", orgId: "close", timings: new Timings() }).then(
      () => "answered",
      (e: unknown) => (e as { code?: string }).code ?? String(e),
    );
    // In the worker, and a moment into it.
    while (pipeline.pool.running === 0) await new Promise((r) => setTimeout(r, 20));
    await new Promise((r) => setTimeout(r, 200));
    const closing = performance.now();
    await pipeline.close();
    // The pass was in the worker when close began, and ended before the threads were terminated.
    expect(passEnded).toBeGreaterThan(closing);
    expect(await request).toBe("UNAVAILABLE");
  }, 300_000);
});

