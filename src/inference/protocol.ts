import type { ExecutionProvider } from "../config/index.js";
import type { ErrorCode } from "../errors/catalogue.js";
import type { PackedTensors } from "./pack.js";

/** Thread protocol: typed plain data only (structured clone drops classes). */

export interface LaneOptions {
  provider: ExecutionProvider;
  /** The CUDA device of a CUDA lane (0 elsewhere). */
  deviceId: number;
  intraOpThreads: number;
  /**
   * onnxruntime's intra-op threads spin while they wait for work (its default). Off, they sleep:
   * about 9% slower on an idle machine's pass, and a short pass beside a long one (the express
   * worker) gets the cores sooner (docs/experiments/admission-and-fairness.md).
   */
  spinning: boolean;
  /** Fall back to the CPU provider when the GPU provider cannot start. */
  gpuFallbackCpu: boolean;
  /**
   * A lane that fell back to the CPU runs, in place of a build's GPU graph
   * file (`from`: `model.gpu.onnx`, or `model.s8s8.onnx` where a CUDA server
   * has no GPU graph), its sibling whose products this CPU runs exactly (`to`;
   * models/int8.ts, cpuInt8Products), where the build has it.
   */
  cpuGraph?: { from: string[]; to: string };
  /**
   * CPU: the nice value of this worker's thread, taken before it creates any session, so that
   * onnxruntime's threads inherit it. A lane's main worker runs above its express worker's 0. Absent: unchanged.
   */
  nice?: number;
  /**
   * ASSAY_BATCH_PRELOAD=1 with batching on, on a lane's main worker: a load also loads the build's batch
   * graph, so that the first batch does not wait for it.
   */
  batching?: boolean;
  /** Honour `testFault` on tasks (ASSAY_TEST_FAULTS=1 only); a worker without it ignores them. */
  testFaults?: boolean;
}

/**
 * Test-only faults, carried by one infer task (ASSAY_TEST_FAULTS=1):
 *   throw  the task fails as if onnxruntime threw          → 502, worker kept
 *   exit   the worker thread exits mid-task (a crash)       → 502, worker replaced
 *   stall  the task waits until `flag[0]` becomes non-zero  (Atomics; lets a test hold a lane busy)
 */
export type TestFault = { kind: "throw" } | { kind: "exit" } | { kind: "stall"; flag: Int32Array };

/**
 * Test-only (ASSAY_TEST_FAULTS=1), on a load or a pass: a shared counter the worker adds 1 to just
 * before onnxruntime's native call (a load's InferenceSession.create, a pass's run), where terminating the
 * thread would abort the process. A test that must act while native code holds the worker waits on
 * it (TestHooks.untilWorkerEntersForTest) rather than guessing how long the worker takes to get there.
 */
export interface TestEntered {
  testEntered?: Int32Array;
}

/** A build's key/value layout (manifest `kv`): `past_kv` / `present_kv` are [2, layers, kvHeads, tokens, headDim] float32. */
export interface KvLayout {
  layers: number;
  kvHeads: number;
  headDim: number;
}

/** Keys and values of a prefix's first `tokens` tokens, on shared memory: a worker reads them without a copy. */
export interface PrefixKv {
  data: Float32Array;
  tokens: number;
}

/**
 * For a build whose graph takes `past_kv` (format v3): the pass continues
 * `past` (none: an empty one), and the worker returns the keys and values of
 * the first `keep` prefix tokens (0: none) for the prefix cache.
 */
export interface KvTask {
  layout: KvLayout;
  past?: PrefixKv;
  keep: number;
}

export interface InferTask extends PackedTensors, TestEntered {
  kind: "infer";
  model: string;
  kv?: KvTask;
  testFault?: TestFault;
}

/**
 * Passes of several requests run as one (src/inference/batch.ts), on a build
 * whose graph takes segments (format v4: LoadOk.batches). Each part keeps
 * its own readout, continued keys and values, and kept prefix.
 */
export interface BatchTask {
  kind: "batch";
  model: string;
  parts: InferTask[];
}

export interface LoadTask extends TestEntered {
  kind: "load" | "unload";
  model: string;
  /** A load on a lane's main worker: also the build's batch graph, where it batches (the server's readiness). */
  batch?: boolean;
}

export type Task = InferTask | BatchTask | LoadTask;

export interface InferOk {
  ok: true;
  logprobs: Float32Array;
  /** Milliseconds inside session.run. */
  runMs: number;
  provider: string;
  /** The first `kv.keep` prefix tokens' keys and values, when asked for. */
  present?: PrefixKv;
}

export interface LoadOk {
  ok: true;
  loaded: boolean;
  provider: string;
  loadMs: number;
  /** The graph takes several requests' passes in one run (format v4: `segment`, `past_segment`). */
  batches: boolean;
}

/** A batch's result: one InferOk per part, in order (each part's `runMs` is the whole run's). */
export interface BatchOk {
  ok: true;
  parts: InferOk[];
  runMs: number;
  provider: string;
}

export interface TaskFailure {
  ok: false;
  code: ErrorCode;
  message: string;
}

export type TaskResult = InferOk | BatchOk | LoadOk | TaskFailure;
