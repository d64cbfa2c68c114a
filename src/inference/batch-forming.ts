import path from "node:path";
import fs from "node:fs";
import type { Config } from "../config/index.js";
import { metrics } from "../observability/metrics.js";
import { batchScores, batchShape, type CostModel, type PassShape } from "./cost.js";
import { batchGraphOf } from "./batch.js";
import type { Job, Lane } from "./jobs.js";
import type { BatchOk, InferTask } from "./protocol.js";

/**
 * Batch forming: which queued passes run together as one run of a build's
 * batch graph (batch.ts lays the run out, on the worker), within the batch's
 * token and pass limits and the attention bound, and the wait an idle lane
 * may take for a batch to form (ASSAY_BATCH_WAIT_MS).
 */

/** Attention heads of a build (hidden size / head size, from its manifest.json); 1 when unreadable, which only loosens the attention bound of a batch. */
function attentionHeads(model: string): number {
  try {
    const m = JSON.parse(fs.readFileSync(path.join(path.dirname(model), "manifest.json"), "utf8")) as { hidden_size?: number; kv?: { head_dim?: number } };
    const h = Number(m.hidden_size) / Number(m.kv?.head_dim);
    return Number.isFinite(h) && h >= 1 ? h : 1;
  } catch {
    return 1;
  }
}

/** What batch forming asks of the pool that composes it. */
export interface BatchHost {
  /** Whether `model`'s graph runs several requests' passes as one on every lane (LoadOk.batches). */
  batches(model: string): boolean;
  /** The live cost model of a model file: the batch graph has one of its own. */
  costModel(file: string): CostModel;
  /** The wait for a batch on `lane` is over: start what can start. */
  waited(lane: Lane): void;
}

export class BatchForming {
  private readonly batch: Config["batch"];
  private readonly maxPackedTokens: number;
  private readonly passAttentionBytes: number;
  /** Per model file: attention heads (hidden size / head size, from its manifest), for the attention bound of a batch. */
  private readonly heads = new Map<string, number>();

  constructor(
    config: Pick<Config, "batch" | "maxPackedTokens" | "passAttentionBytes">,
    private readonly host: BatchHost,
  ) {
    this.batch = config.batch;
    this.maxPackedTokens = config.maxPackedTokens;
    this.passAttentionBytes = config.passAttentionBytes;
  }

  /**
   * ASSAY_BATCH_WAIT_MS > 0: an idle lane with one short pass waiting holds it
   * that long for others to join (throughput over latency). Off by default: a
   * lone pass starts at once, and batches form from what waits while the lane
   * runs.
   */
  waitForBatch(lane: Lane, waited: boolean): boolean {
    if (lane.batchWait) return true;
    if (waited || this.batch.waitMs <= 0 || lane.system.length > 0 || lane.queue.length !== 1) return false;
    const only = [...lane.queue][0]!;
    if (!this.joins(only)) return false;
    lane.batchWait = setTimeout(() => {
      lane.batchWait = null;
      this.host.waited(lane);
    }, this.batch.waitMs);
    return true;
  }

  /** close(): the lane's wait for a batch, if any, ends without a dispatch. */
  cancel(lane: Lane): void {
    if (lane.batchWait) clearTimeout(lane.batchWait);
    lane.batchWait = null;
  }

  /** A pass that may run in a batch: an inference pass of a batching build, short enough (a quarter of the batch budget), without a test fault. */
  private joins(j: Job): boolean {
    return (
      j.task.kind === "infer" &&
      j.shape !== null &&
      j.task.testFault === undefined &&
      this.batch.maxPasses > 1 &&
      this.host.batches(j.task.model) &&
      4 * j.tokens <= this.batch.maxTokens
    );
  }

  /** A batched run's score tensors within ASSAY_PASS_ATTENTION_MB per layer. */
  private fitsAttention(model: string, parts: readonly PassShape[]): boolean {
    return this.passAttentionBytes <= 0 || 4 * this.headsOf(model) * batchScores(parts) <= this.passAttentionBytes;
  }

  private headsOf(model: string): number {
    let h = this.heads.get(model);
    if (h === undefined) {
      h = attentionHeads(model);
      this.heads.set(model, h);
    }
    return h;
  }

  /**
   * The run the lane takes next: `head` alone, or `head` with the waiting
   * passes of other requests on the same build that fit beside it (the fair
   * queue's order decides which: shiftFirst takes the organizations in order
   * of virtual time and charges each its pass), within ASSAY_BATCH_MAX_TOKENS,
   * the pass limit and the attention bound. A pass of a long request runs
   * alone, as before.
   */
  batchFrom(lane: Lane, head: Job): Job {
    if (!this.joins(head) || head.task.kind !== "infer") return head;
    const model = head.task.model;
    const budget = Math.min(this.batch.maxTokens, this.maxPackedTokens);
    const members = [head];
    const shapes = [head.shape!];
    let tokens = head.tokens;
    while (members.length < this.batch.maxPasses) {
      const fits = (j: Job) =>
        j.task.kind === "infer" && j.task.model === model && this.joins(j) && tokens + j.tokens <= budget && this.fitsAttention(model, [...shapes, j.shape!]);
      const next = lane.queue.shiftFirst(fits);
      if (!next) break;
      metrics.queueDepth.dec();
      members.push(next);
      shapes.push(next.shape!);
      tokens += next.tokens;
    }
    if (members.length === 1) return head;
    const parts = members.map((m) => m.task as InferTask);
    const shape = batchShape(shapes);
    const batch: Job = {
      task: { kind: "batch", model, parts },
      bounded: true,
      org: head.org,
      // The batch graph has a cost model of its own: its layout is not model.onnx's.
      cost: this.host.costModel(batchGraphOf(model)).estimate(shape),
      tokens: shape.tokens,
      shape,
      seq: head.seq,
      rank: head.rank,
      front: false,
      work: head.work,
      members,
      enqueuedAt: Math.min(...members.map((m) => m.enqueuedAt)),
      settled: false,
      // Each pass gets its own part; a failure is every pass's. A pass whose request hung up was settled already.
      resolve: (r) => {
        if (batch.settled) return;
        batch.settled = true;
        if (r.ok && "parts" in r) members.forEach((m, i) => m.resolve((r as BatchOk).parts[i]!));
        else for (const m of members) m.resolve(r);
      },
      reject: (e) => {
        if (batch.settled) return;
        batch.settled = true;
        for (const m of members) m.reject(e);
      },
      cleanup: () => {},
    };
    return batch;
  }
}
