import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { workerData } from "node:worker_threads";
import ort from "onnxruntime-node";
import { explainCudaFailure } from "./cuda.js";
import { BATCH_LAYOUT, batchGraphOf, joinPasses, partLogprobs, partPresent, type BatchPart } from "./batch.js";
import type { BatchTask, InferTask, KvTask, LaneOptions, PrefixKv, Task, TaskResult, TestEntered } from "./protocol.js";

/**
 * Piscina worker: owns one onnxruntime session per model file. session.run
 * does its native work on the calling thread, which is why inference lives
 * here and never on the event loop.
 */
const lane = workerData as LaneOptions;
// On Linux a nice value belongs to a thread (setpriority on 0 is the calling thread), and the threads
// onnxruntime starts for a session inherit it from the thread that creates the session. Raising it needs no privilege.
if (lane.nice) {
  try {
    os.setPriority(0, lane.nice);
  } catch (e) {
    console.error(`[assay] could not set the inference worker's nice value to ${lane.nice}: ${String(e)}`);
  }
}
const sessions = new Map<string, Promise<{ session: ort.InferenceSession; provider: string }>>();

async function create(model: string): Promise<{ session: ort.InferenceSession; provider: string }> {
  const common: ort.InferenceSession.SessionOptions = {
    intraOpNumThreads: lane.intraOpThreads,
    interOpNumThreads: 1,
    graphOptimizationLevel: "all",
    // Masked attention scores underflow to denormals in softmax, which run
    // ~3x slower on x86; flushing them to zero cut softmax time from 470 to
    // 150 ms per 740-token pass (see docs/experiments/latency-and-throughput.md).
    extra: { session: { set_denormal_as_zero: "1", "intra_op.allow_spinning": lane.spinning ? "1" : "0" } },
  };
  let file = model;
  if (lane.provider !== "cpu" && !fellBack) {
    const device = lane.provider === "cuda" ? `cuda:${lane.deviceId}` : "webgpu";
    try {
      const session = await ort.InferenceSession.create(model, {
        ...common,
        executionProviders: [lane.provider === "cuda" ? { name: "cuda", deviceId: lane.deviceId } : { name: "webgpu" }],
      });
      return { session, provider: device };
    } catch (e) {
      const why = await gpuFailure(e);
      if (!lane.gpuFallbackCpu) throw new Error(why);
      // One line per lane: the lane's other graphs go to the CPU without asking the GPU again.
      fellBack = true;
      console.error(`[assay] ${why}; falling back to CPU as configured (ASSAY_GPU_FALLBACK_CPU=1)`);
    }
  }
  if (fellBack) file = cpuGraphOf(model);
  const session = await ort.InferenceSession.create(file, { ...common, executionProviders: ["cpu"] });
  return { session, provider: "cpu" };
}

/** Whether this lane's GPU provider failed and it runs on the CPU (ASSAY_GPU_FALLBACK_CPU=1). */
let fellBack = false;

/** Why the lane's GPU provider could not start, in one line; for CUDA, the cause onnxruntime printed (cuda.ts). */
async function gpuFailure(e: unknown): Promise<string> {
  // onnxruntime's messages end in a newline, some hold several: one line in the log.
  const message = (e instanceof Error ? e.message : String(e)).trim().replace(/\s*\n\s*/g, " ");
  if (lane.provider !== "cuda") return `WebGPU execution provider could not start (no usable Vulkan adapter?): ${message}`;
  const cause = await explainCudaFailure(lane.deviceId);
  const what = `CUDA execution provider could not start on device ${lane.deviceId}`;
  if (!cause) return `${what}: ${message}`;
  return message.length <= 160 ? `${what}: ${cause} (onnxruntime: ${message})` : `${what}: ${cause}`;
}

/** The graph a lane that fell back from its GPU provider runs (LaneOptions.cpuGraph). */
function cpuGraphOf(model: string): string {
  if (!lane.cpuGraph || !lane.cpuGraph.from.includes(path.basename(model))) return model;
  const sibling = path.join(path.dirname(model), lane.cpuGraph.to);
  return fs.existsSync(sibling) ? sibling : model;
}

function session(model: string) {
  let s = sessions.get(model);
  if (!s) {
    s = create(model);
    sessions.set(model, s);
    s.catch(() => sessions.delete(model));
  }
  return s;
}

/** Test-only (ASSAY_TEST_FAULTS=1): see TestFault in protocol.ts. Runs after the session exists, i.e. mid-request. */
async function injectFault(t: InferTask): Promise<void> {
  const f = t.testFault;
  if (!f || !lane.testFaults) return;
  if (f.kind === "throw") throw new Error("injected test fault: the model threw");
  if (f.kind === "exit") process.exit(70); // in a worker thread this ends the thread only
  // waitAsync keeps this thread's event loop free, so piscina can still terminate it at close.
  // (every supported Node has it; TypeScript types it from lib es2024 only.)
  const waitAsync = (Atomics as unknown as { waitAsync(a: Int32Array, i: number, v: number): { value: Promise<string> | string } }).waitAsync;
  while (Atomics.load(f.flag, 0) === 0) await waitAsync(f.flag, 0, 0).value;
}

/** Test-only (ASSAY_TEST_FAULTS=1): see TestEntered in protocol.ts. */
function entering(t: TestEntered): void {
  if (!t.testEntered || !lane.testFaults) return;
  Atomics.add(t.testEntered, 0, 1);
  Atomics.notify(t.testEntered, 0);
}

/**
 * onnxruntime-node refuses a tensor on shared memory ("Invalid argument"), so
 * a cached prefix's keys and values are copied here, on the worker's thread.
 * Into a buffer this worker keeps: a fresh 115 MB array (a 2,000-token state
 * of the 1.5B build) cost 60–430 ms in page faults and collection, against
 * 11 ms to copy into memory already touched (docs/experiments/prefix-cache.md).
 * A worker runs one task at a time (piscina's concurrentTasksPerWorker 1) and
 * onnxruntime does not hold a feed past `run`, so one buffer serves every
 * pass. Prefixes above SCRATCH_MAX_BYTES get a fresh array, so that one long
 * state does not pin its size for the worker's life.
 */
const SCRATCH_MAX_BYTES = 256 * 1024 * 1024;
let scratch: Float32Array | undefined;

function unshared(src: Float32Array): Float32Array {
  if (src.byteLength > SCRATCH_MAX_BYTES) return new Float32Array(src);
  if (!scratch || scratch.length < src.length) scratch = new Float32Array(src.length);
  const view = scratch.subarray(0, src.length);
  view.set(src);
  return view;
}

/** Whether `model` has a batch graph of the layout joinPasses builds (the build's manifest says which it was written for). */
function batches(model: string): boolean {
  if (!fs.existsSync(batchGraphOf(model))) return false;
  try {
    const manifest = JSON.parse(fs.readFileSync(path.join(path.dirname(model), "manifest.json"), "utf8")) as { batch_layout?: unknown };
    return manifest.batch_layout === BATCH_LAYOUT;
  } catch {
    return false;
  }
}

async function infer(t: InferTask): Promise<TaskResult> {
  const { session: s, provider } = await session(t.model);
  await injectFault(t);
  const T = t.inputIds.length;
  const feeds: Record<string, ort.Tensor> = {
    input_ids: new ort.Tensor("int64", t.inputIds, [T]),
    position_ids: new ort.Tensor("int64", t.positionIds, [T]),
    subtree_end: new ort.Tensor("int64", t.subtreeEnd, [T]),
    gather_idx: new ort.Tensor("int64", t.gatherIdx, [t.rows]),
    target_ids: new ort.Tensor("int64", t.targetIds, [t.rows, t.width]),
    branch_slots: new ort.Tensor("int64", t.branchSlots, [t.branches, t.branchWidth]),
    slot_of: new ort.Tensor("int64", t.slotOf, [t.slotOf.length]),
  };
  const kv = t.kv;
  if (kv) {
    const { layers, kvHeads, headDim } = kv.layout;
    const past = kv.past ?? { data: new Float32Array(0), tokens: 0 };
    const data = past.data.buffer instanceof SharedArrayBuffer ? unshared(past.data) : past.data;
    feeds.past_kv = new ort.Tensor("float32", data, [2, layers, kvHeads, past.tokens, headDim]);
  }
  const fetches = kv && kv.keep > 0 ? ["logprobs", "present_kv"] : ["logprobs"];
  entering(t);
  const start = performance.now();
  const out = await s.run(feeds, fetches);
  const runMs = performance.now() - start;
  const lp = out.logprobs;
  if (!lp) throw new Error("model returned no logprobs output");
  // Copy: the tensor's buffer belongs to onnxruntime.
  const result = { ok: true as const, logprobs: Float32Array.from(lp.data as Float32Array), runMs, provider };
  const present = out.present_kv;
  return kv && present ? { ...result, present: keepPrefix(present, kv) } : result;
}

/**
 * Several requests' passes in one run of the build's batch graph
 * (src/inference/batch.ts). The pasts are concatenated into the worker's
 * scratch memory (onnxruntime-node refuses a tensor on shared memory anyway,
 * `unshared`); each kept prefix is copied once into shared memory, as a lone
 * pass's is.
 */
async function inferBatch(t: BatchTask): Promise<TaskResult> {
  const { session: s, provider } = await session(batchGraphOf(t.model));
  const layout = t.parts.find((p) => p.kv)?.kv?.layout ?? null;
  if (!layout) throw new Error(`${t.model}: a batch needs the build's key/value layout (export format v3)`);
  const parts: BatchPart[] = t.parts.map((p) => ({ ...p, ...(p.kv?.past ? { past: p.kv.past } : {}), keep: p.kv?.keep ?? 0 }));
  const pastFloats = [...new Set(parts.flatMap((p) => (p.past ? [p.past.data] : [])))].reduce((n, d) => n + d.length, 0);
  const fits = pastFloats * 4 <= SCRATCH_MAX_BYTES;
  if (fits && (!scratch || scratch.length < pastFloats)) scratch = new Float32Array(pastFloats);
  const j = joinPasses(parts, layout, fits ? scratch : undefined);
  const T = j.inputIds.length;
  const i64 = (a: BigInt64Array, dims: number[]) => new ort.Tensor("int64", a, dims);
  const f32 = (a: Float32Array, dims: number[]) => new ort.Tensor("float32", a, dims);
  const feeds: Record<string, ort.Tensor> = {
    input_ids: i64(j.inputIds, [T]),
    position_ids: i64(j.positionIds, [T]),
    gather_idx: i64(j.gatherIdx, [j.rows]),
    target_ids: i64(j.targetIds, [j.rows, j.width]),
    past_kv: f32(j.past, [2, layout.layers, layout.kvHeads, j.pastTokens, layout.headDim]),
    pre_rows: i64(j.preRows, [j.n, j.sm]),
    pre_keys: i64(j.preKeys, [j.n, j.km]),
    pre_bias: f32(j.preBias, [j.n, j.sm, j.km]),
    br_rows: i64(j.brRows, [j.n, j.bm, j.lm]),
    br_bias: f32(j.brBias, [j.n, j.bm, j.lm, j.km + j.lm]),
    row_cols: i64(j.rowCols, [j.n, j.bm, j.lm, j.km + j.lm]),
    blk_cols: i64(j.blkCols, [j.n, j.bm, j.lm, j.lm]),
    pref_keep: f32(j.prefKeep, [j.n, j.km]),
    row_src: i64(j.rowSrc, [T]),
  };
  const keeping = parts.some((p) => p.keep > 0);
  for (const p of t.parts) entering(p);
  const start = performance.now();
  const out = await s.run(feeds, keeping ? ["logprobs", "present_kv"] : ["logprobs"]);
  const runMs = performance.now() - start;
  const lp = out.logprobs?.data as Float32Array | undefined;
  if (!lp) throw new Error("model returned no logprobs output");
  const present = keeping ? (out.present_kv?.data as Float32Array | undefined) : undefined;
  const { headDim } = layout;
  const results = parts.map((p, r) => {
    const res = { ok: true as const, logprobs: partLogprobs(j, parts, r, lp), runMs, provider };
    if (!present || p.keep <= 0) return res;
    const keep = Math.min(p.keep, (p.past?.tokens ?? 0) + p.inputIds.length - p.slotOf.length);
    const kept = new Float32Array(new SharedArrayBuffer(2 * layout.layers * layout.kvHeads * keep * headDim * 4));
    return { ...res, present: partPresent(j, parts, r, present, layout, kept) };
  });
  return { ok: true, parts: results, runMs, provider };
}

/**
 * The first `keep` tokens of present_kv [2, layers, kvHeads, tokens, headDim],
 * copied once into shared memory: the main thread caches it and later tasks
 * hand it to any worker without another copy.
 */
function keepPrefix(present: ort.Tensor, kv: KvTask): PrefixKv {
  const src = present.data as Float32Array;
  const tokens = Number(present.dims[3]);
  const keep = Math.min(kv.keep, tokens);
  const { headDim } = kv.layout;
  const blocks = src.length / (tokens * headDim);
  const data = new Float32Array(new SharedArrayBuffer(blocks * keep * headDim * 4));
  for (let b = 0; b < blocks; b++) data.set(src.subarray(b * tokens * headDim, (b * tokens + keep) * headDim), b * keep * headDim);
  return { data, tokens: keep };
}

export default async function run(task: Task): Promise<TaskResult> {
  try {
    switch (task.kind) {
      case "infer":
        return await infer(task);
      case "batch":
        return await inferBatch(task);
      case "load": {
        const start = performance.now();
        entering(task);
        const { provider } = await session(task.model);
        const batching = lane.provider === "cpu" && batches(task.model);
        // The batch graph loads with its build where asked (ASSAY_BATCH_PRELOAD=1, or the server's readiness:
        // task.batch), and the first batch then waits for nothing (the 1.5B's load took seconds on 2 cores);
        // otherwise on the first batch, so that an offline tool or a test that never batches spends neither
        // the load nor the memory.
        if (batching && (lane.batching || task.batch)) await session(batchGraphOf(task.model));
        return { ok: true, loaded: true, provider, loadMs: performance.now() - start, batches: batching };
      }
      case "unload": {
        for (const file of [task.model, batchGraphOf(task.model)]) {
          const s = sessions.get(file);
          sessions.delete(file);
          if (s) await (await s).session.release();
        }
        return { ok: true, loaded: false, provider: lane.provider, loadMs: 0, batches: false };
      }
    }
  } catch (e) {
    return { ok: false, code: "MODEL_FAILED", message: e instanceof Error ? e.message : String(e) };
  }
}
