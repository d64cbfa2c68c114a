/**
 * Routes for whoever runs the service rather than calls it:
 *
 *   GET  /metrics        Prometheus text format (src/observability/metrics.ts)
 *   GET  /openapi.json   the OpenAPI document generated from the zod schemas
 *   GET  /docs           Swagger UI rendering /openapi.json
 *   POST /__test/faults  TEST ONLY, registered only with ASSAY_TEST_FAULTS=1:
 *                        {"kind": "throw" | "exit" | "stall"} arms a fault on
 *                        the next inference task; {"release": id} lets a stalled
 *                        one go on. Lets a test drive a separate server process.
 */
import swagger from "@fastify/swagger";
import swaggerUi from "@fastify/swagger-ui";
import type { FastifyInstance } from "fastify";
import { invalid } from "../errors/catalogue.js";
import { metrics } from "../observability/metrics.js";
import { openApiDocument } from "./openapi.js";

/** What the test-fault route drives: the inference pool's test hooks (src/inference/test-hooks.ts). */
export interface FaultInjector {
  injectFaultForTest(kind: "throw" | "exit" | "stall"): () => void;
}

export function registerOps(app: FastifyInstance, faults: (() => FaultInjector | null) | null): void {
  app.get("/metrics", async (_request, reply) => {
    reply.type(metrics.registry.contentType);
    return metrics.registry.metrics();
  });

  app.get("/openapi.json", async () => openApiDocument());

  // @fastify/swagger in static mode serves our generated document as-is; swagger-ui renders it.
  void app.register(swagger, { mode: "static", specification: { document: openApiDocument() as never } });
  void app.register(swaggerUi, { routePrefix: "/docs" });

  if (faults) {
    const releases = new Map<string, () => void>();
    let n = 0;
    app.post("/__test/faults", async (request) => {
      const body = JSON.parse((request.body as { bytes?: Buffer } | undefined)?.bytes?.toString("utf8") ?? "{}") as {
        kind?: string;
        release?: string;
      };
      if (body.release !== undefined) {
        releases.get(body.release)?.();
        releases.delete(body.release);
        return { released: body.release };
      }
      if (body.kind !== "throw" && body.kind !== "exit" && body.kind !== "stall") throw invalid('kind must be "throw", "exit" or "stall"');
      const pool = faults();
      if (!pool) throw invalid("the model is not loaded yet");
      const id = String(++n);
      releases.set(id, pool.injectFaultForTest(body.kind));
      return { armed: body.kind, id };
    });
  }
}
