/**
 * The CUDA boot diagnosis (src/inference/cuda.ts) reads onnxruntime's stderr. The texts below are
 * what onnxruntime-node 1.30.0 with onnxruntime-gpu 1.30.0's provider printed on this machine kind
 * (no GPU) at each step of the load chain: the runtime's libraries missing, the driver missing,
 * Debian's driver 535 library present (too old for CUDA 13), the provider library not linked.
 * The engine tier (test/engine/cuda-boot.test.ts) takes the real chain to each of these.
 */
import ort from "onnxruntime-node";
import { describe, expect, it } from "vitest";
import { cudaOfDriver, readCudaFailure, tinyModel } from "../../src/inference/cuda.js";

const LIB = "/srv/assay/node_modules/onnxruntime-node/bin/napi-v6/linux/x64";
const bridge = (lib: string, error: string) =>
  `\x1b[1;31m2026-12-07 11:58:11.044272170 [E:onnxruntime:onnxruntime-node, provider_bridge_ort.cc:2146 Create] /onnxruntime_src/onnxruntime/core/session/provider_bridge_ort.cc:1988 onnxruntime::Provider& onnxruntime::ProviderLibrary::Get() [ONNXRuntimeError] : 1 : FAIL : Failed to load library ${LIB}/${lib} with error: ${error}: cannot open shared object file: No such file or directory\n\x1b[m\n` +
  "OrtSessionOptionsAppendExecutionProvider_Cuda: Failed to load shared library";
const DRIVER_35 =
  "/onnxruntime_src/onnxruntime/core/providers/cuda/cuda_call.cc:154 std::conditional_t<THRW, void, onnxruntime::common::Status> onnxruntime::CudaCall(ERRTYPE, const char*, const char*, SUCCTYPE, const char*, const char*, int) [with ERRTYPE = cudaError; bool THRW = true] " +
  "CUDA failure 35: CUDA driver version is insufficient for CUDA runtime version ; GPU=-1 ; hostname=vm ; file=/onnxruntime_src/onnxruntime/core/providers/cuda/cuda_execution_provider.cc ; line=352 ; expr=cudaSetDevice(info_.device_id); \n\n";

describe("reading why the CUDA provider did not start", () => {
  it("names the missing NVIDIA driver where libcuda.so.1 is not found", () => {
    const why = readCudaFailure(bridge("libonnxruntime_providers_cuda.so", "libcuda.so.1"));
    expect(why).toMatch(/^no NVIDIA driver: libcuda\.so\.1/);
    expect(why).toContain("R580");
  });

  it("names a missing CUDA runtime library and how the launcher finds them", () => {
    const why = readCudaFailure(bridge("libonnxruntime_providers_cuda.so", "libcublasLt.so.13"));
    expect(why).toMatch(/not on the library path: libcublasLt\.so\.13/);
    expect(why).toContain("ASSAY_CUDA_LIBS");
  });

  it("names the provider library when it is not installed beside onnxruntime-node", () => {
    const why = readCudaFailure(bridge("libonnxruntime_providers_shared.so", `${LIB}/libonnxruntime_providers_shared.so`));
    expect(why).toMatch(/^the CUDA provider library libonnxruntime_providers_shared\.so is not installed/);
  });

  it("reads error 35 as a driver too old for CUDA 13, with the driver's own CUDA version", () => {
    const why = readCudaFailure(DRIVER_35, "535.261.03");
    expect(why).toMatch(/^CUDA error 35: the NVIDIA driver is too old for CUDA 13\.0/);
    expect(why).toContain("the installed driver is 535.261.03, which runs CUDA up to 12.2");
    expect(readCudaFailure(DRIVER_35)).toContain("could not be read");
  });

  it("names no device and a wrong device id", () => {
    expect(readCudaFailure("CUDA failure 100: no CUDA-capable device is detected ; GPU=-1")).toMatch(/no CUDA-capable GPU/);
    expect(readCudaFailure("CUDA failure 101: invalid device ordinal ; GPU=3")).toMatch(/ASSAY_CUDA_DEVICES/);
  });

  it("knows which CUDA each driver branch runs", () => {
    expect(cudaOfDriver("580.159.03")).toBe("13.0");
    expect(cudaOfDriver("550.163.01")).toBe("12.4");
    expect(cudaOfDriver("470.1")).toBeUndefined();
  });
});

describe("the probe's graph", () => {
  it("is a model onnxruntime loads and runs: y = x + x", async () => {
    const s = await ort.InferenceSession.create(tinyModel(), { executionProviders: ["cpu"] });
    const { y } = await s.run({ x: new ort.Tensor("float32", Float32Array.from([1.25]), [1]) });
    expect(Array.from(y!.data as Float32Array)).toEqual([2.5]);
    await s.release();
  });
});
