import { AssayError } from "../errors/catalogue.js";
import { inSchedule, type Schedule } from "./schedule.js";

/**
 * Which model builds are loaded, for every family alike. `always` builds are
 * loaded at boot and kept; `scheduled` builds are kept loaded inside the
 * schedule, unloaded when idle outside it, and loaded on demand: a request
 * that needs one while it is not loaded starts the load and is answered 503
 * with the estimated seconds until ready, so nothing waits minutes on a
 * socket and nothing is charged.
 */
export interface ModelLoader {
  /** Loads or unloads the model file on every inference lane; resolves when done. */
  setLoaded(modelPath: string, loaded: boolean): Promise<{ loadMs: number }[]>;
  /** How long a load of the model file is expected to take, before this lifecycle has timed one. */
  estimateLoadMs(modelPath: string): number;
}

type State = "unloaded" | "loading" | "loaded";

interface Entry {
  build: string;
  path: string;
  availability: "always" | "scheduled";
  state: State;
  loading: Promise<void> | null;
  loadStartedAt: number;
  /** Last measured load, ms; before the first, estimated from the file size. */
  estimateMs: number;
  lastUsedAt: number;
  inFlight: number;
  lastError: string | null;
}

export interface LifecycleOptions {
  schedule: Schedule;
  idleUnloadMs: number;
  clock?: () => number;
  log?: (msg: string) => void;
  /** How often the schedule is checked. */
  tickMs?: number;
}

export class ModelLifecycle {
  private readonly entries = new Map<string, Entry>();
  private timer: NodeJS.Timeout | null = null;
  private readonly clock: () => number;
  private readonly log: (msg: string) => void;

  constructor(
    private readonly loader: ModelLoader,
    private readonly opts: LifecycleOptions,
  ) {
    this.clock = opts.clock ?? Date.now;
    this.log = opts.log ?? (() => {});
  }

  register(build: string, modelPath: string, availability: "always" | "scheduled"): void {
    this.entries.set(build, {
      build,
      path: modelPath,
      availability,
      state: "unloaded",
      loading: null,
      loadStartedAt: 0,
      estimateMs: this.loader.estimateLoadMs(modelPath),
      lastUsedAt: 0,
      inFlight: 0,
      lastError: null,
    });
  }

  private entry(build: string): Entry {
    const e = this.entries.get(build);
    if (!e) throw new Error(`model build "${build}" is not registered`);
    return e;
  }

  state(build: string): State {
    return this.entry(build).state;
  }

  /** Builds that boot must load before the service is ready. */
  bootBuilds(): string[] {
    return [...this.entries.values()]
      .filter((e) => e.availability === "always" || inSchedule(this.opts.schedule, new Date(this.clock())))
      .map((e) => e.build);
  }

  /** Starts (or joins) a load; resolves when loaded, rejects when the load fails. */
  load(build: string): Promise<void> {
    const e = this.entry(build);
    if (e.state === "loaded") return Promise.resolve();
    if (e.loading) return e.loading;
    e.state = "loading";
    e.loadStartedAt = this.clock();
    this.log(`model build ${build}: loading`);
    e.loading = this.loader.setLoaded(e.path, true).then(
      (lanes) => {
        e.state = "loaded";
        e.loading = null;
        e.lastError = null;
        e.lastUsedAt = this.clock();
        e.estimateMs = Math.max(...lanes.map((l) => l.loadMs), this.clock() - e.loadStartedAt);
        this.log(`model build ${build}: loaded in ${Math.round(e.estimateMs)} ms`);
      },
      (err: unknown) => {
        e.state = "unloaded";
        e.loading = null;
        e.lastError = err instanceof Error ? err.message : String(err);
        this.log(`model build ${build}: load failed: ${e.lastError}`);
        throw err;
      },
    );
    return e.loading;
  }

  async unload(build: string): Promise<void> {
    const e = this.entry(build);
    if (e.state !== "loaded" || e.inFlight > 0) return;
    e.state = "unloaded";
    this.log(`model build ${build}: unloading (idle outside its schedule)`);
    await this.loader.setLoaded(e.path, false);
  }

  /** Seconds until a build that is loading (or about to) should be ready. */
  retryAfterSeconds(build: string): number {
    const e = this.entry(build);
    const elapsed = e.state === "loading" ? this.clock() - e.loadStartedAt : 0;
    return Math.max(1, Math.ceil((e.estimateMs - elapsed) / 1000));
  }

  /**
   * The request needs `build` now. Loaded: counts the request as a user until
   * `release` is called. Not loaded: starts loading it and throws 503 with
   * Retry-After. Callers check this before any charge is made.
   */
  acquire(build: string, forModel: string): () => void {
    const e = this.entry(build);
    if (e.state !== "loaded") {
      const failed = e.state === "unloaded" ? e.lastError : null;
      this.load(build).catch(() => {
        // Logged in load(); the next request retries.
      });
      const secs = this.retryAfterSeconds(build);
      throw new AssayError(
        "MODEL_STARTING",
        `model "${forModel}" needs model build ${build}, which is starting` +
          (failed ? ` (the previous load failed: ${failed})` : "") +
          `; retry in about ${secs} s`,
        secs,
      );
    }
    e.inFlight++;
    e.lastUsedAt = this.clock();
    let released = false;
    return () => {
      if (released) return;
      released = true;
      e.inFlight--;
      e.lastUsedAt = this.clock();
    };
  }

  /** Applies the schedule once: load what should be loaded, unload what idled out. */
  async tick(): Promise<void> {
    const now = this.clock();
    const on = inSchedule(this.opts.schedule, new Date(now));
    for (const e of this.entries.values()) {
      if (e.availability !== "scheduled") continue;
      if (on && e.state === "unloaded") {
        await this.load(e.build).catch(() => {});
      } else if (!on && e.state === "loaded" && e.inFlight === 0 && now - e.lastUsedAt >= this.opts.idleUnloadMs) {
        await this.unload(e.build);
      }
    }
  }

  start(): void {
    if (this.timer) return;
    this.timer = setInterval(() => void this.tick().catch(() => {}), this.opts.tickMs ?? 15_000);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
  }
}
