/**
 * A quiet, honest log: building the app emits no fastify deprecation
 * warning, and probes and scrapes (/healthz, /readyz, /health, /metrics) log
 * at debug, their 503s while the default model loads included; an API
 * request's refusal still logs at info.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { SqliteAccountsStore } from "../../src/accounts/sqlite.js";
import { buildApp } from "../../src/app.js";
import { loadConfig } from "../../src/config/index.js";
import { StartingPipeline } from "../../src/http/starting.js";
import { loggerOptions } from "../../src/observability/logger.js";

interface Line {
  level: string;
  msg: string;
  path?: string;
  status?: number;
  reqId?: string;
}

const lines: Line[] = [];
const warnings: Error[] = [];
const onWarning = (w: Error) => warnings.push(w);
let dir: string;
let accounts: SqliteAccountsStore;
let app: ReturnType<typeof buildApp>;

beforeAll(async () => {
  process.on("warning", onWarning);
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-quiet-"));
  const config = loadConfig({ ASSAY_DATA_DIR: dir, LOG_LEVEL: "debug" });
  accounts = new SqliteAccountsStore(dir, { startingGrantMicro: config.startingGrantMicro });
  const logger = pino(loggerOptions("debug"), { write: (s: string) => void lines.push(JSON.parse(s) as Line) });
  // The model still loading: /readyz answers 503.
  app = buildApp({ config, pipeline: new StartingPipeline(), accounts, logger });
  await app.ready();
});

afterAll(async () => {
  process.off("warning", onWarning);
  await app?.close();
  accounts?.close();
  fs.rmSync(dir, { recursive: true, force: true });
});

describe("the log", () => {
  it("building the app emits no deprecation warning", async () => {
    await new Promise((resolve) => setImmediate(resolve)); // process warnings are emitted on the next tick
    expect(warnings.map((w) => `${w.name}: ${w.message}`)).toEqual([]);
  });

  it("probes and scrapes log at debug, a /readyz 503 while the model loads included", async () => {
    const ready = await app.inject({ method: "GET", url: "/readyz" });
    expect(ready.statusCode).toBe(503);
    for (const url of ["/healthz", "/health", "/metrics", "/readyz?verbose=1"]) await app.inject({ method: "GET", url });
    const ids = new Set(lines.filter((l) => l.path?.startsWith("/readyz") || ["/healthz", "/health", "/metrics"].includes(l.path ?? "")).map((l) => l.reqId));
    expect(ids.size).toBe(5);
    const probeLines = lines.filter((l) => ids.has(l.reqId));
    expect(probeLines.some((l) => l.status === 503)).toBe(true);
    expect(probeLines.filter((l) => l.level !== "debug")).toEqual([]);
  });

  it("an API request's refusal still logs at info", async () => {
    const res = await app.inject({ method: "POST", url: "/v1/systemone", payload: { questions: {} } });
    expect(res.statusCode).toBe(401);
    const reqId = res.headers["x-request-id"];
    const mine = lines.filter((l) => l.reqId === reqId);
    expect(mine.find((l) => l.msg === "request completed")).toMatchObject({ level: "info", status: 401 });
  });
});
