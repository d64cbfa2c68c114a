/**
 * Boot: config → accounts (SQLite, or PostgreSQL with ASSAY_DATABASE_URL) →
 * engine (loads and warms the default model) → buildApp (admission: limiter
 * in-process, or Redis with ASSAY_REDIS_URL) → listen. SIGTERM/SIGINT drain: stop accepting, let in-flight
 * requests finish (up to ASSAY_DRAIN_SECONDS), then release the workers.
 */
import { pino } from "pino";
import { loadConfig } from "./config/index.js";
import { openAccounts, ensureLocalKey } from "./accounts/index.js";
import { EnginePipeline } from "./pipeline/index.js";
import { buildApp } from "./app.js";

async function main(): Promise<void> {
  const config = loadConfig();
  const logger = pino({ level: config.logLevel, redact: ["req.headers.authorization", "headers.authorization"] });
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

  logger.info({ provider: config.provider, lanes: config.workers, intraOpThreads: config.intraOpThreads }, "loading models");
  const pipeline = await EnginePipeline.create(config, (msg) => logger.info(msg));
  const app = buildApp({ config, pipeline, accounts, logger });
  await app.listen({ port: config.port, host: config.host });
  logger.info(`assay listening on http://${config.host}:${config.port}`);

  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    logger.info({ signal }, "draining");
    const deadline = setTimeout(() => {
      logger.warn("drain deadline reached; exiting");
      process.exit(1);
    }, Number(process.env.ASSAY_DRAIN_SECONDS ?? 30) * 1000);
    deadline.unref();
    await app.close();
    await pipeline.close();
    await accounts.close();
    process.exit(0);
  };
  process.on("SIGTERM", () => void stop("SIGTERM"));
  process.on("SIGINT", () => void stop("SIGINT"));
}

main().catch((e: unknown) => {
  console.error(`[assay] failed to start: ${e instanceof Error ? e.message : String(e)}`);
  process.exit(1);
});
