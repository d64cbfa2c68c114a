import type { ErrorCode } from "../errors/catalogue.js";
import type { PackedTensors } from "./pack.js";

/** Thread protocol: typed plain data only (structured clone drops classes). */

export interface LaneOptions {
  provider: "cpu" | "cuda";
  deviceId: number;
  intraOpThreads: number;
  /** Fall back to the CPU provider when CUDA cannot start. */
  cudaFallbackCpu: boolean;
}

export interface InferTask extends PackedTensors {
  kind: "infer";
  model: string;
}

export interface LoadTask {
  kind: "load" | "unload";
  model: string;
}

export type Task = InferTask | LoadTask;

export interface InferOk {
  ok: true;
  logprobs: Float32Array;
  /** Milliseconds inside session.run. */
  runMs: number;
  provider: string;
}

export interface LoadOk {
  ok: true;
  loaded: boolean;
  provider: string;
  loadMs: number;
}

export interface TaskFailure {
  ok: false;
  code: ErrorCode;
  message: string;
}

export type TaskResult = InferOk | LoadOk | TaskFailure;
