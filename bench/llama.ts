/**
 * The llama.cpp baseline as its users run it on a CPU server: `llama-server`
 * built from source with native CPU flags (scripts/build-llama.mjs: the
 * llama.cpp vendored by the `llama-cpp-python` sdist on PyPI, GGML_NATIVE=ON,
 * Release), started as a child process on 127.0.0.1 with one slot.
 *
 * It evaluates exactly the token ids assay packs (assay's tokenizer, same
 * vocabulary; `prompt` as an array of ids), on the GGUF file the default
 * model was exported from, so both engines do the same work on the same
 * weights (llama.cpp on the GGUF's own quantization, assay on its int8
 * export of it). The time read is the server's own prompt-processing time
 * (`timings.prompt_ms`): it leaves out HTTP and the one token the
 * completion endpoint must sample, neither of which assay does. Every reply's
 * `prompt_n` is checked against the tokens it was meant to evaluate, so a
 * cache hit can never pass for a measured pass.
 *
 * Before the cell runs, `llama-bench -p 512 -n 0` gives the prefill rate
 * that llama.cpp's own users quote for this GGUF and thread count.
 */
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { ROOT } from "../src/config/index.js";

export interface LlamaBaseline {
  description: string;
  /** llama-bench's pp512 tokens/s for this GGUF and thread count (null when it failed). */
  pp512TokS: number | null;
  /** One causal pass of `tokens` from an empty context (the last token's logits computed); ms. */
  evaluate(tokens: number[]): Promise<number>;
  /**
   * The state read once and each question after it: evaluate `prefix`, then
   * each suffix with the prefix's KV reused (llama-server's prompt cache,
   * `cache_prompt`); ms for the whole request.
   */
  sharedPrefix(prefix: number[], suffixes: number[][]): Promise<number>;
  /**
   * One /completion of `tokens` as a client sees it (wall ms, HTTP and the one sampled token
   * included): for concurrent load on a server with several slots, where the server batches the
   * slots' prompts (continuous batching) and the clock that counts is the client's.
   */
  request(tokens: number[]): Promise<number>;
  close(): Promise<void>;
}

const BUILD_SCRIPT = path.join(ROOT, "scripts", "build-llama.mjs");
/**
 * The native llama.cpp's bin folder, as scripts/build-llama.mjs reports it on
 * stdout: the script pins the version, returns at once when its build is up
 * to date, and builds it otherwise (about 10 minutes on 2 cores).
 */
function ensureBuilt(): string {
  const r = spawnSync(process.execPath, [BUILD_SCRIPT], { stdio: ["ignore", "pipe", "inherit"], encoding: "utf8" });
  if (r.status !== 0) throw new Error(`scripts/build-llama.mjs failed (exit ${r.status ?? r.signal})`);
  const bin = r.stdout.trim().split("\n").at(-1) ?? "";
  if (!fs.existsSync(path.join(bin, "llama-server"))) throw new Error(`scripts/build-llama.mjs reported no llama-server in "${bin}"`);
  return bin;
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as net.AddressInfo).port;
      s.close(() => resolve(port));
    });
  });
}

function llamaBench(bin: string, gguf: string, threads: number): number | null {
  const r = spawnSync(path.join(bin, "llama-bench"), ["-m", gguf, "-t", String(threads), "-p", "512", "-n", "0", "-r", "3", "-o", "json"], {
    encoding: "utf8",
    maxBuffer: 16 << 20,
  });
  if (r.status !== 0) return null;
  try {
    const rows = JSON.parse(r.stdout) as { n_prompt: number; avg_ts: number }[];
    const row = rows.find((x) => x.n_prompt === 512);
    return row ? Math.round(row.avg_ts) : null;
  } catch {
    return null;
  }
}

interface Timings {
  prompt_n: number;
  prompt_ms: number;
}

/** `slots`: llama-server's parallel slots (`-np`, continuous batching on, its default), each with contextSize / slots tokens. */
export async function openLlama(opts: { gguf: string; threads: number; contextSize: number; slots?: number }): Promise<LlamaBaseline> {
  const slots = opts.slots ?? 1;
  if (!fs.existsSync(opts.gguf)) throw new Error(`GGUF file ${opts.gguf} does not exist (run npm start or npm test once to bootstrap it, or pass --gguf)`);
  const bin = ensureBuilt();
  const build = JSON.parse(fs.readFileSync(path.join(path.dirname(bin), "build.json"), "utf8")) as { key: string; llama_cpp_commit: string; compiler: string };
  const sdist = (JSON.parse(build.key) as { sdist: { name: string; version: string } }).sdist;
  const pp512TokS = llamaBench(bin, opts.gguf, opts.threads);
  const port = await freePort();
  const args = [
    "-m", opts.gguf,
    "--host", "127.0.0.1", "--port", String(port),
    "-t", String(opts.threads), "-tb", String(opts.threads),
    "-c", String(opts.contextSize), "-np", String(slots), "--cont-batching",
    // No host-memory prompt cache: a reused prefix comes only from the slot's own KV, as asked.
    "--cache-ram", "0",
    "--no-webui",
  ];
  const child: ChildProcess = spawn(path.join(bin, "llama-server"), args, { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  child.stderr!.on("data", (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-4000);
  });
  const base = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 120_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`llama-server exited (${child.exitCode}): ${stderr.slice(-800)}`);
    try {
      const r = await fetch(`${base}/health`);
      if (r.ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`llama-server did not become healthy in 120 s: ${stderr.slice(-800)}`);
    }
    await new Promise((r) => setTimeout(r, 250));
  }
  const props = (await (await fetch(`${base}/props`)).json()) as { default_generation_settings?: { n_ctx?: number } };

  /** `evaluated`: the prompt tokens the server must have evaluated, exactly or at most. */
  async function complete(tokens: number[], cachePrompt: boolean, evaluated: { exactly: number } | { atMost: number } | null): Promise<number> {
    const r = await fetch(`${base}/completion`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ prompt: tokens, n_predict: 1, cache_prompt: cachePrompt, temperature: 0, samplers: ["top_k"], top_k: 1 }),
    });
    const body = (await r.json()) as { timings?: Timings; error?: unknown };
    if (!r.ok || !body.timings) throw new Error(`llama-server /completion: HTTP ${r.status} ${JSON.stringify(body.error ?? body).slice(0, 300)}`);
    const t = body.timings;
    const bad = evaluated && ("exactly" in evaluated ? t.prompt_n !== evaluated.exactly : t.prompt_n > evaluated.atMost);
    if (bad) {
      throw new Error(`llama-server evaluated ${t.prompt_n} prompt tokens where ${JSON.stringify(evaluated)} were meant (a cache hit or miss where none was meant)`);
    }
    return t.prompt_ms;
  }

  return {
    description:
      `llama.cpp ${build.llama_cpp_commit} (${sdist.name} ${sdist.version} sdist) built from source, GGML_NATIVE=ON, Release, ${build.compiler}; ` +
      `llama-server, ${opts.threads} threads, context ${props.default_generation_settings?.n_ctx ?? opts.contextSize}${slots > 1 ? ` per slot, ${slots} slots, continuous batching` : ", 1 slot"}, default batch sizes; ` +
      `time = the server's prompt_ms` + (pp512TokS ? `; llama-bench pp512 ${pp512TokS} tok/s` : ""),
    pp512TokS,
    evaluate(tokens) {
      return complete(tokens, false, { exactly: tokens.length });
    },
    async sharedPrefix(prefix, suffixes) {
      // Leave the slot holding one token that shares nothing with the prefix, so the prefix is evaluated whole.
      await complete([prefix[0] === 0 ? 1 : 0], false, null);
      let ms = await complete(prefix, true, { exactly: prefix.length });
      for (const s of suffixes) ms += await complete([...prefix, ...s], true, { atMost: s.length });
      return ms;
    },
    async request(tokens) {
      const t = performance.now();
      await complete(tokens, false, { exactly: tokens.length });
      return performance.now() - t;
    },
    async close() {
      child.kill("SIGTERM");
      await new Promise((r) => (child.exitCode !== null ? r(null) : child.once("exit", r)));
    },
  };
}
