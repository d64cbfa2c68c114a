import type { InferTask, TestFault } from "./protocol.js";

/**
 * TEST ONLY: what lets a test drive the pool from outside (fault injection,
 * ASSAY_TEST_FAULTS=1; the waits on a worker and on the queue). Not on the
 * pool's own surface: a test, and POST /__test/faults (http/ops.ts,
 * FaultInjector), reach a pool's hooks with `testHooks(pool)`. The pool
 * calls the `arm…` and `…ed` methods as its tasks pass.
 */

/** Resolves once `counter[0]` reaches `n`; Atomics.waitAsync leaves the main thread's event loop free meanwhile. */
async function untilCount(counter: Int32Array, n: number): Promise<void> {
  // (every supported Node has it; TypeScript types it from lib es2024 only.)
  const waitAsync = (Atomics as unknown as { waitAsync(a: Int32Array, i: number, v: number): { value: Promise<string> | string } }).waitAsync;
  for (let v = Atomics.load(counter, 0); v < n; v = Atomics.load(counter, 0)) await waitAsync(counter, 0, v).value;
}

/** What the hooks read of their pool. */
export interface HookedPool {
  readonly laneCount: number;
  /** Inference tasks waiting for a worker, over all lanes. */
  readonly queued: number;
}

export class TestHooks {
  private nextFault: TestFault | null = null;
  /** untilWorkerEntersForTest: the counter the next task of each kind carries (TestEntered). */
  private readonly nextEntered: { load: Int32Array | null; infer: Int32Array | null } = { load: null, infer: null };
  /** untilQueuedForTest's callers, each waiting for `n` queued tasks. */
  private queuedWaiters: { n: number; resolve: () => void }[] = [];
  /** Releases of the stall faults not yet let go: close() lets them go, so it does not wait out its bound on a test's stall. */
  private readonly stalls = new Set<() => void>();

  constructor(
    /** ASSAY_TEST_FAULTS=1: faults and worker waits are allowed. */
    private readonly enabled: boolean,
    private readonly pool: HookedPool,
  ) {}

  /**
   * TEST ONLY (ASSAY_TEST_FAULTS=1, refused otherwise): the next infer task
   * carries `fault` (see TestFault). For `stall`, returns the function that
   * lets the stalled task go on.
   */
  injectFaultForTest(kind: TestFault["kind"]): () => void {
    if (!this.enabled) throw new Error("fault injection is off: start with ASSAY_TEST_FAULTS=1 (tests only)");
    if (kind !== "stall") {
      this.nextFault = { kind };
      return () => {};
    }
    const flag = new Int32Array(new SharedArrayBuffer(4));
    this.nextFault = { kind, flag };
    const release = () => {
      Atomics.store(flag, 0, 1);
      Atomics.notify(flag, 0);
      this.stalls.delete(release);
    };
    this.stalls.add(release);
    return release;
  }

  /**
   * TEST ONLY (ASSAY_TEST_FAULTS=1, refused otherwise): resolves once the worker has reached
   * onnxruntime's native call in the next task of `kind` (a load on every lane: InferenceSession.create;
   * a pass: its run), so that a test can act while native code holds the worker thread.
   */
  untilWorkerEntersForTest(kind: "load" | "infer"): Promise<void> {
    if (!this.enabled) throw new Error("fault injection is off: start with ASSAY_TEST_FAULTS=1 (tests only)");
    const counter = new Int32Array(new SharedArrayBuffer(4));
    this.nextEntered[kind] = counter;
    return untilCount(counter, kind === "load" ? this.pool.laneCount : 1);
  }

  /**
   * TEST ONLY: resolves once `n` inference tasks wait in the lanes' queues at the same time, so that a
   * test holding a lane with a stalled pass knows the passes it sent have queued behind it.
   */
  untilQueuedForTest(n: number): Promise<void> {
    if (this.pool.queued >= n) return Promise.resolve();
    return new Promise((resolve) => this.queuedWaiters.push({ n, resolve }));
  }

  /** The pool's side: an infer task takes the fault and the counter armed for it, if any. */
  armInfer(task: InferTask): void {
    if (this.nextFault) {
      task.testFault = this.nextFault;
      this.nextFault = null;
    }
    if (this.nextEntered.infer) {
      task.testEntered = this.nextEntered.infer;
      this.nextEntered.infer = null;
    }
  }

  /** The pool's side: the counter armed for the next load, if any (taken). */
  armLoad(): Int32Array | null {
    const entered = this.nextEntered.load;
    if (entered) this.nextEntered.load = null;
    return entered;
  }

  /** The pool's side: a task was queued. */
  queued(): void {
    if (this.queuedWaiters.length === 0) return;
    const queued = this.pool.queued;
    const ready = this.queuedWaiters.filter((w) => queued >= w.n);
    this.queuedWaiters = this.queuedWaiters.filter((w) => queued < w.n);
    for (const w of ready) w.resolve();
  }

  /** The pool's side, on close: every stall still held lets go. */
  releaseStalls(): void {
    for (const release of [...this.stalls]) release();
  }
}

const hooks = new WeakMap<object, TestHooks>();

/** The pool's side: `pool`'s hooks, for testHooks. */
export function attachTestHooks(pool: object, h: TestHooks): void {
  hooks.set(pool, h);
}

/** TEST ONLY: the hooks of an inference pool (InferencePool). */
export function testHooks(pool: object): TestHooks {
  const h = hooks.get(pool);
  if (!h) throw new Error("not an inference pool");
  return h;
}
