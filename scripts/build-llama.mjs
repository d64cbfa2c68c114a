#!/usr/bin/env node
// Builds the llama.cpp peer the way its users run it on a CPU server: from
// source, with the compiler tuned to this CPU (GGML_NATIVE=ON, Release). The
// source is the llama.cpp that the `llama-cpp-python` sdist on PyPI vendors
// (a registry package, pinned by version and SHA-256). Only the two tools the
// bench drives are built: `llama-server` (the baseline, fed assay's token ids)
// and `llama-bench` (the figure llama.cpp's own users quote).
//
// Output: .cache/llama.cpp/<version>-native/bin/{llama-server,llama-bench}
// plus build.json (version, flags, compiler, CPU). Git-ignored, never
// committed. A second run with nothing changed returns at once. Its stdout is
// the bin folder alone (everything else goes to stderr), so the bench asks
// this script where the build is instead of knowing the version itself.
//
// Node built-ins only, like bootstrap.mjs. Needs cmake and a C++17 compiler.
// Takes about 10 minutes on 2 cores.
import { spawnSync } from "node:child_process";
import crypto from "node:crypto";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");
const CACHE = process.env.ASSAY_CACHE_DIR ?? path.join(ROOT, ".cache");
// The sdist of llama-cpp-python 0.3.36 vendors llama.cpp at commit 0c1e570 (2026-10-01).
const SDIST = {
  name: "llama-cpp-python",
  version: "0.3.36",
  file: "llama_cpp_python-0.3.36.tar.gz",
  sha256: "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
};
const CMAKE_FLAGS = [
  "-DCMAKE_BUILD_TYPE=Release",
  "-DGGML_NATIVE=ON",
  "-DBUILD_SHARED_LIBS=OFF",
  "-DLLAMA_OPENSSL=OFF",
  "-DLLAMA_BUILD_TESTS=OFF",
  "-DLLAMA_BUILD_EXAMPLES=OFF",
  "-DLLAMA_BUILD_SERVER=ON",
  "-DLLAMA_BUILD_TOOLS=ON",
];
const TARGETS = ["llama-server", "llama-bench"];

const say = (msg) => console.error(`[build-llama] ${msg}`);
const dir = path.join(CACHE, "llama.cpp");
const out = path.join(dir, `${SDIST.version}-native`);
const bin = path.join(out, "bin");
const stampFile = path.join(out, "build.json");

function run(cmd, argv, opts = {}) {
  // The tools' own output goes to stderr: stdout carries only the bin folder.
  const r = spawnSync(cmd, argv, { stdio: ["inherit", 2, 2], ...opts });
  if (r.status !== 0) {
    say(`failed: ${cmd} ${argv.join(" ")} (exit ${r.status ?? r.signal})`);
    process.exit(r.status || 1);
  }
}

const sha256 = (f) => crypto.createHash("sha256").update(fs.readFileSync(f)).digest("hex");
const want = JSON.stringify({ sdist: SDIST, flags: CMAKE_FLAGS, targets: TARGETS });

if (fs.existsSync(stampFile) && TARGETS.every((t) => fs.existsSync(path.join(bin, t)))) {
  const stamp = JSON.parse(fs.readFileSync(stampFile, "utf8"));
  if (stamp.key === want) {
    say(`up to date: ${bin}`);
    process.stdout.write(`${bin}\n`);
    process.exit(0);
  }
}

fs.mkdirSync(dir, { recursive: true });
const tarball = path.join(dir, SDIST.file);
if (!fs.existsSync(tarball) || sha256(tarball) !== SDIST.sha256) {
  say(`pip download ${SDIST.name}==${SDIST.version} (sdist) ...`);
  const py = process.env.ASSAY_PYTHON ?? "python3";
  // With build isolation: pip reads an sdist's metadata through its build backend (scikit-build-core), which
  // a fresh machine's python lacks; isolated, pip fetches it from the same index for the download alone.
  run(py, ["-m", "pip", "download", "--disable-pip-version-check", "--no-deps", "--no-binary=:all:", "-d", dir, `${SDIST.name}==${SDIST.version}`]);
}
const got = sha256(tarball);
if (got !== SDIST.sha256) {
  say(`${SDIST.file}: SHA-256 ${got}, expected ${SDIST.sha256}; refusing to build it`);
  process.exit(1);
}

const srcRoot = path.join(dir, SDIST.file.replace(/\.tar\.gz$/, ""));
if (!fs.existsSync(path.join(srcRoot, "vendor", "llama.cpp", "CMakeLists.txt"))) {
  say(`extracting ${SDIST.file} ...`);
  run("tar", ["xzf", tarball, "-C", dir]);
}
const src = path.join(srcRoot, "vendor", "llama.cpp");
const build = path.join(dir, `build-${SDIST.version}`);
const jobs = String(Math.max(1, os.availableParallelism()));
say(`cmake ${CMAKE_FLAGS.join(" ")}`);
run("cmake", ["-S", src, "-B", build, ...CMAKE_FLAGS]);
say(`building ${TARGETS.join(", ")} with ${jobs} jobs (about 10 minutes on 2 cores) ...`);
run("cmake", ["--build", build, "--config", "Release", "-j", jobs, "--target", ...TARGETS]);

fs.mkdirSync(bin, { recursive: true });
for (const t of TARGETS) fs.copyFileSync(path.join(build, "bin", t), path.join(bin, t));
for (const t of TARGETS) fs.chmodSync(path.join(bin, t), 0o755);
const cxx = spawnSync("c++", ["--version"], { encoding: "utf8" }).stdout?.split("\n")[0] ?? "unknown";
const cpu = os.cpus()[0]?.model ?? "unknown";
fs.writeFileSync(
  stampFile,
  JSON.stringify({ key: want, llama_cpp_commit: "0c1e570", compiler: cxx, cpu, built_at: new Date().toISOString() }, null, 2) + "\n",
);
say(`done: ${bin}`);
process.stdout.write(`${bin}\n`);
