/**
 * Boot: config → accounts (SQLite, or PostgreSQL with ASSAY_DATABASE_URL) →
 * buildApp → listen at once, answering 503 MODEL_STARTING (Retry-After) and
 * /readyz 503 → engine (loads and warms the default model) → ready.
 *
 * SIGTERM / SIGINT: drain. New API requests get 503 with Retry-After and
 * /readyz turns 503 (the load balancer stops sending); in-flight requests
 * finish for up to ASSAY_DRAIN_SECONDS, then the rest are cancelled (503, hold
 * released, no charge); slots and holds are released; then the server, the
 * workers and the stores close and the process exits 0.
 */
import type { AddressInfo } from "node:net";
import { loadConfig } from "./config/index.js";
import { openAccounts, ensureLocalKey } from "./accounts/index.js";
import { testHooks } from "./inference/test-hooks.js";
import { EnginePipeline } from "./pipeline/index.js";
import type { ModelListing } from "./pipeline/types.js";
import { ModelRegistry } from "./models/registry.js";
import { buildApp } from "./app.js";
import { Lifecycle } from "./http/lifecycle.js";
import { StartingPipeline } from "./http/starting.js";
import { createLogger } from "./observability/logger.js";
import { metrics } from "./observability/metrics.js";

/** What /v1/models shows while the model loads: the configured names, none ready. */
function listingBeforeReady(modelsConfig: string, modelsDir: string): () => ModelListing[] {
  let names: ModelListing[] = [];
  try {
    const registry = ModelRegistry.load(modelsConfig, modelsDir);
    names = registry.names().map((id) => {
      const r = registry.resolve(id);
      return { id, family: r.family, alias_of: r.aliasOf, deprecated: r.deprecated, build: null, calibrated: null, ready: false };
    });
  } catch {
    // The engine reports a broken registry with its reason a moment later.
  }
  return () => names;
}

async function main(): Promise<void> {
  const config = loadConfig();
  const logger = createLogger(config.logLevel);
  const accounts = await openAccounts(config);
  logger.info(
    {
      store: config.databaseUrl ? "postgresql" : "sqlite",
      limiter: config.redisUrl ? "redis" : "in-process",
      startingGrantMicro: config.startingGrantMicro,
    },
    "accounts ready",
  );
  await ensureLocalKey(accounts, config.dataDir, logger);
  if (config.testFaults) logger.warn("ASSAY_TEST_FAULTS=1: test fault injection is ON (POST /__test/faults); never in production");

  const starting = new StartingPipeline(listingBeforeReady(config.modelsConfig, config.modelsDir));
  let engine: EnginePipeline | null = null;
  const lifecycle = new Lifecycle();
  const app = buildApp({
    config,
    pipeline: starting,
    accounts,
    logger,
    lifecycle,
    faults: () => (engine ? testHooks(engine.pool) : null),
    startupSeconds: () => starting.startupSeconds,
  });
  metrics.ready.set(0);

  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    metrics.ready.set(0);
    // A last resort if closing itself hangs (a store that never answers).
    let hard: NodeJS.Timeout | undefined;
    const exitAfter = (ms: number) => {
      clearTimeout(hard);
      hard = setTimeout(() => {
        logger.error("shutdown did not finish in time; exiting");
        process.exit(1);
      }, ms);
      hard.unref();
    };
    exitAfter(config.drainMs + 20_000);
    logger.info({ signal, inFlight: lifecycle.inFlightCount, drainSeconds: config.drainMs / 1000 }, "draining");
    const drained = await lifecycle.drain(config.drainMs);
    if (drained.cancelled > 0) logger.warn(drained, "drain deadline reached: cancelled the requests still in flight (no charge)");
    // A cancelled request's pass runs on in its worker (onnxruntime-node cannot stop a run), and the pool's
    // close waits for it: exiting while a worker is inside onnxruntime aborts the process (exit 134).
    if (engine) exitAfter(engine.pool.closeWaitMs() + 20_000);
    await app.close();
    await starting.close();
    await accounts.close();
    logger.info("stopped");
    process.exit(0);
  };
  process.on("SIGTERM", () => void stop("SIGTERM"));
  process.on("SIGINT", () => void stop("SIGINT"));

  // Listen before the model loads: callers get 503 + Retry-After, not connection refused.
  await app.listen({ port: config.port, host: config.host });
  const { port } = app.server.address() as AddressInfo;
  logger.info({ host: config.host, port }, `assay listening on http://${config.host}:${port} (model starting)`);

  logger.info({ provider: config.provider, lanes: config.workers, intraOpThreads: config.intraOpThreads }, "loading models");
  try {
    engine = await EnginePipeline.create(config, (msg) => logger.info(msg));
  } catch (e) {
    starting.fail(e instanceof Error ? e : new Error(String(e)));
    throw e;
  }
  if (stopping) return;
  // Ready means the default build's first short request can also go beside a long pass, and a burst batches at once.
  await engine.preloadForServing();
  if (stopping) return;
  starting.attach(engine);
  metrics.ready.set(1);
  logger.info({ startupSeconds: Math.round((starting.startupSeconds ?? 0) * 10) / 10 }, "default model ready");
}

main().catch((e: unknown) => {
  console.error(`[assay] failed to start: ${e instanceof Error ? e.message : String(e)}`);
  process.exit(1);
});
