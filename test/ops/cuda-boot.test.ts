/**
 * `ASSAY_EXECUTION_PROVIDER=cuda` started as `npm start` starts it (scripts/node.mjs, which puts the
 * CUDA libraries on LD_LIBRARY_PATH before Node starts and keeps the caller's), on this machine kind:
 * the provider from PyPI (the test tier's bootstrap fetched it: scripts/cuda-provider.mjs), no GPU.
 * The chain goes as far as real parts take it, and boot names where it stopped:
 *   - Debian's libcuda1 (driver 535, unpacked, not installed) on the caller's LD_LIBRARY_PATH: the
 *     driver answers CUDA error 35, too old for CUDA 13;
 *   - no libcuda.so.1 anywhere: no NVIDIA driver;
 *   - ASSAY_GPU_FALLBACK_CPU=1: one warn line with that cause, then the README's request served on the CPU.
 * A real server process each, the small deployment (test/engine/engine.ts).
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterEach, beforeAll, describe, expect, it } from "vitest";
import { ROOT } from "../../src/config/index.js";
import { ensureDebianDriver, linkProvider, cudaDir, PROVIDER_LIBRARIES, ortLibDir } from "../../scripts/cuda-provider.mjs";
import { smallDeployment } from "../engine/engine.js";
import { startServer, stopServer, type ServerProcess } from "./server-process.js";

let server: ServerProcess | null = null;
let dir = "";
let driver = "";

const readme = (JSON.parse(fs.readFileSync(path.join(ROOT, "docs", "examples.json"), "utf8")) as { name: string; request: Record<string, unknown> }[]).find(
  (e) => e.name === "refund",
)!.request;

beforeAll(() => {
  const say = (m: string) => console.log(`[cuda-boot] ${m}`);
  // What bootstrap --cuda-provider leaves: the provider libraries linked beside onnxruntime-node's.
  for (const f of PROVIDER_LIBRARIES) expect(fs.existsSync(path.join(cudaDir(), "lib", f)), `${f}: run node scripts/bootstrap.mjs --cuda-provider`).toBe(true);
  linkProvider({ lib: path.join(cudaDir(), "lib"), ortDir: ortLibDir(ROOT), say });
  driver = ensureDebianDriver({ say });
});

afterEach(async () => {
  await stopServer(server, dir);
  server = null;
});

async function boot(env: Record<string, string>): Promise<ServerProcess> {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-cuda-boot-"));
  server = await startServer({ ...smallDeployment(), ASSAY_DATA_DIR: dir, ASSAY_EXECUTION_PROVIDER: "cuda", LD_LIBRARY_PATH: "", ...env }, { launcher: true });
  return server;
}

describe("the CUDA provider from PyPI on a machine without a GPU", () => {
  it("fails boot with the driver's answer where the driver is too old: CUDA error 35", async () => {
    const s = await boot({ LD_LIBRARY_PATH: driver });
    const { code } = await s.exited;
    expect(code).toBe(1);
    const out = s.output();
    expect(out).toMatch(/failed to start: CUDA execution provider could not start on device 0: CUDA error 35: the NVIDIA driver is too old for CUDA 13\.0/);
    expect(out).toMatch(/the installed driver is 535\.\d+\.\d+, which runs CUDA up to 12\.2/);
    expect(out).not.toMatch(/failed to start: [^\n]*Failed to load shared library/);
    console.log(`[cuda-boot] ${/failed to start: [^\n"]*/.exec(out)?.[0]}`);
  }, 180_000);

  it("fails boot naming libcuda.so.1 and the missing NVIDIA driver where there is none", async () => {
    const s = await boot({});
    const { code } = await s.exited;
    expect(code).toBe(1);
    expect(s.output()).toMatch(/failed to start: CUDA execution provider could not start on device 0: no NVIDIA driver: libcuda\.so\.1/);
  }, 180_000);

  it("serves the README's request on the CPU with ASSAY_GPU_FALLBACK_CPU=1, with one warn line naming the cause", async () => {
    const s = await boot({ LD_LIBRARY_PATH: driver, ASSAY_GPU_FALLBACK_CPU: "1" });
    await s.waitForLog(/default model ready/);
    const warned = s.output().match(/CUDA execution provider could not start on device 0: CUDA error 35[^\n]*falling back to CPU as configured/g) ?? [];
    expect(warned).toHaveLength(1);
    const key = fs.readFileSync(path.join(dir, "local-api-key"), "utf8").trim();
    const r = await fetch(`${s.url}/v1/systemone`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ ...readme, model: "judge-latest" }),
    });
    expect(r.status).toBe(200);
    const answer = (await r.json()) as { answers: Record<string, { type: string }> };
    expect(Object.keys(answer.answers).sort()).toEqual(Object.keys(readme.questions as object).sort());
  }, 180_000);
});
