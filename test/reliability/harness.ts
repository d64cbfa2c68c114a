/**
 * What the reliability suite shares: the form it runs in (CI or full), a real
 * server process (`node dist/src/main.js`, the real model) whose whole
 * stdout/stderr is kept for the log checks, an HTTP client that never throws
 * on a status, and small request bodies (a sentence of state, one or two
 * questions: ~0.2–0.5 s each on 2 CPU cores).
 *
 *   ASSAY_RELIABILITY=full   10-minute load and overload, 10,000 fuzz cases (npm run reliability)
 *   unset                    the short CI form (npm test)
 */
import { spawn, type ChildProcess } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { expect } from "vitest";
import { ROOT } from "../../src/config/index.js";

export const FULL = process.env.ASSAY_RELIABILITY === "full";
export const FORM = FULL ? "full" : "ci";

/** Durations and case counts of each form. */
export const FIGURES = {
  /** The load test's sending time, seconds. */
  loadSeconds: Number(process.env.ASSAY_RELIABILITY_LOAD_SECONDS ?? (FULL ? 600 : 30)),
  /** Property-based cases over bodies, headers and content types. */
  fuzzCases: Number(process.env.ASSAY_RELIABILITY_FUZZ_CASES ?? (FULL ? 10_000 : 500)),
  /** Seconds of load before the server is SIGKILLed. */
  loadBeforeKillSeconds: FULL ? 20 : 4,
  /** The overload test's flooding time, seconds (the goal is stated for 10 minutes). */
  overloadSeconds: Number(process.env.ASSAY_RELIABILITY_OVERLOAD_SECONDS ?? (FULL ? 600 : 20)),
  /** Bytes streamed in the oversized-body test. */
  oversizedBytes: (FULL ? 256 : 64) * 1024 * 1024,
} as const;

/** Environment every test server gets: no model schedule, verbose logs (more to search for secrets). */
export const BASE_ENV: Record<string, string> = {
  HOST: "127.0.0.1",
  PORT: "0",
  LOG_LEVEL: "debug",
  ASSAY_MODEL_SCHEDULE: "never",
  ASSAY_HOLD_SWEEP_SECONDS: "0",
};

export const PG_URL = process.env.ASSAY_TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";
export const REDIS_URL = process.env.ASSAY_TEST_REDIS_URL ?? "redis://127.0.0.1:6379";
/** A run id for PostgreSQL schemas and Redis prefixes of this run (dropped at the end). */
export const RUN = `${Date.now().toString(36)}_${crypto.randomBytes(3).toString("hex")}`;

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Resolves once `check` holds, polling; throws after `ms` (a generous bound, never a timing
 * assertion). With `pending`, the request the wait is about: if it is answered first, the wait fails
 * at once with its status and body instead of running out its bound with only "timed out".
 */
export async function until(
  check: () => boolean | Promise<boolean>,
  what: string,
  { ms = 10_000, pending }: { ms?: number; pending?: Promise<{ statusCode: number; body: string }> } = {},
): Promise<void> {
  let answered: { statusCode: number; body: string } | null = null;
  void pending?.then(
    (r) => (answered = r),
    (e: unknown) => (answered = { statusCode: 0, body: String(e) }),
  );
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await check()) return;
    const a = answered as { statusCode: number; body: string } | null;
    if (a) throw new Error(`${what}: never happened, the request was answered first: ${a.statusCode} ${a.body}`);
    await sleep(10);
  }
  throw new Error(`timed out waiting for ${what}`);
}

/** A real `assay` server process on a loopback port chosen by the OS. */
export class ServerProcess {
  /** Everything the process wrote, stdout and stderr, from its first byte. */
  output = "";
  port = 0;
  private exited: Promise<void>;

  private constructor(readonly child: ChildProcess) {
    this.exited = new Promise((resolve) => child.once("exit", () => resolve()));
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  get pid(): number {
    return this.child.pid!;
  }

  get alive(): boolean {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  /** Spawn `node dist/src/main.js` and wait until it listens and (unless `ready: false`) its model is warm. */
  static async start(env: Record<string, string>, opts: { ready?: boolean } = {}): Promise<ServerProcess> {
    const main = path.join(ROOT, "dist", "src", "main.js");
    if (!fs.existsSync(main)) throw new Error(`${main} is missing: build first (node scripts/bootstrap.mjs)`);
    const child = spawn(process.execPath, [main], {
      cwd: ROOT,
      env: { ...process.env, ...BASE_ENV, ...env },
      stdio: ["ignore", "pipe", "pipe"],
    });
    const s = new ServerProcess(child);
    child.stdout!.on("data", (d: Buffer) => (s.output += d.toString("utf8")));
    child.stderr!.on("data", (d: Buffer) => (s.output += d.toString("utf8")));
    await until(
      () => {
        if (!s.alive) throw new Error(`server exited before listening:\n${s.output.slice(-3000)}`);
        const m = /"port":(\d+),"msg":"assay listening/.exec(s.output);
        if (m) s.port = Number(m[1]);
        return s.port > 0;
      },
      "the server to listen",
      { ms: 120_000 },
    );
    if (opts.ready !== false) await s.waitReady();
    return s;
  }

  async waitReady(): Promise<void> {
    await until(
      async () => {
        if (!this.alive) throw new Error(`server exited before it was ready:\n${this.output.slice(-3000)}`);
        const r = await call(this.url, "/readyz", { method: "GET" });
        return r.status === 200;
      },
      "the model to be ready",
      { ms: 180_000 },
    );
  }

  /** Send a signal and wait for the process to exit. */
  async kill(signal: NodeJS.Signals): Promise<void> {
    if (!this.alive) return;
    this.child.kill(signal);
    await this.exited;
  }

  /** SIGTERM (drain), SIGKILL if it has not exited after 60 s. */
  async stop(): Promise<void> {
    if (!this.alive) return;
    const hard = setTimeout(() => this.child.kill("SIGKILL"), 60_000);
    await this.kill("SIGTERM");
    clearTimeout(hard);
  }

  /** The process's resident set size, bytes (Linux). */
  rssBytes(): number {
    const status = fs.readFileSync(`/proc/${this.pid}/status`, "utf8");
    const m = /VmRSS:\s+(\d+)\s+kB/.exec(status);
    if (!m) throw new Error("no VmRSS in /proc status");
    return Number(m[1]) * 1024;
  }
}

export interface Reply {
  status: number;
  headers: Headers;
  text: string;
  /** The parsed body (null when it is not JSON). */
  json: unknown;
  ms: number;
}

/** One HTTP request; resolves with the reply whatever the status; rejects only on a transport error. */
export async function call(
  base: string,
  route: string,
  init: { method?: string; headers?: Record<string, string>; body?: string | Uint8Array<ArrayBuffer>; signal?: AbortSignal } = {},
): Promise<Reply> {
  const t0 = performance.now();
  const res = await fetch(base + route, {
    method: init.method ?? "POST",
    headers: init.headers ?? {},
    ...(init.body !== undefined ? { body: init.body } : {}),
    ...(init.signal ? { signal: init.signal } : {}),
  });
  const text = await res.text();
  let json: unknown = null;
  try {
    json = JSON.parse(text);
  } catch {
    json = null;
  }
  return { status: res.status, headers: res.headers, text, json, ms: performance.now() - t0 };
}

/** POST /v1/systemone with a key and a JSON body. */
export function score(base: string, key: string, body: unknown, headers: Record<string, string> = {}, signal?: AbortSignal): Promise<Reply> {
  return call(base, "/v1/systemone", {
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json", ...headers },
    body: JSON.stringify(body),
    ...(signal ? { signal } : {}),
  });
}

const STATES = [
  "The parcel arrived two weeks late and the box was crushed.",
  "Thanks, the refund came through this morning.",
  "The app crashes every time I open the settings page.",
  "Our invoice lists the wrong VAT number.",
  "I love the new dark mode, it is easy on the eyes.",
  "The train was cancelled and nobody told us why.",
  "Can I change the delivery address of order 1182?",
  "The coffee machine leaks water onto the counter.",
];

/** A small valid request, varied by `i`: one or two questions of the three types. */
export function smallBody(i: number): { model: string; state: string; questions: Record<string, unknown> } {
  const state = STATES[i % STATES.length]!;
  const questions: Record<string, unknown> = {};
  const kind = i % 3;
  if (kind === 0) questions.complaint = { type: "noul", instructions: "The customer is complaining." };
  if (kind === 1) questions.topic = { type: "choice", instructions: "What is it about?", criteria: { delivery: null, billing: null, product: "the product" } };
  if (kind === 2) questions.mood = { type: "score", instructions: "How happy is the writer?", criteria: ["unhappy", "neutral", "happy"] };
  if (i % 4 === 3) questions.urgent = { type: "noul", instructions: "The message is urgent." };
  return { model: "judge-latest", state, questions };
}

/** The value of one Prometheus sample (0 when absent); `name` may carry its labels, e.g. `x{result="hit"}`. */
export function sample(text: string, name: string): number {
  const escaped = name.replace(/[{}"]/g, (c) => `\\${c}`);
  const m = new RegExp(`^${escaped} (\\S+)$`, "m").exec(text);
  return m ? Number(m[1]) : 0;
}

/** The nearest-rank percentile of `xs` (p in 0..100). */
export function percentile(xs: number[], p: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil((p / 100) * s.length) - 1))]!;
}

/**
 * Every key (and its random part), and every `Bearer …` credential, must be
 * absent from `logs`. Returns the number of log lines searched.
 */
export function expectNoSecrets(logs: string, keys: readonly string[]): number {
  expect(keys.length).toBeGreaterThan(0);
  for (const key of keys) {
    expect(logs.includes(key), `a key appears in the server output: ${key.slice(0, 13)}…`).toBe(false);
    expect(logs.includes(key.slice("sk-assay-".length)), `the random part of a key appears in the server output`).toBe(false);
  }
  expect(logs).not.toMatch(/Bearer\s+sk-/i);
  // A header dump would show up as `"authorization":"…"` with anything but the censor in it.
  for (const m of logs.matchAll(/"(authorization|api_key|x-api-key)"\s*:\s*"([^"]*)"/gi)) expect(m[2]).toBe("[redacted]");
  return logs.split("\n").filter((l) => l.trim() !== "").length;
}

/** Appends a line of figures to `.cache/reliability/<form>.jsonl` (the numbers recorded in docs/experiments/). */
export function recordFigures(test: string, figures: Record<string, unknown>): void {
  const dir = path.join(ROOT, ".cache", "reliability");
  fs.mkdirSync(dir, { recursive: true });
  const line = JSON.stringify({ at: new Date().toISOString(), form: FORM, test, ...figures });
  fs.appendFileSync(path.join(dir, `${FORM}.jsonl`), line + "\n");
  console.log(`[reliability:${FORM}] ${test} ${JSON.stringify(figures)}`);
}
