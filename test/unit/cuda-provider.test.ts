/**
 * scripts/cuda-provider.mjs without fetching anything: which wheels a caller needs, the library path
 * the launcher sets (in front of the caller's, which stays, and the same on a second pass so that
 * bin/assay.js does not run itself again), and the link beside onnxruntime-node's library, which
 * leaves onnxruntime-node's own CUDA 12 provider (the NuGet route) alone.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { cudaDir, libraryPath, linkProvider, ORT_VERSION, PROVIDER_LIBRARIES, setsFor, WHEELS, withLibraryPath } from "../../scripts/cuda-provider.mjs";

const dirs: string[] = [];
const tmp = () => {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), "assay-cuda-provider-"));
  dirs.push(d);
  return d;
};
afterEach(() => {
  for (const d of dirs.splice(0)) fs.rmSync(d, { recursive: true, force: true });
});

/** An onnxruntime-node folder of native libraries at `version`, as node_modules lays it out. */
function ortTree(version: string): string {
  const root = tmp();
  const lib = path.join(root, "bin", "napi-v6", "linux", "x64");
  fs.mkdirSync(lib, { recursive: true });
  fs.writeFileSync(path.join(root, "package.json"), JSON.stringify({ version }));
  return lib;
}

describe("the CUDA provider from PyPI", () => {
  it("pins every wheel by version and sha256, the provider at onnxruntime-node's version", () => {
    const pkg = JSON.parse(fs.readFileSync(path.join(import.meta.dirname, "..", "..", "package.json"), "utf8")) as { dependencies: Record<string, string> };
    expect(pkg.dependencies["onnxruntime-node"]).toBe(ORT_VERSION);
    expect(WHEELS.find((w) => w.name === "onnxruntime-gpu")?.version).toBe(ORT_VERSION);
    for (const w of WHEELS) expect(w.sha256, w.name).toMatch(/^[0-9a-f]{64}$/);
  });

  it("fetches what loading needs for the tests, what running needs for a GPU, and only the provider where ASSAY_CUDA_LIBS has the rest", () => {
    expect(setsFor({ run: false, env: {} })).toEqual(["provider", "load"]);
    expect(setsFor({ run: true, env: {} })).toEqual(["provider", "load", "run"]);
    expect(setsFor({ run: true, env: { ASSAY_CUDA_LIBS: "/opt/torch/nvidia/cu13/lib" } })).toEqual(["provider"]);
  });

  it("puts its libraries in front of the caller's LD_LIBRARY_PATH, keeps the caller's, and adds nothing the second time", () => {
    const env = { ASSAY_BUILD_CACHE: "/c", ASSAY_CUDA_LIBS: "/torch/lib", LD_LIBRARY_PATH: "/drv:/other" };
    expect(libraryPath(env)).toEqual(["/torch/lib", path.join(cudaDir(env), "lib")]);
    const once = withLibraryPath(env);
    expect(once.LD_LIBRARY_PATH).toBe(`/torch/lib:${path.join(cudaDir(env), "lib")}:/drv:/other`);
    expect(withLibraryPath(once).LD_LIBRARY_PATH).toBe(once.LD_LIBRARY_PATH);
    expect(withLibraryPath({ ASSAY_BUILD_CACHE: "/c" }).LD_LIBRARY_PATH).toBe(path.join(cudaDir({ ASSAY_BUILD_CACHE: "/c" }), "lib"));
  });

  it("links the provider beside onnxruntime-node's library, and leaves onnxruntime-node's own provider alone", () => {
    const lib = tmp();
    const said: string[] = [];
    const ort = ortTree(ORT_VERSION);
    expect(linkProvider({ lib, ortDir: ort, say: (m) => said.push(m) })).toBe("pypi");
    for (const f of PROVIDER_LIBRARIES) expect(fs.readlinkSync(path.join(ort, f))).toBe(path.join(lib, f));
    expect(said).toEqual([]);

    const nuget = ortTree(ORT_VERSION);
    for (const f of PROVIDER_LIBRARIES) fs.writeFileSync(path.join(nuget, f), "onnxruntime-node's own");
    expect(linkProvider({ lib, ortDir: nuget, say: (m) => said.push(m) })).toBe("nuget");
    for (const f of PROVIDER_LIBRARIES) expect(fs.readFileSync(path.join(nuget, f), "utf8")).toBe("onnxruntime-node's own");
    expect(said.join("\n")).toMatch(/onnxruntime-node's own CUDA provider is installed/);
  });

  it("refuses an onnxruntime-node of another version than the pins", () => {
    expect(() => linkProvider({ lib: tmp(), ortDir: ortTree("1.31.0"), say: () => {} })).toThrow(/onnxruntime-node is 1\.31\.0 but scripts\/cuda-provider\.mjs pins onnxruntime-gpu 1\.30\.0/);
  });
});
