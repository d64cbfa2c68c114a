/**
 * Closing the inference pool while a worker is inside onnxruntime: creating an
 * InferenceSession, or running a pass (a drain's deadline cancels a request whose pass
 * runs on: onnxruntime-node cannot stop a run). A worker thread terminated
 * there throws a native error through N-API and aborts the whole process
 * ("terminate called after throwing an instance of 'Napi::Error'", exit 134):
 * it took down a CI run when a test's app closed during the express worker's
 * lazy load, and a server's shutdown past its drain deadline. close() lets
 * what the workers hold finish first. If it did not, this file's process
 * would abort and the run would report it failed.
 *
 * Each test closes once the worker has reached onnxruntime's native call
 * (untilWorkerEntersForTest, ASSAY_TEST_FAULTS=1), not after a sleep: on a
 * busy machine a sleep can end before the worker gets there (the test then
 * passes without closing inside native code), and past a short pass, after
 * the pass has ended.
 */
import path from "node:path";
import { describe, expect, it, vi } from "vitest";
import { ROOT, loadConfig } from "../../src/config/index.js";
import { InferencePool } from "../../src/inference/pool.js";
import { testHooks } from "../../src/inference/test-hooks.js";
import { Timings } from "../../src/pipeline/timings.js";
import type { RequestEnvelope } from "../../src/validate/schema.js";
import { smallDeployment, startEngine } from "./engine.js";

const MODEL = path.join(ROOT, "models", "cache", "qwen2.5-coder-0.5b-instruct", "model.onnx");

/**
 * The main worker at the express worker's priority (ASSAY_MAIN_WORKER_NICE=0). At the default nice 10 it
 * gets about a tenth of a core beside other busy processes, and its task then outlasts close()'s bound
 * (TASK_DRAIN_MS, 60 s), past which close terminates the worker anyway: beside two busy loops on 2 cores
 * the 0.5B's load went past it, against 5 s at nice 0. This file tests the wait, not the bound.
 */
const ENV = { LOG_LEVEL: "silent", ASSAY_TEST_FAULTS: "1", ASSAY_MAIN_WORKER_NICE: "0" };

describe("closing the pool during a model load", () => {
  it("waits for the load under way, then closes; the process lives on", async () => {
    const pool = new InferencePool(loadConfig({ ...process.env, ...ENV }));
    const creating = testHooks(pool).untilWorkerEntersForTest("load");
    let loadEnded = 0;
    const load = pool.setLoaded(MODEL, true).then(
      (r) => (r.every((x) => x.ok) ? "loaded" : "failed"),
      (e: unknown) => `rejected: ${String(e)}`,
    );
    void load.then(() => (loadEnded = performance.now()));
    // The worker is inside InferenceSession.create: native code, for a second or more.
    await creating;
    const closing = performance.now();
    await pool.close();
    // Still here, and the load was let finish rather than cut: it was under way when close began.
    expect(await load).toBe("loaded");
    expect(loadEnded).toBeGreaterThan(closing);
  });
});

describe("closing the pool during a pass", () => {
  it("lets the pass in the worker finish, fails the request as shut down (503), and the process lives on", async () => {
    const pipeline = await startEngine({ ...smallDeployment(), ...ENV });
    // A state long enough that its pass outlasts, by far, the main thread's wake-up below.
    const state = "The quarterly report describes revenue, costs and the outlook for the next year. ".repeat(60);
    const questions = Object.fromEntries(
      Array.from({ length: 8 }, (_, i) => [`q${i}`, { type: "choice", instructions: `Which area does paragraph ${i} concern?`, criteria: { revenue: null, costs: null, outlook: null, staff: null } }]),
    );
    let passEnded = 0;
    pipeline.pool.onPassTimed = () => (passEnded = performance.now());
    // The request's long pass, the one whose prefix holds the state (a short one may come first: the build's
    // preamble, a content-free prior): the spy arms the seam just before that pass is queued.
    const infer = pipeline.pool.infer.bind(pipeline.pool);
    const running = new Promise<void>((resolve, reject) => {
      vi.spyOn(pipeline.pool, "infer").mockImplementation((model, packed, signal, kv) => {
        // Tokens before the question blocks (slotOf: one per token after the prefix): about 960 of the state here.
        if (packed.inputIds.length - packed.slotOf.length >= 500) testHooks(pipeline.pool).untilWorkerEntersForTest("infer").then(resolve, reject);
        return infer(model, packed, signal, kv);
      });
    });
    const request = pipeline.run({ model: "vendor/judge-9B", state, questions } as RequestEnvelope, { requestId: "close", orgId: "close", timings: new Timings() }).then(
      () => "answered",
      (e: unknown) => (e as { code?: string }).code ?? String(e),
    );
    // In the worker, inside onnxruntime's run.
    await running;
    expect(pipeline.pool.running).toBe(1);
    const closing = performance.now();
    await pipeline.close();
    // The pass was in the worker when close began, and ended before the threads were terminated.
    expect(passEnded).toBeGreaterThan(closing);
    expect(await request).toBe("UNAVAILABLE");
  }, 300_000);
});

