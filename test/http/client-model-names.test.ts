/**
 * The official clients' default model names (typesafe-sdk: `jev-latest`,
 * bespokelabs and bespokelabs-nimble: `nimble-latest`) in the shipped
 * models/models.json: aliases of judge-latest (itself an alias), so they
 * resolve to the same build, are echoed as sent, priced as general models,
 * and listed by GET /v1/models as aliases. The real engine answers them in
 * test/clients/clients.test.ts.
 */
import path from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { loadPrices } from "../../src/accounts/prices.js";
import { ROOT, loadConfig } from "../../src/config/index.js";
import { ModelRegistry } from "../../src/models/registry.js";
import type { ModelListing, PipelineContext } from "../../src/pipeline/types.js";
import type { RequestEnvelope, SystemOneResponse } from "../../src/validate/schema.js";
import { FakePipelineForHttpErrorPaths } from "./fake-pipeline.js";
import { makeTestApp, validBody, type TestApp } from "./helpers.js";

const registry = ModelRegistry.load(path.join(ROOT, "models", "models.json"), path.join(ROOT, "models", "cache"));

/** The HTTP fake, listing the shipped registry the way EnginePipeline.listModels does. */
class ShippedNamesPipeline extends FakePipelineForHttpErrorPaths {
  override listModels(): ModelListing[] {
    return registry.names().map((id) => {
      const r = registry.resolve(id);
      return { id, family: r.family, alias_of: r.aliasOf, deprecated: r.deprecated, build: null, calibrated: null, ready: true };
    });
  }

  override async run(envelope: RequestEnvelope, ctx: PipelineContext): Promise<SystemOneResponse> {
    registry.resolve(envelope.model); // unknown names throw, as in the engine
    return super.run(envelope, ctx);
  }
}

describe.each(["jev-latest", "nimble-latest"])("%s", (name) => {
  it("is an alias of judge-latest and resolves through it to judge-latest's build", () => {
    const r = registry.resolve(name);
    const latest = registry.resolve("judge-latest");
    expect(r).toMatchObject({ name, aliasOf: "judge-latest", target: latest.target, family: "general", build: latest.build, deprecated: false });
  });

  it("costs what judge-latest costs", () => {
    const prices = loadPrices(loadConfig({ LOG_LEVEL: "silent" }).pricesFile);
    expect(prices.priceFor(name, "general")).toBe(prices.priceFor("judge-latest", "general"));
  });
});

describe("over HTTP", () => {
  let t: TestApp<ShippedNamesPipeline>;
  beforeAll(async () => {
    t = await makeTestApp({ pipeline: new ShippedNamesPipeline() });
  });
  afterAll(async () => {
    await t.close();
  });

  it("GET /v1/models lists both as aliases of judge-latest", async () => {
    const res = await t.app.inject({ method: "GET", url: "/v1/models", headers: { authorization: `Bearer ${t.key}` } });
    expect(res.statusCode).toBe(200);
    const body = res.json() as { data: { id: string; alias_of: string | null }[]; models: { name: string; description: string; alias_of: string | null }[] };
    for (const name of ["jev-latest", "nimble-latest"]) {
      expect(body.data.find((m) => m.id === name)).toMatchObject({ alias_of: "judge-latest" });
      expect(body.models.find((m) => m.name === name)).toMatchObject({ alias_of: "judge-latest", description: expect.stringContaining("alias of judge-latest") });
    }
  });

  it.each(["jev-latest", "nimble-latest"])("a request naming %s is answered under that name", async (name) => {
    const res = await t.app.inject({
      method: "POST",
      url: "/v1/systemone",
      headers: { authorization: `Bearer ${t.key}` },
      payload: { ...validBody, model: name },
    });
    expect(res.statusCode, res.body).toBe(200);
    expect(res.json().model).toBe(name);
  });
});
