/**
 * buildApp: the fastify instance with every hook and route, ready for
 * `inject()` in tests or `listen()` in main.ts. It never listens itself.
 *
 * Hook order for a request (see src/http/body.ts for the body checks):
 *   onRequest  request id headers, timings, draining → 503 (/v1/*), Content-Length → 413
 *   parsing    Content-Type / Content-Encoding → 415, streamed size → 413, raw bytes kept
 *   preValidation (scoring routes) API key → 401, organization bound to the
 *              request's logger, concurrency slot → 429, decoding + JSON → 413/422
 *   validation the route's zod schema (src/validate/schema.ts) → 422
 *   preHandler API key → 401 (the other /v1 routes)
 *   handler    pipeline.run under the request's deadline (504) (credit hold
 *              in `admit` → 402; 502/503/529 from the model) → 200 and settle,
 *              or its AssayError and no charge; hold and slot released once the work stops
 *   errors     src/http/errors.ts, the only place an error becomes a response
 *   onResponse metrics (requests, stages, tokens) and one JSON log line per request
 */
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance } from "fastify";
import { validatorCompiler } from "fastify-type-provider-zod";
import { Admission } from "./accounts/admission.js";
import { admissionSettings, openLimiter } from "./accounts/index.js";
import { loadPrices } from "./accounts/prices.js";
import type { Store } from "./accounts/types.js";
import type { Config } from "./config/index.js";
import { AssayError } from "./errors/catalogue.js";
import { checkContentLength, registerJsonBody } from "./http/body.js";
import "./http/context.js";
import { clientErrorHandler, errorHandler, frameworkErrors, notFoundHandler, schemaErrorFormatter } from "./http/errors.js";
import { Lifecycle } from "./http/lifecycle.js";
import { registerOps, type FaultInjector } from "./http/ops.js";
import { requestIdFor, setRequestIdHeaders } from "./http/request-id.js";
import { modelLabel, registerRoutes, SYSTEMONE_PATHS } from "./http/routes.js";
import { atDebug, loggerOptions } from "./observability/logger.js";
import { metrics } from "./observability/metrics.js";
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
  /** A pino logger; when absent fastify makes one at `config.logLevel` with the redaction of src/observability. */
  logger?: FastifyBaseLogger;
  /** Serving state and requests in flight; main.ts drains it on SIGTERM. Made here when absent. */
  lifecycle?: Lifecycle;
  /** TEST ONLY: the pool's test hooks (testHooks) behind POST /__test/faults, registered only when `config.testFaults`. */
  faults?: () => FaultInjector | null;
  /** Seconds the default model took to become ready, once known (`/health`). */
  startupSeconds?: () => number | null;
}

declare module "fastify" {
  interface FastifyInstance {
    lifecycle: Lifecycle;
  }
}

/**
 * Probes and scrapes are logged at debug, not once per second at info: their
 * request logger writes info and warn lines at debug, so a /readyz 503 while
 * the model loads is not a warning. Errors (a 500) stay errors.
 */
const QUIET_PATHS = new Set(["/healthz", "/readyz", "/metrics", "/health"]);
const quietPath = (url: string | undefined): boolean => QUIET_PATHS.has((url ?? "").split("?")[0] ?? "");

export function buildApp({ config, pipeline, accounts, admission: given, logger, lifecycle: givenLifecycle, faults, startupSeconds }: AppDeps): FastifyInstance {
  const app = Fastify({
    ...(logger ? { loggerInstance: logger } : { logger: loggerOptions(config.logLevel) }),
    bodyLimit: LIMITS.bodyBytes, // 1 MiB
    genReqId: requestIdFor,
    // One log line per request, written in onResponse with the organization, model and timings.
    logController: new LogController({ disableRequestLogging: true }),
    childLoggerFactory: (log, bindings, options, raw) => {
      const child = log.child(bindings, options);
      return quietPath(raw.url) ? atDebug(child) : child;
    },
    // fastify's own 503 while closing has a body of its own; ours goes through the error handler.
    return503OnClosing: false,
    frameworkErrors,
    clientErrorHandler,
  });

  const lifecycle = givenLifecycle ?? new Lifecycle();
  app.decorate("lifecycle", lifecycle);
  app.addHook("preClose", async () => {
    lifecycle.startDraining();
  });

  app.decorateRequest("timings", null as unknown as Timings);
  app.decorateRequest("org", null);
  app.decorateRequest("scoring", null);
  app.decorateRequest("admitted", null);

  app.addHook("onRequest", async (request, reply) => {
    // First, so that every later failure still carries the id.
    setRequestIdHeaders(reply, request.id);
    request.timings = new Timings();
    request.org = null;
    request.scoring = null;
    request.admitted = null;
    // Draining: the API refuses new work; probes, metrics and docs still answer.
    if (lifecycle.draining && request.url.startsWith("/v1/")) {
      reply.header("connection", "close");
      throw new AssayError("UNAVAILABLE", "the server is shutting down; retry (another replica will answer)", 1);
    }
    checkContentLength(request);
  });

  app.addHook("onResponse", async (request, reply) => {
    const timings = request.timings;
    if (!timings) return;
    timings.finish();
    const status = reply.statusCode;
    const path = (request.url.split("?")[0] ?? "").slice(0, 200);
    const scoring = request.scoring;
    if (request.routeOptions.url && SCORING.has(request.routeOptions.url) && request.method === "POST") {
      const model = modelLabel(pipeline, scoring?.model);
      metrics.requests.inc({ model, status: String(status) });
      for (const [stage, ms] of timings.entries()) metrics.stageSeconds.observe({ stage }, ms / 1000);
      if (scoring?.inputTokens) metrics.inputTokens.inc({ model }, scoring.inputTokens);
    }
    const line = {
      method: request.method,
      path,
      status,
      ms: Math.round((timings.ms.total ?? 0) * 10) / 10,
      ...(scoring ? { model: scoring.model, inputTokens: scoring.inputTokens } : {}),
      ...(scoring ? { timings: roundAll(timings.ms) } : {}),
    };
    if (QUIET_PATHS.has(path)) request.log.debug(line, "request completed");
    else request.log.info(line, "request completed");
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
  // Route schemas are zod (src/validate/schema.ts); a refusal is the same 422 and detail the handlers gave.
  app.setValidatorCompiler(validatorCompiler);
  app.setSchemaErrorFormatter(schemaErrorFormatter);
  app.setErrorHandler(errorHandler);
  app.setNotFoundHandler(notFoundHandler);
  registerRoutes(app, {
    pipeline,
    accounts,
    admission,
    lifecycle,
    config,
    ...(startupSeconds ? { startupSeconds } : {}),
  });
  registerOps(app, config.testFaults && faults ? faults : null);
  return app;
}

const SCORING = new Set<string>(SYSTEMONE_PATHS);

function roundAll(ms: Partial<Record<string, number>>): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [k, v] of Object.entries(ms)) if (v !== undefined) out[k] = Math.round(v * 10) / 10;
  return out;
}
