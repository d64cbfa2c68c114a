/**
 * /openapi.json describes the routes the app serves, with the schemas they
 * validate with: every documented operation is a route, every scoring path
 * is documented, and the request body is the route's own zod schema (not a
 * second copy kept beside it).
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { z } from "zod";
import { SYSTEMONE_PATHS, SYSTEMONE_SCHEMA } from "../../src/http/routes.js";
import { LIMITS } from "../../src/validate/schema.js";
import { makeTestApp, type TestApp } from "./helpers.js";

interface Operation {
  operationId?: string;
  requestBody?: { content: Record<string, { schema: { $ref?: string } }> };
  responses: Record<string, { headers?: Record<string, unknown> }>;
}
interface Doc {
  openapi: string;
  paths: Record<string, Record<string, Operation>>;
  components: { schemas: Record<string, { properties?: Record<string, unknown>; required?: string[] }>; securitySchemes: Record<string, unknown> };
}

let t: TestApp;
let doc: Doc;
beforeAll(async () => {
  t = await makeTestApp();
  const res = await t.app.inject({ method: "GET", url: "/openapi.json" });
  expect(res.statusCode).toBe(200);
  doc = res.json();
});
afterAll(async () => {
  await t.close();
});

describe("OpenAPI document", () => {
  it("is OpenAPI 3.1 and every documented operation is a route of the app", () => {
    expect(doc.openapi).toBe("3.1.0");
    const operations = Object.entries(doc.paths).flatMap(([url, ops]) => Object.keys(ops).map((method) => ({ url, method })));
    expect(operations.length).toBeGreaterThan(SYSTEMONE_PATHS.length);
    for (const { url, method } of operations) {
      expect(t.app.hasRoute({ url, method: method.toUpperCase() as "GET" | "POST" }), `${method} ${url}`).toBe(true);
    }
  });

  it("documents every scoring path with the route's body schema, its errors and bearer auth", () => {
    for (const url of SYSTEMONE_PATHS) {
      const op = doc.paths[url]?.post;
      expect(op, url).toBeDefined();
      expect(op!.requestBody!.content["application/json"]!.schema.$ref).toBe("#/components/schemas/SystemOneRequest");
      for (const status of ["200", "401", "402", "413", "415", "422", "429", "502", "503", "504", "529"]) {
        expect(op!.responses[status], `${url} ${status}`).toBeDefined();
      }
      expect(op!.responses["529"]!.headers!["retry-after"]).toBeDefined();
    }
    expect(doc.paths["/v1/systemone"]!.post!.operationId).toBe("systemOne");
    expect(doc.components.securitySchemes.bearerAuth).toEqual({ type: "http", scheme: "bearer" });

    const request = doc.components.schemas.SystemOneRequest!;
    const routeBody = z.toJSONSchema(SYSTEMONE_SCHEMA.body, { io: "input" }) as { properties: Record<string, unknown>; required?: string[] };
    expect(Object.keys(request.properties!).sort()).toEqual(Object.keys(routeBody.properties).sort());
    expect([...(request.required ?? [])].sort()).toEqual([...(routeBody.required ?? [])].sort());
  });

  it("names the question, response and error schemas, with the limits of the validation schemas", () => {
    const schemas = doc.components.schemas;
    expect(Object.keys(schemas)).toEqual(
      expect.arrayContaining(["NoulQuestion", "ChoiceQuestion", "ScoreQuestion", "SystemOneRequest", "SystemOneResponse", "Error"]),
    );
    expect(JSON.stringify(schemas.ScoreQuestion)).toContain(`"maxItems":${LIMITS.levels.max}`);
    expect(Object.keys(schemas.SystemOneResponse!.properties!).sort()).toEqual(["answers", "model", "request_id", "usage"]);
    expect(Object.keys(schemas.Error!.properties!).sort()).toEqual(["detail", "request_id"]);
  });
});
