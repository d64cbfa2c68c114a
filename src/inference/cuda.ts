/**
 * The CUDA provider's boot diagnosis. onnxruntime-node's CUDA provider does not fall back: a session
 * asked for it throws, and its message says only "Failed to load shared library" or the last step that
 * failed. The cause (which library the loader could not find, what the driver answered) is printed on
 * stderr. A lane that could not start CUDA runs cuda-probe.js as a child with the same environment,
 * reads that stderr, and names the cause in words an operator can act on.
 *
 * Imports only Node built-ins: cuda-probe.js loads this before onnxruntime.
 */
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

/** The CUDA version the provider (onnxruntime-gpu, the PyPI route) is built for, and the driver branch it needs. */
export const PROVIDER_CUDA = { version: "13.0", driver: 580 };

/** The newest CUDA each driver branch runs (NVIDIA's CUDA toolkit release notes, table 3). */
const DRIVER_CUDA: ReadonlyArray<readonly [number, string]> = [
  [525, "12.0"], [530, "12.1"], [535, "12.2"], [545, "12.3"], [550, "12.4"], [555, "12.5"],
  [560, "12.6"], [565, "12.7"], [570, "12.8"], [575, "12.9"], [580, "13.0"],
];

/** Protocol-buffer fields, enough for tinyModel's ModelProto. */
const varint = (n: number): number[] => {
  const out: number[] = [];
  do {
    out.push((n & 0x7f) | (n > 0x7f ? 0x80 : 0));
    n >>>= 7;
  } while (n > 0);
  return out;
};
const int = (field: number, n: number): number[] => [...varint(field << 3), ...varint(n)];
const bytes = (field: number, b: number[] | string): number[] => {
  const body = typeof b === "string" ? [...Buffer.from(b, "utf8")] : b;
  return [...varint((field << 3) | 2), ...varint(body.length), ...body];
};

/** y = x + x on one float (ONNX IR 8, opset 17): the smallest graph whose session starts the provider. */
export function tinyModel(): Uint8Array {
  // ValueInfoProto { name, type: TypeProto { tensor_type { elem_type FLOAT, shape { dim { dim_value 1 } } } } }
  const value = (name: string) => [...bytes(1, name), ...bytes(2, bytes(1, [...int(1, 1), ...bytes(2, bytes(1, int(1, 1)))]))];
  const node = [...bytes(1, "x"), ...bytes(1, "x"), ...bytes(2, "y"), ...bytes(4, "Add")];
  const graph = [...bytes(1, node), ...bytes(2, "probe"), ...bytes(11, value("x")), ...bytes(12, value("y"))];
  return Uint8Array.from([...int(1, 8), ...bytes(7, graph), ...bytes(8, int(2, 17))]);
}

/** The installed driver's version: from the kernel module where one is loaded, else from libcuda.so.1's file name. */
export function driverVersion(env: NodeJS.ProcessEnv = process.env): string | undefined {
  try {
    const m = /Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)/.exec(fs.readFileSync("/proc/driver/nvidia/version", "utf8"));
    if (m) return m[1];
  } catch {
    // No kernel module: no GPU driver loaded (or not Linux).
  }
  const dirs = [...(env.LD_LIBRARY_PATH ?? "").split(":").filter(Boolean), "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"];
  for (const d of dirs) {
    try {
      const real = fs.realpathSync(path.join(d, "libcuda.so.1"));
      const m = /libcuda\.so\.(\d+\.\d+(?:\.\d+)?)$/.exec(real);
      if (m) return m[1];
    } catch {
      // Not in this folder.
    }
  }
  return undefined;
}

/** The newest CUDA a driver version runs, where the table knows its branch. */
export function cudaOfDriver(version: string): string | undefined {
  const branch = Number(version.split(".")[0]);
  let found: string | undefined;
  for (const [b, cuda] of DRIVER_CUDA) if (branch >= b) found = cuda;
  return found;
}

/**
 * The cause of a failed CUDA start, in words, from what onnxruntime printed on stderr (and the
 * message it threw). `driver` is the installed driver's version where known.
 */
export function readCudaFailure(stderr: string, driver?: string): string {
  const text = stderr.replace(/\x1b\[[0-9;]*m/g, "");
  const found = /error: (\S+?\.so[.\d]*): cannot open shared object file/.exec(text)?.[1];
  const missing = found && path.basename(found);
  if (missing === "libcuda.so.1") {
    return "no NVIDIA driver: libcuda.so.1, the driver's library, is not on the library path " +
      `(install the NVIDIA driver, R${PROVIDER_CUDA.driver} or newer for CUDA ${PROVIDER_CUDA.version}; in a container, expose it with the NVIDIA container toolkit)`;
  }
  if (missing?.startsWith("libonnxruntime_providers_")) {
    return `the CUDA provider library ${missing} is not installed beside onnxruntime-node: ` +
      "run `ASSAY_EXECUTION_PROVIDER=cuda node scripts/bootstrap.mjs` (npm start does), or see docs/operations.md#gpu";
  }
  if (missing) {
    return `a CUDA library the provider needs is not on the library path: ${missing} ` +
      "(the launcher adds the libraries the bootstrap fetched: start through `npm start` or `scripts/node.mjs`, or set ASSAY_CUDA_LIBS to a folder holding CUDA " +
      `${PROVIDER_CUDA.version.split(".")[0]}'s libraries)`;
  }
  const failure = /CUDA failure (\d+): ([^;\n]+)/.exec(text) ?? /CUDA error (\S+): ([^;\n]+)/.exec(text);
  if (failure) {
    const code = failure[1];
    const what = (failure[2] ?? "").trim();
    if (code === "35" || /cudaErrorInsufficientDriver/.test(text)) {
      const runs = driver ? cudaOfDriver(driver) : undefined;
      const has = driver ? `the installed driver is ${driver}${runs ? `, which runs CUDA up to ${runs}` : ""}` : "the installed driver's version could not be read";
      return `CUDA error 35: the NVIDIA driver is too old for CUDA ${PROVIDER_CUDA.version}, which the provider is built for (${has}; CUDA ${PROVIDER_CUDA.version} needs driver R${PROVIDER_CUDA.driver} or newer)`;
    }
    if (code === "100") return "CUDA error 100: no CUDA-capable GPU found (the driver loaded, but it sees no device: is the GPU visible to this container?)";
    if (code === "101") return `CUDA error 101: no such GPU (${what}): ASSAY_CUDA_DEVICES names a device id the driver does not have`;
    return `CUDA error ${code}: ${what}`;
  }
  const last = text.split("\n").map((l) => l.trim()).filter((l) => /\[E:onnxruntime|error/i.test(l)).at(-1);
  return last ? `onnxruntime: ${last.replace(/^.*?\] /, "")}` : "the cause was not printed (no onnxruntime error on stderr)";
}

/** Beside this file in dist/: lanes run from the compiled worker (pool.ts, WORKER_FILE). */
const PROBE = path.join(path.dirname(fileURLToPath(import.meta.url)), "cuda-probe.js");

/**
 * Starts the provider in a child (cuda-probe.js, same environment) and reads the cause from its
 * stderr. Returns undefined where the child started CUDA after all (the lane's failure was its own).
 */
export async function explainCudaFailure(deviceId: number, env: NodeJS.ProcessEnv = process.env): Promise<string | undefined> {
  const { stdout, stderr, code } = await new Promise<{ stdout: string; stderr: string; code: number | null }>((resolve) => {
    const child = spawn(process.execPath, [PROBE, String(deviceId)], { env, stdio: ["ignore", "pipe", "pipe"], timeout: 60_000 });
    let out = "";
    let err = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    child.stderr.on("data", (d: Buffer) => (err += d.toString()));
    child.on("error", (e) => resolve({ stdout: out, stderr: `${err}\n${e.message}`, code: null }));
    child.on("close", (c) => resolve({ stdout: out, stderr: err, code: c }));
  });
  const result = /^\{.*\}$/m.exec(stdout)?.[0];
  const parsed = result ? (JSON.parse(result) as { ok: boolean; message?: string }) : undefined;
  if (parsed?.ok) return undefined;
  if (!parsed && code !== 0) return readCudaFailure(stderr, driverVersion(env)) + ` (the probe exited with ${code})`;
  return readCudaFailure(`${stderr}\n${parsed?.message ?? ""}`, driverVersion(env));
}
