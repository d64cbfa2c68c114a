/**
 * buildApp: the fastify instance with every hook and route, ready for
 * `inject()` in tests or `listen()` in main.ts. It never listens itself.
 *
 * Hook order for a request (see src/http/body.ts for the body checks):
 *   onRequest  request id headers, timings, draining → 503, Content-Length → 413
 *   parsing    Content-Type → 415, streamed size → 413, raw bytes kept
 *   preHandler Bearer key → 401                        (routes that need auth)
 *   handler    concurrency slot → 429, JSON + envelope → 422,
 *              pipeline.run (credit hold in `admit` → 402) → 200 and settle,
 *              or its AssayError and no charge; slot released in `finally`
 *   errors     src/http/errors.ts, the only place an error becomes a response
 */
import Fastify, { type FastifyBaseLogger, type FastifyInstance } from "fastify";
import { Admission } from "./accounts/admission.js";
import { admissionSettings, openLimiter } from "./accounts/index.js";
import { loadPrices } from "./accounts/prices.js";
import type { Store } from "./accounts/types.js";
import type { Config } from "./config/index.js";
import { AssayError } from "./errors/catalogue.js";
import { checkContentLength, registerJsonBody } from "./http/body.js";
import "./http/context.js";
import { clientErrorHandler, errorHandler, frameworkErrors, notFoundHandler } from "./http/errors.js";
import { requestIdFor, setRequestIdHeaders } from "./http/request-id.js";
import { registerRoutes } from "./http/routes.js";
import { Timings } from "./pipeline/timings.js";
import type { Pipeline } from "./pipeline/types.js";
import { LIMITS } from "./validate/schema.js";

export interface AppDeps {
  config: Config;
  pipeline: Pipeline;
  /** Keys, organizations and the credit ledger (SQLite or PostgreSQL). The caller closes it. */
  accounts: Store;
  /**
   * Concurrency slots and credit holds. When absent, one is made from the
   * config: prices from `config.pricesFile`, the limiter `openLimiter(config)`
   * picks (in-process, or Redis with ASSAY_REDIS_URL), closed with the app.
   * Either way the app runs its expired-hold sweep while it is open.
   */
  admission?: Admission;
  /** A pino logger; when absent fastify makes one at `config.logLevel`. */
  logger?: FastifyBaseLogger;
}

export function buildApp({ config, pipeline, accounts, admission: given, logger }: AppDeps): FastifyInstance {
  const app = Fastify({
    ...(logger
      ? { loggerInstance: logger }
      : { logger: { level: config.logLevel, redact: ["req.headers.authorization"] } }),
    bodyLimit: LIMITS.bodyBytes, // 1 MiB
    genReqId: requestIdFor,
    // fastify's own 503 while closing has a body of its own; ours goes through the error handler.
    return503OnClosing: false,
    frameworkErrors,
    clientErrorHandler,
  });

  let draining = false;
  app.addHook("preClose", async () => {
    draining = true;
  });

  app.decorateRequest("timings", null as unknown as Timings);
  app.decorateRequest("org", null);

  app.addHook("onRequest", async (request, reply) => {
    // First, so that every later failure still carries the id.
    setRequestIdHeaders(reply, request.id);
    request.timings = new Timings();
    request.org = null;
    if (draining) {
      reply.header("connection", "close");
      throw new AssayError("UNAVAILABLE", "the server is shutting down", 1);
    }
    checkContentLength(request);
  });

  const admission =
    given ??
    new Admission({
      store: accounts,
      limiter: openLimiter(config, app.log),
      prices: loadPrices(config.pricesFile),
      modelFamily: (name) => pipeline.listModels().find((m) => m.id === name)?.family,
      settings: admissionSettings(config),
      log: app.log,
    });
  app.addHook("onReady", async () => admission.start());
  app.addHook("onClose", async () => {
    admission.stop();
    if (!given) await admission.limiter.close();
  });

  registerJsonBody(app);
  app.setErrorHandler(errorHandler);
  app.setNotFoundHandler(notFoundHandler);
  registerRoutes(app, { pipeline, accounts, admission });
  return app;
}
