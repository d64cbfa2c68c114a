/**
 * Closing the inference pool while a worker creates an onnxruntime session.
 * A worker thread terminated inside InferenceSession.create throws a native
 * error through N-API and aborts the whole process ("terminate called after
 * throwing an instance of 'Napi::Error'"): it took down a CI run when a test's
 * app closed during the express worker's lazy load. close() lets loads under
 * way finish first. If it did not, this file's process would abort and the
 * run would report it failed.
 */
import path from "node:path";
import { describe, expect, it } from "vitest";
import { ROOT, loadConfig } from "../../src/config/index.js";
import { InferencePool } from "../../src/inference/pool.js";

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
