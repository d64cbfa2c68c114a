/**
 * `assay build --from <checkpoint folder | file.gguf> --name NAME [--out DIR] [--cpu-only]`
 *
 * Turns a site's own weights into a build assay serves: every graph a shipped build has (the W8A8
 * `model.onnx`, its u8 x u8 twin, their batch graphs, the float32 GPU graph and its half-precision twin
 * for CUDA), the tokenizer and the manifest, written by the project's Python (scripts/, in the venv
 * `.cache/pyenv`; nothing is fetched from a model hub). The architecture, every shard and the tokenizer
 * are checked before any conversion work (scripts/decoder.py --check). Prints the models.json lines that
 * serve the build.
 */
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import type { Command } from "commander";
import { ROOT } from "../config/index.js";
import type { CliIO } from "./keys.js";

export interface BuildCliOptions {
  from: string;
  name: string;
  out?: string;
  /** The CPU graphs only: no GPU graphs (a CPU server never runs them). */
  cpuOnly?: boolean;
  /** Replace what is at --out. */
  force?: boolean;
}

/** Where a build goes without --out. */
export const LOCAL_BUILDS = path.join(ROOT, "models", "local");

const NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;

export function registerBuildCommand(program: Command, io: CliIO): void {
  program
    .command("build")
    .description("convert a Hugging Face checkpoint folder or a GGUF file into a build assay serves")
    .requiredOption("--from <path>", "a checkpoint folder (config.json, safetensors, tokenizer.json) or a .gguf file")
    .requiredOption("--name <name>", "the build's name in models.json")
    .option("--out <dir>", "where the build goes (default models/local/<name>)")
    .option("--cpu-only", "write the CPU graphs only, not the GPU graphs")
    .option("--force", "replace an existing build at --out")
    .action(async (opts: BuildCliOptions) => {
      await buildCommand(opts, io);
    });
}

/** Runs a command with its output on the CLI's stderr; rejects with `what` where it fails. */
function run(io: CliIO, cmd: string, args: string[], what: string, env: NodeJS.ProcessEnv = process.env): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { cwd: ROOT, env, stdio: ["ignore", "pipe", "pipe"] });
    child.stdout.on("data", (d: Buffer) => io.stderr(d.toString()));
    child.stderr.on("data", (d: Buffer) => io.stderr(d.toString()));
    child.on("error", (e) => reject(new Error(`${what}: ${e.message}`)));
    child.on("close", (code, signal) => (code === 0 ? resolve() : reject(new Error(`${what} failed (exit ${code ?? signal})`))));
  });
}

/** The converter's Python (the venv in the build cache, made where missing: the bootstrap's). */
function converterPython(io: CliIO): string {
  const py = path.join(ROOT, ".cache", "pyenv", "bin", "python");
  if (!fs.existsSync(py)) {
    io.stderr("assay build: making the converter's Python venv (once per machine) ...\n");
    const r = spawnSync(process.execPath, [path.join(ROOT, "scripts", "bootstrap.mjs"), "--no-build", "--no-models", "--venv"], {
      cwd: ROOT,
      stdio: ["ignore", "inherit", "inherit"],
    });
    if (r.status !== 0 || !fs.existsSync(py)) throw new Error("could not make the converter's Python venv (node scripts/bootstrap.mjs --venv)");
  }
  return py;
}

/** What `decoder.py --check` found, or the reason it refused the source (before any conversion work). */
function preflight(py: string, from: string): Record<string, unknown> {
  const r = spawnSync(py, [path.join(ROOT, "scripts", "decoder.py"), "--check", from], { cwd: ROOT, encoding: "utf8", env: offline() });
  if (r.status !== 0) throw new Error(`cannot build from ${from}: ${(r.stderr || r.stdout).trim().split("\n").at(-1) ?? `exit ${r.status}`}`);
  return JSON.parse(r.stdout.trim().split("\n").at(-1)!) as Record<string, unknown>;
}

const offline = (): NodeJS.ProcessEnv => ({ ...process.env, HF_HUB_OFFLINE: "1", TRANSFORMERS_OFFLINE: "1" });

/** The models.json entries that serve a build. */
export function modelsJsonLines(name: string, dir: string): string {
  return [
    `  "builds": { ..., ${JSON.stringify(name)}: { "dir": ${JSON.stringify(dir)} } }`,
    `  "models": { ..., ${JSON.stringify(name)}: { "family": "general", "build": ${JSON.stringify(name)} } }`,
  ].join("\n");
}

export async function buildCommand(opts: BuildCliOptions, io: CliIO): Promise<void> {
  if (!NAME.test(opts.name)) throw new Error(`--name ${JSON.stringify(opts.name)}: letters, digits, '.', '_' and '-' only, 64 at most`);
  const from = path.resolve(opts.from);
  if (!fs.existsSync(from)) throw new Error(`--from ${opts.from}: no such file or folder`);
  const out = path.resolve(opts.out ?? path.join(LOCAL_BUILDS, opts.name));
  if (fs.existsSync(out) && !opts.force) throw new Error(`${out} exists; pass --force to replace it, or another --out`);

  const py = converterPython(io);
  const found = preflight(py, from);
  io.stderr(`assay build: ${found["kind"]} of architecture ${String(found["architecture"])} at ${from}\n`);

  const tmp = `${out}.partial-${process.pid}`;
  fs.rmSync(tmp, { recursive: true, force: true });
  fs.mkdirSync(path.dirname(tmp), { recursive: true });
  const script = (f: string) => path.join(ROOT, "scripts", f);
  const source = JSON.stringify({ built_by: "assay build", from });
  const steps: [string, string[]][] = [
    ["the W8A8 graph, tokenizer and manifest", [script("export_onnx.py"), "--from", from, "--out", tmp, "--source", source]],
    ["the u8 x u8 graph", [script("int8_graphs.py"), "--build", tmp, "--variant", "u8u8"]],
    ["the batch graphs", [script("batch_graph.py"), "--build", tmp, "--from", from, "--graphs", "model.onnx", "model.u8u8.onnx"]],
  ];
  if (!opts.cpuOnly) {
    steps.push(["the float32 GPU graph", [script("gpu_graph.py"), "--build", tmp, "--from", from]]);
    steps.push(["the half-precision GPU graph (CUDA)", [script("half_graph.py"), "--build", tmp]]);
  }
  const t0 = Date.now();
  try {
    for (const [i, [what, args]] of steps.entries()) {
      io.stderr(`assay build: [${i + 1}/${steps.length}] ${what} ... (${Math.round((Date.now() - t0) / 1000)} s)\n`);
      await run(io, py, args, what, offline());
    }
    fs.rmSync(out, { recursive: true, force: true });
    fs.renameSync(tmp, out);
  } catch (e) {
    fs.rmSync(tmp, { recursive: true, force: true });
    throw e;
  }
  const manifest = JSON.parse(fs.readFileSync(path.join(out, "manifest.json"), "utf8")) as { build_hash: string; parameters: number };
  io.stdout(
    `built ${opts.name} (build ${manifest.build_hash}, ${(manifest.parameters / 1e9).toFixed(2)}B parameters) in ${out} ` +
      `in ${Math.round((Date.now() - t0) / 1000)} s\n` +
      `serve it: add to models.json (or a copy named by ASSAY_MODELS_CONFIG)\n${modelsJsonLines(opts.name, out)}\n` +
      `it answers uncalibrated until fitted: assay calibrate --model ${opts.name} --data bench/data/<set>.jsonl\n`,
  );
}
