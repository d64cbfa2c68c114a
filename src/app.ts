/**
 * buildApp: the fastify instance with every hook and route, ready for
 * `inject()` in tests or `listen()` in main.ts. It never listens itself.
 *
 * Hook order for a request (see src/http/body.ts for the body checks):
 *   onRequest  request id headers, timings, draining → 503, Content-Length → 413
 *   parsing    Content-Type → 415, streamed size → 413, raw bytes kept
 *   preHandler Bearer key → 401                        (routes that need auth)
 *   handler    JSON + envelope → 422, pipeline.run → 200 or its AssayError
 *   errors     src/http/errors.ts, the only place an error becomes a response
 */
import Fastify, { type FastifyBaseLogger, type FastifyInstance } from "fastify";
import type { AccountsStore } from "./accounts/types.js";
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
  accounts: AccountsStore;
  /** A pino logger; when absent fastify makes one at `config.logLevel`. */
  logger?: FastifyBaseLogger;
}

export function buildApp({ config, pipeline, accounts, logger }: AppDeps): FastifyInstance {
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

  registerJsonBody(app);
  app.setErrorHandler(errorHandler);
  app.setNotFoundHandler(notFoundHandler);
  registerRoutes(app, { pipeline, accounts });
  return app;
}
