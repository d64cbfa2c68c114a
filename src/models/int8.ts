import fs from "node:fs";
import type { ExecutionProvider } from "../config/index.js";

/**
 * Which of a W8A8 build's graphs this machine runs (scripts/int8_graphs.py):
 * `model.onnx` multiplies uint8 activations by int8 weights, exact in
 * onnxruntime's kernels only where the CPU has VNNI or AMX; elsewhere (AVX2,
 * AVX-512 without VNNI) they add pairs of products into int16 with
 * saturation and the answers drift (docs/experiments/int8-and-gpu.md).
 * `model.u8u8.onnx` holds the same weights as uint8 (zero point 128): the
 * same integer products, exact on every CPU. `model.s8s8.onnx` quantizes the
 * activations to int8 and scales the sums with Cast + Mul: the CUDA provider
 * has kernels for int8 × int8 MatMulInteger and none for u8 × s8 or for an
 * int32 DequantizeLinear, which would run on the host CPU (docs/experiments/int8-and-gpu.md).
 */
export type Int8Products = "u8s8" | "u8u8" | "s8s8";

/** CPU flags that make onnxruntime's u8 × s8 kernels exact (an int32 sum per product). */
const EXACT_U8S8 = ["avx512_vnni", "avx_vnni", "amx_int8"];

/** The CPU's flags from /proc/cpuinfo, or null where it cannot be read (not Linux). */
function cpuFlags(): Set<string> | null {
  try {
    const line = fs.readFileSync("/proc/cpuinfo", "utf8").split("\n").find((l) => /^(flags|Features)\s*:/.test(l));
    return line ? new Set(line.split(":")[1]!.trim().split(/\s+/)) : null;
  } catch {
    return null;
  }
}

/**
 * A GPU provider runs a build's GPU graph (models/manifest.ts, GPU_GRAPH) and these only where the
 * build has none (CUDA) or its lane fell back to the CPU (WebGPU: this CPU's products).
 * `auto`: s8 × s8 on CUDA (every quantized op on the device); on a CPU, u8 ×
 * s8 where it is known to have VNNI or AMX, u8 × u8 otherwise, an unknown CPU
 * included (exact everywhere; on an AVX2 CPU it is no slower, docs/experiments/int8-and-gpu.md).
 */
export function int8Products(setting: "auto" | Int8Products, provider: ExecutionProvider, flags: Set<string> | null = cpuFlags()): { use: Int8Products; why: string } {
  if (setting !== "auto") {
    const onHost = provider === "cuda" && setting !== "s8s8" ? "; under CUDA its products run on the host CPU" : "";
    return { use: setting, why: `ASSAY_INT8_PRODUCTS${onHost}` };
  }
  if (provider === "cuda") return { use: "s8s8", why: "the CUDA provider: its MatMulInteger takes int8 x int8 only" };
  return cpuInt8Products(flags);
}

/** The products a CPU runs exactly and fastest: u8 × s8 with VNNI or AMX, else u8 × u8 (a CUDA lane that falls back to the CPU runs these too). */
export function cpuInt8Products(flags: Set<string> | null = cpuFlags()): { use: Int8Products; why: string } {
  const exact = flags && EXACT_U8S8.find((f) => flags.has(f));
  if (exact) return { use: "u8s8", why: `this CPU has ${exact}` };
  return { use: "u8u8", why: flags ? `this CPU has none of ${EXACT_U8S8.join(", ")}` : "this CPU's flags are unknown" };
}

/** The graph file of the chosen products in an exported build's folder. */
export const INT8_GRAPH: Record<Int8Products, string> = { u8s8: "model.onnx", u8u8: "model.u8u8.onnx", s8s8: "model.s8s8.onnx" };

/**
 * Which of onnxruntime's CPU float kernels run here (its MLAS library picks them by ISA). The int8
 * products are exact everywhere, but the float work around them (softmax, the float products of
 * attention) runs kernels written per ISA, and the W8A8 graph carries their last-bit differences
 * into the answers' second decimal: the README's example answered 0.867 on an AVX-512 EPYC and
 * 0.876 on an AVX2 one. Which ops differ was not pinned down.
 */
export function cpuFloatKernels(flags: Set<string> | null = cpuFlags()): "avx512" | "avx2" | "other" | "unknown" {
  if (!flags) return "unknown";
  return flags.has("avx512f") ? "avx512" : flags.has("avx2") ? "avx2" : "other";
}
