/**
 * The real engine behind the real app for the operating tests: the default
 * exported model (EnginePipeline, never a stub), ASSAY_TEST_FAULTS=1 so a test
 * can stall, fail or kill the worker for one task, and an SQLite store in a
 * temp folder whose ledger the tests read.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import type { FastifyBaseLogger, FastifyInstance } from "fastify";
import { SqliteAccountsStore } from "../../src/accounts/sqlite.js";
import { buildApp } from "../../src/app.js";
import { loadConfig, type Config } from "../../src/config/index.js";
import { Lifecycle } from "../../src/http/lifecycle.js";
import { EnginePipeline } from "../../src/pipeline/index.js";
import type { Pipeline } from "../../src/pipeline/types.js";

export const ENGINE_ENV = { LOG_LEVEL: "silent", ASSAY_TEST_FAULTS: "1", ASSAY_QUEUE_MAX: "1" };

export async function startFaultyEngine(extra: Record<string, string> = {}): Promise<EnginePipeline> {
  return EnginePipeline.create(loadConfig({ ...process.env, ...ENGINE_ENV, ...extra }));
}

export interface OpsApp {
  app: FastifyInstance;
  accounts: SqliteAccountsStore;
  config: Config;
  lifecycle: Lifecycle;
  key: string;
  orgId: string;
  close(): Promise<void>;
}

export async function makeOpsApp(
  pipeline: Pipeline,
  env: Record<string, string> = {},
  options: { logger?: FastifyBaseLogger; faults?: () => { injectFaultForTest(kind: "throw" | "exit" | "stall"): () => void } | null } = {},
): Promise<OpsApp> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-ops-"));
  const config = loadConfig({ ...process.env, ...ENGINE_ENV, ASSAY_DATA_DIR: dir, ASSAY_HOLD_SWEEP_SECONDS: "0", ...env });
  const accounts = new SqliteAccountsStore(dir, { startingGrantMicro: config.startingGrantMicro });
  const { key, org } = accounts.createKey("acme");
  const lifecycle = new Lifecycle();
  const app = buildApp({
    config,
    pipeline,
    accounts,
    lifecycle,
    ...(options.logger ? { logger: options.logger } : {}),
    ...(options.faults ? { faults: options.faults } : {}),
  });
  await app.ready();
  return {
    app,
    accounts,
    config,
    lifecycle,
    key,
    orgId: org.id,
    async close() {
      await app.close();
      accounts.close();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

export const body = (state = "The parcel arrived two weeks late and the box was crushed.") => ({
  model: "judge-latest",
  state,
  questions: {
    late: { type: "noul", instructions: "The delivery was late." },
    topic: { type: "choice", instructions: "What is it about?", criteria: { delivery: null, billing: null } },
  },
});


/** One copy of the polling wait for every process-tier test. */
export { until } from "../reliability/harness.js";

/** The value of one sample in Prometheus text format (0 when absent). */
export function sample(text: string, name: string, labels: Record<string, string> = {}): number {
  for (const line of text.split("\n")) {
    if (!line.startsWith(name)) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$/.exec(line);
    if (!m || m[1] !== name) continue;
    const got = Object.fromEntries([...(m[2] ?? "").matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    if (Object.entries(labels).every(([k, v]) => got[k] === v)) return Number(m[3]);
  }
  return 0;
}
