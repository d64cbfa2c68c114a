/**
 * The main worker's nice value (ASSAY_MAIN_WORKER_NICE): on Linux a nice value
 * belongs to a thread, and it reaches onnxruntime's threads only because they
 * inherit it from the worker thread that creates the session. Read back from
 * /proc: the main worker and its onnxruntime threads at the setting, the
 * express worker's at 0, and nothing changed with the setting at 0.
 */
import fs from "node:fs";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { ROOT, loadConfig } from "../../src/config/index.js";
import { InferencePool } from "../../src/inference/pool.js";

const MODEL = path.join(ROOT, "models", "cache", "qwen2.5-coder-0.5b-instruct", "model.onnx");

/** Nice values of this process's threads (field 19 of /proc/self/task/TID/stat). */
function niceOfThreads(): number[] {
  const out: number[] = [];
  for (const tid of fs.readdirSync("/proc/self/task")) {
    let stat: string;
    try {
      stat = fs.readFileSync(`/proc/self/task/${tid}/stat`, "utf8");
    } catch {
      continue; // the thread ended meanwhile
    }
    // The command name may hold spaces: the fields after it start at the last ')'.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    out.push(Number(fields[16]));
  }
  return out;
}

const count = (nice: number) => niceOfThreads().filter((n) => n === nice).length;

let pool: InferencePool | null = null;
afterEach(async () => {
  await pool?.close();
  pool = null;
});

describe.runIf(process.platform === "linux")("the main worker's nice value", () => {
  it("the main worker and the onnxruntime threads it starts run at the setting; the express worker's do not", async () => {
    const config = loadConfig({ ...process.env, LOG_LEVEL: "silent", ASSAY_EXECUTION_PROVIDER: "cpu", ASSAY_EXPRESS_MAX_MS: "1500", ASSAY_MAIN_WORKER_NICE: "7" });
    expect(count(7)).toBe(0);
    pool = new InferencePool(config);
    expect((await pool.setLoaded(MODEL, true)).every((r) => r.ok)).toBe(true);
    // The worker thread itself and at least one onnxruntime intra-op thread (2 threads: the caller is the other).
    const main = count(7);
    expect(main).toBeGreaterThanOrEqual(config.intraOpThreads);
    await pool.preloadExpress(MODEL);
    // The express worker and its session's threads added none.
    expect(count(7)).toBe(main);
  });

  it("0 leaves every thread as it was", async () => {
    const before = niceOfThreads().filter((n) => n !== 0).length;
    pool = new InferencePool(loadConfig({ ...process.env, LOG_LEVEL: "silent", ASSAY_EXECUTION_PROVIDER: "cpu", ASSAY_EXPRESS_MAX_MS: "1500", ASSAY_MAIN_WORKER_NICE: "0" }));
    expect((await pool.setLoaded(MODEL, true)).every((r) => r.ok)).toBe(true);
    expect(niceOfThreads().filter((n) => n !== 0).length).toBe(before);
  });
});
