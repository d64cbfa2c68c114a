/**
 * The int8 products on this machine's CPU, through onnxruntime-node itself:
 * one MatMulInteger as the W8A8 graph runs it (uint8 activations, zero point
 * 128, over the whole 1..255 range; int8 weights over ±127) and as its
 * `model.u8u8.onnx` variant runs it (the weights + 128 as uint8, zero point
 * 128), against the exact integer product. The u8 × u8 product must be exact
 * everywhere; the u8 × s8 one is exact only where the CPU has VNNI or AMX, so
 * where `ASSAY_INT8_PRODUCTS=auto` picks u8 × s8 it must be exact here. On a
 * CPU without them (an AVX2 AMD EPYC) the u8 × s8 product is wrong in almost
 * every entry (docs/experiments/int8-and-gpu.md).
 *
 * The one-node graphs are encoded here (a few protobuf fields), so the test
 * needs no Python and no exported model.
 */
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import * as ort from "onnxruntime-node";
import { describe, expect, it } from "vitest";
import { ROOT } from "../../src/config/index.js";
import { cpuFloatKernels, cpuInt8Products, int8Products } from "../../src/models/int8.js";
import { readBuild } from "../../src/models/manifest.js";

// --- a minimal ONNX protobuf writer: varints, length-delimited fields ---
const varint = (n: number): number[] => {
  const out: number[] = [];
  let v = n;
  while (v > 127) {
    out.push((v & 127) | 128);
    v = Math.floor(v / 128);
  }
  out.push(v);
  return out;
};
const field = (no: number, bytes: Uint8Array | number[]): number[] => [...varint((no << 3) | 2), ...varint(bytes.length), ...bytes];
const int = (no: number, v: number): number[] => [...varint(no << 3), ...varint(v)];
const str = (no: number, s: string): number[] => field(no, [...Buffer.from(s, "utf8")]);

const UINT8 = 2;
const INT8 = 3;
const INT32 = 6;

/** TensorProto: dims 1, data_type 2, name 8, raw_data 9. */
const tensor = (name: string, type: number, dims: number[], raw: Uint8Array): number[] => [...dims.flatMap((d) => int(1, d)), ...int(2, type), ...str(8, name), ...field(9, raw)];
/** ValueInfoProto name 1, type 2 → TypeProto.tensor_type 1 → elem_type 1, shape 2 → dim 1 → dim_value 1. */
const valueInfo = (name: string, type: number, dims: number[]): number[] =>
  [...str(1, name), ...field(2, field(1, [...int(1, type), ...field(2, dims.flatMap((d) => field(1, int(1, d))))]))];

function matMulInteger(M: number, K: number, N: number, weights: { type: number; raw: Uint8Array }, zeroPoints: Array<{ name: string; value: number }>): Uint8Array {
  const node = [...["x", "W", ...zeroPoints.map((z) => z.name)].flatMap((i) => str(1, i)), ...str(2, "y"), ...str(4, "MatMulInteger")];
  const graph = [
    ...field(1, node),
    ...str(2, "g"),
    ...field(5, tensor("W", weights.type, [K, N], weights.raw)),
    ...zeroPoints.flatMap((z) => field(5, tensor(z.name, UINT8, [], Uint8Array.of(z.value)))),
    ...field(11, valueInfo("x", UINT8, [M, K])),
    ...field(12, valueInfo("y", INT32, [M, N])),
  ];
  return Uint8Array.from([...int(1, 8), ...field(7, graph), ...field(8, int(2, 17))]);
}

/** A seeded generator: the same draw on every machine. */
function lcg(seed: number): () => number {
  let s = seed >>> 0;
  return () => ((s = (Math.imul(s, 1664525) + 1013904223) >>> 0) / 2 ** 32);
}

describe("int8 products on this CPU (onnxruntime-node)", () => {
  it("u8 x u8 is exact; u8 x s8 is exact wherever ASSAY_INT8_PRODUCTS=auto runs it", async () => {
    const [M, K, N] = [16, 256, 32];
    const rnd = lcg(26);
    // Activations as the W8A8 graph quantizes them: per row, |x| ≤ 127 around zero point 128.
    const x = Uint8Array.from({ length: M * K }, () => 1 + Math.floor(rnd() * 255));
    const w = Int8Array.from({ length: K * N }, () => Math.floor(rnd() * 255) - 127);
    const exact = new Int32Array(M * N);
    for (let i = 0; i < M; i++)
      for (let j = 0; j < N; j++) {
        let s = 0;
        for (let k = 0; k < K; k++) s += (x[i * K + k]! - 128) * w[k * N + j]!;
        exact[i * N + j] = s;
      }
    const run = async (model: Uint8Array) => {
      const s = await ort.InferenceSession.create(model, { executionProviders: ["cpu"], intraOpNumThreads: 1 });
      const y = (await s.run({ x: new ort.Tensor("uint8", x, [M, K]) }))["y"]!.data as Int32Array;
      await s.release();
      return y.reduce((n, v, i) => n + Number(v !== exact[i]), 0);
    };
    const u8s8 = await run(matMulInteger(M, K, N, { type: INT8, raw: new Uint8Array(w.buffer) }, [{ name: "zp", value: 128 }]));
    const u8u8 = await run(
      matMulInteger(M, K, N, { type: UINT8, raw: Uint8Array.from(w, (v) => v + 128) }, [{ name: "zp", value: 128 }, { name: "wzp", value: 128 }]),
    );
    expect(u8u8).toBe(0);
    const chosen = int8Products("auto", "cpu");
    if (chosen.use === "u8s8") expect(u8s8, `auto picked u8 x s8 (${chosen.why}), but it is wrong in ${u8s8} of ${M * N} entries here`).toBe(0);
    // Where auto picked u8 x u8, u8 x s8 may be exact too (an ARM CPU, say): then it is only slower, not wrong.
  });
});

describe("which graph ASSAY_INT8_PRODUCTS=auto picks", () => {
  it("s8 x s8 on a GPU; u8 x s8 on a CPU with VNNI or AMX; u8 x u8 on any other CPU, an unknown one included; a setting wins", () => {
    const cpu = (...flags: string[]) => new Set(["fpu", "sse2", "avx2", ...flags]);
    expect(int8Products("auto", "cpu", cpu("avx512f", "avx512_vnni")).use).toBe("u8s8");
    expect(int8Products("auto", "cpu", cpu("avx_vnni")).use).toBe("u8s8");
    expect(int8Products("auto", "cpu", cpu("avx512f", "avx512_vnni", "amx_int8")).use).toBe("u8s8");
    expect(int8Products("auto", "cpu", cpu()).use).toBe("u8u8");
    expect(int8Products("auto", "cpu", cpu("avx512f", "avx512bw")).use).toBe("u8u8");
    expect(int8Products("auto", "cpu", null).use).toBe("u8u8");
    // The CUDA provider's MatMulInteger takes int8 x int8 only: the s8 x s8 graph, whatever the host CPU.
    expect(int8Products("auto", "cuda", cpu()).use).toBe("s8s8");
    expect(int8Products("auto", "cuda", cpu("avx512_vnni")).use).toBe("s8s8");
    expect(int8Products("u8s8", "cpu", cpu()).use).toBe("u8s8");
    expect(int8Products("u8u8", "cpu", cpu("avx512_vnni")).use).toBe("u8u8");
    expect(int8Products("u8s8", "cuda", cpu())).toEqual({ use: "u8s8", why: "ASSAY_INT8_PRODUCTS; under CUDA its products run on the host CPU" });
    // What a CUDA lane that falls back to the CPU runs instead: the CPU's own choice.
    expect(cpuInt8Products(cpu()).use).toBe("u8u8");
    expect(cpuInt8Products(cpu("amx_int8")).use).toBe("u8s8");
  });

  it("names the float kernels' kind, which a printed example answer depends on", () => {
    expect(cpuFloatKernels(new Set(["sse2", "avx2", "avx512f", "avx512_vnni"]))).toBe("avx512");
    expect(cpuFloatKernels(new Set(["sse2", "avx2"]))).toBe("avx2");
    expect(cpuFloatKernels(new Set(["sse2"]))).toBe("other");
    expect(cpuFloatKernels(null)).toBe("unknown");
  });
});

describe("the graph rewrites (scripts/int8_graphs.py --selftest)", () => {
  it("u8 x u8 and s8 x s8 compute model.onnx's products exactly, and s8 x s8 leaves no op without a CUDA kernel", () => {
    // The venv bootstrap made to export the models (ASSAY_CACHE_DIR, default .cache).
    const py = path.join(process.env["ASSAY_CACHE_DIR"] ?? path.join(ROOT, ".cache"), "pyenv", "bin", "python");
    const r = spawnSync(py, [path.join(ROOT, "scripts", "int8_graphs.py"), "--selftest"], { encoding: "utf8" });
    expect(r.error, `could not run ${py}; npm run prepare-models makes it`).toBeUndefined();
    const said = `${r.stdout}${r.stderr}`;
    expect(r.status, said).toBe(0);
    // Every rewrite was measured (the u8 x u8 graph through onnxruntime here too), each to zero.
    expect(said.match(/selftest \S+ \([^)]+\): max \|Δ\| \/ max \|y\| against model\.onnx's graph = 0\n/g)?.length).toBe(3);
  }, 120_000);
});

describe("the build's graph file", () => {
  it("u8 x u8 reads model.u8u8.onnx where the build has it; a build without it runs model.onnx and says so", () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "assay-int8-"));
    try {
      fs.copyFileSync(path.join(ROOT, "models", "cache", "qwen2.5-coder-0.5b-instruct", "manifest.json"), path.join(dir, "manifest.json"));
      const warnings: string[] = [];
      const read = (int8: "u8s8" | "u8u8") => path.basename(readBuild(dir, { int8, warn: (m) => warnings.push(m) }).onnxPath);
      expect(read("u8u8")).toBe("model.onnx");
      expect(warnings.join("\n")).toMatch(/no model\.u8u8\.onnx: its int8 products may saturate/);
      fs.writeFileSync(path.join(dir, "model.u8u8.onnx"), "");
      expect(read("u8u8")).toBe("model.u8u8.onnx");
      expect(read("u8s8")).toBe("model.onnx");
      expect(path.basename(readBuild(dir, { int8: "s8s8", warn: (m) => warnings.push(m) }).onnxPath)).toBe("model.onnx");
      expect(warnings.join("\n")).toMatch(/no model\.s8s8\.onnx: under CUDA its int8 products and their scaling run on the host CPU/);
      fs.writeFileSync(path.join(dir, "model.s8s8.onnx"), "");
      expect(path.basename(readBuild(dir, { int8: "s8s8" }).onnxPath)).toBe("model.s8s8.onnx");
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
