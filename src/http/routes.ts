/**
 * The routes. Handlers stay thin: the body and auth checks live in body.ts
 * and auth.ts, admission and billing in src/accounts/admission.ts, the work
 * in the pipeline, the error mapping in errors.ts. The scoring routes'
 * request body is validated by its zod schema (src/validate/schema.ts)
 * through fastify-type-provider-zod, which also types the handler's body.
 */
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest, HTTPMethods, RawServerDefault, RouteGenericInterface } from "fastify";
import type { ZodTypeProvider } from "fastify-type-provider-zod";
import type { IncomingMessage } from "node:http";
import { releaseReason, type Admission } from "../accounts/admission.js";
import type { AccountsStore } from "../accounts/types.js";
import type { Config } from "../config/index.js";
import { AssayError } from "../errors/catalogue.js";
import { metrics } from "../observability/metrics.js";
import type { Pipeline } from "../pipeline/types.js";
import { LIMITS, RequestEnvelope, type SystemOneResponse } from "../validate/schema.js";
import { makeAuthenticate } from "./auth.js";
import { makeJsonDecoder } from "./body.js";
import type { Lifecycle } from "./lifecycle.js";
import { STARTING_RETRY_AFTER_S } from "./starting.js";

/**
 * The scoring paths. `/v1/systemone` and `/v1/judge/systemone` are the
 * spec's; `/v1/nimble/systemone` is where the Stainless-generated
 * `bespokelabs` client posts (`client.nimble.system_one`), same requests.
 */
export const SYSTEMONE_PATHS = ["/v1/systemone", "/v1/judge/systemone", "/v1/nimble/systemone"] as const;

/** The scoring routes' schema; openapi.ts documents the same body. */
export const SYSTEMONE_SCHEMA = { body: RequestEnvelope };
const ENVELOPE_FIELDS = new Set(Object.keys(RequestEnvelope.shape));

type SystemOneRequest = FastifyRequest<RouteGenericInterface, RawServerDefault, IncomingMessage, typeof SYSTEMONE_SCHEMA, ZodTypeProvider>;

export interface RouteDeps {
  pipeline: Pipeline;
  accounts: AccountsStore;
  admission: Admission;
  lifecycle: Lifecycle;
  config: Pick<Config, "requestTimeoutMs" | "requestTimeoutMaxMs" | "maxPackedTokens">;
  /** Seconds from process start to the default model being warm, once known (`/health`). */
  startupSeconds?: () => number | null;
}

/** Resolves with `work`, or rejects with the signal's reason as soon as it aborts. */
function untilAborted<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    work.then(
      (v) => {
        signal.removeEventListener("abort", onAbort);
        resolve(v);
      },
      (e: unknown) => {
        signal.removeEventListener("abort", onAbort);
        reject(e);
      },
    );
  });
}

/** A bounded metric label: a configured model name, "other", or "none" (no valid body). */
export function modelLabel(pipeline: Pipeline, name: string | undefined): string {
  if (name === undefined) return "none";
  return pipeline.listModels().some((m) => m.id === name) ? name : "other";
}

export function registerRoutes(app: FastifyInstance, deps: RouteDeps): void {
  const { pipeline, accounts, admission, lifecycle, config } = deps;
  const authenticate = makeAuthenticate(accounts);
  const decodeJson = makeJsonDecoder(app);

  /**
   * The organization's concurrency slot (429), after auth and before the
   * body is decoded or validated, so that one organization decompresses and
   * parses at most its limit of bodies at a time. The handler takes it over;
   * until then `releaseUnclaimed` gives it back on any error.
   */
  async function takeSlot(request: FastifyRequest): Promise<void> {
    const org = request.org;
    if (!org) throw new AssayError("INTERNAL", "route reached without authentication");
    request.admitted = await request.timings.time("admission", () => admission.begin(org, request.id));
  }

  /** Raw bytes → JSON, for the route's schema to validate. */
  async function readBody(request: FastifyRequest): Promise<void> {
    const body = await request.timings.time("validate", () => decodeJson(request));
    if (body !== null && typeof body === "object" && !Array.isArray(body)) {
      const ignored = Object.keys(body).filter((k) => !ENVELOPE_FIELDS.has(k));
      if (ignored.length > 0) request.log.debug({ ignored: ignored.slice(0, 20) }, "unknown top-level fields ignored");
    }
    request.body = body;
  }

  async function releaseUnclaimed(request: FastifyRequest, _reply: FastifyReply, error: FastifyError): Promise<void> {
    const admitted = request.admitted;
    if (!admitted) return;
    request.admitted = null;
    await admitted.end(releaseReason(error));
  }

  async function systemOne(request: SystemOneRequest, reply: FastifyReply): Promise<SystemOneResponse> {
    const timings = request.timings;
    const org = request.org;
    const admitted = request.admitted;
    if (!org || !admitted) throw new AssayError("INTERNAL", "route reached without authentication and a slot");
    // From here on the slot is this handler's to give back, once the work has stopped.
    request.admitted = null;
    const envelope = request.body;
    // Deadline (504), client hang-up (504) and drain deadline (503) all abort this one signal.
    const tracked = lifecycle.track(config.requestTimeoutMs - (performance.now() - timings.start), config.requestTimeoutMs);
    const onClose = () => {
      if (!reply.raw.writableFinished) {
        tracked.abort(new AssayError("TIMEOUT", "the client closed the connection before the answer was ready"));
      }
    };
    reply.raw.once("close", onClose);
    let outcome = "error";
    let held = false;
    let work: Promise<SystemOneResponse> | null = null;
    let workSettled = false;
    try {
      request.scoring = { model: envelope.model, inputTokens: null };
      const questionCount = Object.keys(envelope.questions).length;
      work = pipeline.run(envelope, {
        requestId: request.id,
        orgId: org.id,
        timings,
        signal: tracked.signal,
        // The pipeline's work admission refuses what cannot finish in time
        // (529) and raises the deadline of a request whose own work needs
        // longer than the default; both before any hold or model work.
        deadline: {
          arrivedAt: timings.start,
          defaultMs: config.requestTimeoutMs,
          maxMs: config.requestTimeoutMaxMs,
          admitted: ({ deadlineMs, ownMs, waitMs }) => {
            const ms = Math.ceil(deadlineMs);
            timings.note("deadline", ms);
            timings.note("estimated", ownMs + waitMs);
            if (ms > config.requestTimeoutMs) tracked.extend(ms - (performance.now() - timings.start), ms);
          },
        },
        // After tokenizing, before model work: hold the maximum cost (402).
        // A request already past its deadline places no hold.
        admit: async (inputTokens) => {
          tracked.signal.throwIfAborted();
          await timings.time("admission", () => admitted.hold(envelope.model, questionCount, inputTokens));
          held = true;
          metrics.holds.inc({ event: "placed" });
        },
      });
      const settledFlag = () => {
        workSettled = true;
      };
      work.then(settledFlag, settledFlag);
      const response = await untilAborted(work, tracked.signal);
      // Charge exactly usage.input_tokens × price; the rest of the hold returns.
      await admitted.settle(envelope.model, response.usage.input_tokens);
      outcome = "settled";
      metrics.holds.inc({ event: "settled" });
      metrics.chargedMicroUsd.inc({ model: modelLabel(pipeline, envelope.model) }, admitted.chargedMicro ?? 0);
      request.scoring.inputTokens = response.usage.input_tokens;
      timings.finish();
      reply.headers(timings.headers());
      return response;
    } catch (e) {
      outcome = releaseReason(e);
      throw e;
    } finally {
      reply.raw.off("close", onClose);
      // Any error: the hold is released, no charge; then the slot. When the
      // deadline or the drain cut the request short while its work still
      // runs (a hold being placed, a pass being read), that happens once the
      // work has stopped, so no hold can be placed after its release.
      const release = async () => {
        await admitted.end(outcome);
        if (held && outcome !== "settled") metrics.holds.inc({ event: "released" });
        tracked.done();
      };
      if (work && !workSettled) void work.then(release, release);
      else await release();
    }
  }


  const scoring = app.withTypeProvider<ZodTypeProvider>();
  for (const url of SYSTEMONE_PATHS) {
    scoring.post(
      url,
      {
        schema: SYSTEMONE_SCHEMA,
        // Before validation, in the order of the spec's checks: 401, 429, then the body (413/422).
        preValidation: [authenticate, takeSlot, readBody],
        onError: releaseUnclaimed,
      },
      systemOne,
    );
    methodNotAllowed(app, url, ["POST"]);
  }

  // `data` (OpenAI-style list) is what assay always sent; `models` with
  // name / description / release_date is what typesafe-sdk's
  // `client.models.list()` and bespokelabs-nimble's `models()` read.
  app.get("/v1/models", { preHandler: authenticate }, async () => {
    const list = pipeline.listModels();
    return {
      object: "list" as const,
      data: list.map((m) => ({ object: "model" as const, ...m })),
      models: list.map((m) => ({
        name: m.id,
        description:
          `${m.family} model` +
          (m.alias_of ? `, alias of ${m.alias_of}` : "") +
          (m.deprecated ? " (deprecated)" : "") +
          (m.build ? `; build ${m.build}` : ""),
        // assay does not know when the weights were released.
        release_date: "",
        family: m.family,
        alias_of: m.alias_of,
        deprecated: m.deprecated,
        calibrated: m.calibrated,
        ready: m.ready,
      })),
    };
  });
  methodNotAllowed(app, "/v1/models", ["GET"]);

  // The request limits, as bespokelabs-nimble's `limits()` reads them; per organization for concurrency.
  app.get("/v1/limits", { preHandler: authenticate }, async (request) => ({
    max_answers_per_question: LIMITS.options.max,
    max_questions: LIMITS.generalQuestions.max,
    max_prompt_tokens: config.maxPackedTokens,
    trained_prompt_tokens: config.maxPackedTokens,
    max_input_tokens: config.maxPackedTokens,
    max_body_bytes: LIMITS.bodyBytes,
    max_total_input_tokens: config.maxPackedTokens,
    max_concurrent_requests: request.org ? admission.limitFor(request.org) : 1,
  }));
  methodNotAllowed(app, "/v1/limits", ["GET"]);

  // Liveness: the process answers. Never depends on models or storage.
  app.get("/healthz", async () => ({ status: "ok" }));
  methodNotAllowed(app, "/healthz", ["GET"]);

  // A descriptive health document (bespokelabs-nimble's `health()`): always 200, says whether requests can be served.
  app.get("/health", async () => ({
    status: pipeline.ready() && !lifecycle.draining ? ("ok" as const) : ("unavailable" as const),
    startup_seconds: deps.startupSeconds?.() ?? null,
  }));
  methodNotAllowed(app, "/health", ["GET"]);

  // Readiness: the default model is loaded and warm, and the process is not draining.
  app.get("/readyz", async () => {
    if (lifecycle.draining) throw new AssayError("UNAVAILABLE", "not ready: the server is shutting down", 1);
    if (!pipeline.ready()) {
      throw new AssayError("MODEL_STARTING", "not ready: the default model is still loading", STARTING_RETRY_AFTER_S);
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
