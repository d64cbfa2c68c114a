/**
 * `ASSAY_EXECUTION_PROVIDER=webgpu` on a machine where the WebGPU provider finds no adapter (the
 * Vulkan loader pointed at no driver: what a machine without Vulkan looks like to Dawn) fails boot
 * with the reason, or, with ASSAY_GPU_FALLBACK_CPU=1, serves on the CPU (its CPU graph). A real
 * server process each (`node dist/src/main.js`), the small deployment (test/engine/engine.ts).
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { smallDeployment } from "../engine/engine.js";
import { body } from "./helpers.js";
import { startServer, stopServer, type ServerProcess } from "./server-process.js";

/** The Vulkan loader reads its drivers from these; a file that does not exist leaves it none. */
const NO_VULKAN = { VK_ICD_FILENAMES: "/nonexistent/icd.json", VK_DRIVER_FILES: "/nonexistent/icd.json" };

let server: ServerProcess | null = null;
let dir = "";

afterEach(async () => {
  await stopServer(server, dir);
  server = null;
});

async function boot(env: Record<string, string>): Promise<ServerProcess> {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-webgpu-boot-"));
  server = await startServer({ ...smallDeployment(), ...NO_VULKAN, ASSAY_DATA_DIR: dir, ASSAY_EXECUTION_PROVIDER: "webgpu", ...env });
  return server;
}

describe("the WebGPU provider without an adapter", () => {
  it("fails boot with a message that names the provider and the reason", async () => {
    const s = await boot({});
    const { code } = await s.exited;
    expect(code).toBe(1);
    expect(s.output()).toMatch(/failed to start: WebGPU execution provider could not start \(no usable Vulkan adapter\?\): .*adapter/);
  }, 180_000);

  it("serves on the CPU with ASSAY_GPU_FALLBACK_CPU=1, saying so", async () => {
    const s = await boot({ ASSAY_GPU_FALLBACK_CPU: "1" });
    await s.waitForLog(/default model ready/);
    expect(s.output()).toMatch(/WebGPU execution provider could not start .*falling back to CPU as configured/);
    expect((await fetch(`${s.url}/readyz`)).status).toBe(200);
    const key = fs.readFileSync(path.join(dir, "local-api-key"), "utf8").trim();
    const r = await fetch(`${s.url}/v1/systemone`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify(body()),
    });
    expect(r.status).toBe(200);
    const answer = (await r.json()) as { answers: Record<string, { type: string }> };
    expect(Object.keys(answer.answers).length).toBeGreaterThan(0);
  }, 180_000);
});
