/**
 * A child process that starts the CUDA provider on one device and ends (cuda.ts runs it after a
 * lane could not start the provider): onnxruntime names the cause only on the process's stderr,
 * which a worker thread shares with the server and cannot read back.
 *
 *   node dist/src/inference/cuda-probe.js <deviceId>   prints {"ok":true} or {"ok":false,"message":…}
 */
import ort from "onnxruntime-node";
import { tinyModel } from "./cuda.js";

const deviceId = Number(process.argv[2] ?? 0);
try {
  const s = await ort.InferenceSession.create(tinyModel(), { executionProviders: [{ name: "cuda", deviceId }] });
  await s.release();
  process.stdout.write(JSON.stringify({ ok: true }) + "\n");
} catch (e) {
  process.stdout.write(JSON.stringify({ ok: false, message: e instanceof Error ? e.message : String(e) }) + "\n");
}
