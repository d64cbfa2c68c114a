/**
 * The routes. Handlers stay thin: the body and auth checks live in body.ts
 * and auth.ts, admission and billing in src/accounts/admission.ts, the work
 * in the pipeline, the error mapping in errors.ts.
 */
import type { FastifyInstance, FastifyReply, FastifyRequest, HTTPMethods } from "fastify";
import { releaseReason, type Admission } from "../accounts/admission.js";
import type { AccountsStore } from "../accounts/types.js";
import { AssayError } from "../errors/catalogue.js";
import type { Pipeline } from "../pipeline/types.js";
import type { SystemOneResponse } from "../validate/schema.js";
import { makeAuthenticate } from "./auth.js";
import { makeJsonDecoder, parseEnvelope } from "./body.js";

export const SYSTEMONE_PATHS = ["/v1/systemone", "/v1/judge/systemone"] as const;

/** Seconds a client is told to wait while the default model loads. */
const READY_RETRY_AFTER_S = 5;

export interface RouteDeps {
  pipeline: Pipeline;
  accounts: AccountsStore;
  admission: Admission;
}

export function registerRoutes(app: FastifyInstance, { pipeline, accounts, admission }: RouteDeps): void {
  const authenticate = makeAuthenticate(accounts);
  const decodeJson = makeJsonDecoder(app);

  async function systemOne(request: FastifyRequest, reply: FastifyReply): Promise<SystemOneResponse> {
    const timings = request.timings;
    const org = request.org;
    if (!org) throw new AssayError("INTERNAL", "route reached without authentication");
    // The organization's concurrency slot (429), before anything else the
    // request does; given back in `finally` whatever happens.
    const admitted = await admission.begin(org, request.id);
    let outcome = "error";
    try {
      const envelope = await timings.time("validate", () => parseEnvelope(decodeJson(request)));
      const questionCount = Object.keys(envelope.questions).length;

      // A caller that hangs up should stop its queued or running work.
      const abort = new AbortController();
      const onClose = () => {
        if (!reply.raw.writableFinished) abort.abort(new Error("client closed the connection"));
      };
      reply.raw.once("close", onClose);
      try {
        const response = await pipeline.run(envelope, {
          requestId: request.id,
          orgId: org.id,
          timings,
          signal: abort.signal,
          // After tokenizing, before model work: hold the maximum cost (402).
          admit: (inputTokens) => admitted.hold(envelope.model, questionCount, inputTokens),
        });
        // Charge exactly usage.input_tokens × price; the rest of the hold returns.
        await admitted.settle(envelope.model, response.usage.input_tokens);
        outcome = "settled";
        timings.finish();
        reply.headers(timings.headers());
        return response;
      } finally {
        reply.raw.off("close", onClose);
      }
    } catch (e) {
      outcome = releaseReason(e);
      throw e;
    } finally {
      // Any error: the hold is released, no charge. Then the slot.
      await admitted.end(outcome);
    }
  }

  for (const url of SYSTEMONE_PATHS) {
    app.post(url, { preHandler: authenticate }, systemOne);
    methodNotAllowed(app, url, ["POST"]);
  }

  app.get("/v1/models", { preHandler: authenticate }, async () => ({
    object: "list" as const,
    data: pipeline.listModels().map((m) => ({ object: "model" as const, ...m })),
  }));
  methodNotAllowed(app, "/v1/models", ["GET"]);

  // Liveness: the process answers. Never depends on models or storage.
  app.get("/healthz", async () => ({ status: "ok" }));
  methodNotAllowed(app, "/healthz", ["GET"]);

  // Readiness: the default model is loaded and warm.
  app.get("/readyz", async () => {
    if (!pipeline.ready()) {
      throw new AssayError("MODEL_STARTING", "not ready: the default model is still loading", READY_RETRY_AFTER_S);
    }
    return { status: "ready" };
  });
  methodNotAllowed(app, "/readyz", ["GET"]);
}

const METHODS: HTTPMethods[] = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/** 405 with the spec's body and an `Allow` header for the other methods on a known path. */
function methodNotAllowed(app: FastifyInstance, url: string, allowed: HTTPMethods[]): void {
  const allow = allowed.includes("GET") ? [...allowed, "HEAD"] : allowed;
  app.route({
    method: METHODS.filter((m) => !allowed.includes(m)),
    url,
    // HEAD on a POST-only path is answered by this route's GET.
    exposeHeadRoute: !allowed.includes("GET"),
    handler: async (request, reply) => {
      reply.header("allow", allow.join(", "));
      throw new AssayError("METHOD_NOT_ALLOWED", `${request.method} is not allowed on ${url}; use ${allow.join(" or ")}`);
    },
  });
}
