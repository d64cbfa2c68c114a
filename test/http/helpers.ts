import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import type { FastifyInstance } from "fastify";
import { SqliteAccountsStore } from "../../src/accounts/sqlite.js";
import { buildApp } from "../../src/app.js";
import { loadConfig } from "../../src/config/index.js";
import { FakePipelineForHttpErrorPaths } from "./fake-pipeline.js";

export interface TestApp {
  app: FastifyInstance;
  pipeline: FakePipelineForHttpErrorPaths;
  accounts: SqliteAccountsStore;
  /** A valid key of organization `acme`. */
  key: string;
  orgId: string;
  dir: string;
  close(): Promise<void>;
}

export async function makeTestApp(): Promise<TestApp> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-http-"));
  const config = loadConfig({ ASSAY_DATA_DIR: dir, LOG_LEVEL: "silent" });
  const accounts = new SqliteAccountsStore(dir);
  const { key, org } = accounts.createKey("acme");
  const pipeline = new FakePipelineForHttpErrorPaths();
  const app = buildApp({ config, pipeline, accounts });
  await app.ready();
  return {
    app,
    pipeline,
    accounts,
    key,
    orgId: org.id,
    dir,
    async close() {
      await app.close();
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
