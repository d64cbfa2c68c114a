import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import type { FastifyInstance } from "fastify";
import { Admission } from "../../src/accounts/admission.js";
import { admissionSettings } from "../../src/accounts/index.js";
import { InProcessLimiter } from "../../src/accounts/limiter.js";
import { loadPrices } from "../../src/accounts/prices.js";
import { SqliteAccountsStore } from "../../src/accounts/sqlite.js";
import { buildApp } from "../../src/app.js";
import { loadConfig, type Config } from "../../src/config/index.js";
import type { Pipeline } from "../../src/pipeline/types.js";
import { FakePipelineForHttpErrorPaths } from "./fake-pipeline.js";

export interface TestApp<P extends Pipeline = FakePipelineForHttpErrorPaths> {
  app: FastifyInstance;
  pipeline: P;
  accounts: SqliteAccountsStore;
  admission: Admission;
  config: Config;
  /** A valid key of organization `acme`. */
  key: string;
  orgId: string;
  dir: string;
  close(): Promise<void>;
}

export interface TestAppOptions<P extends Pipeline> {
  pipeline?: P;
  /** Extra environment for loadConfig (ASSAY_CONCURRENCY_…, ASSAY_HOLD_TTL_SECONDS, …). */
  env?: Record<string, string>;
  /** Free credit of every new organization, µUSD (default: the config's $1). */
  startingGrantMicro?: number;
  /** The admission clock (ms since the epoch). */
  clock?: () => number;
}

export async function makeTestApp<P extends Pipeline = FakePipelineForHttpErrorPaths>(
  options: TestAppOptions<P> = {},
): Promise<TestApp<P>> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-http-"));
  const config = loadConfig({ ASSAY_DATA_DIR: dir, LOG_LEVEL: "silent", ...options.env });
  const accounts = new SqliteAccountsStore(dir, { startingGrantMicro: options.startingGrantMicro ?? config.startingGrantMicro });
  const { key, org } = accounts.createKey("acme");
  const pipeline = (options.pipeline ?? new FakePipelineForHttpErrorPaths()) as P;
  const limiter = new InProcessLimiter();
  const admission = new Admission({
    store: accounts,
    limiter,
    prices: loadPrices(config.pricesFile),
    modelFamily: (name) => pipeline.listModels().find((m) => m.id === name)?.family,
    settings: admissionSettings(config),
    ...(options.clock ? { clock: options.clock } : {}),
  });
  const app = buildApp({ config, pipeline, accounts, admission });
  await app.ready();
  return {
    app,
    pipeline,
    accounts,
    admission,
    config,
    key,
    orgId: org.id,
    dir,
    async close() {
      await app.close();
      await limiter.close();
      accounts.close();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A minimal valid general request. */
export const validBody = {
  model: "judge-latest",
  state: "The sky is blue.",
  questions: { q1: { type: "noul", instructions: "The text is about the sky." } },
};

export const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
