// The CUDA execution provider from PyPI alone: onnxruntime-gpu's provider library, at exactly
// onnxruntime-node's version, linked beside onnxruntime-node's own libonnxruntime (which opens its
// providers from its own folder), and the CUDA 13 runtime it links, from NVIDIA's wheels. Every
// wheel is pinned and hash-checked (pip --require-hashes), unpacked into the per-user cache
// (scripts/build-cache.mjs) and nothing is installed system-wide. The NVIDIA driver (libcuda.so.1,
// R580 or newer for CUDA 13) is the one part no wheel ships: it comes with the machine's GPU.
//
// The libraries must be on LD_LIBRARY_PATH before Node starts (a library opened later by dlopen
// from a worker is not found through a path set at run time): scripts/node.mjs puts
// `libraryPath()` in front of the caller's own where ASSAY_EXECUTION_PROVIDER=cuda.
//
//   node scripts/cuda-provider.mjs [--sets provider,load,run]   fetch and link (default: what a GPU run needs)
//   node scripts/cuda-provider.mjs --path                        print the folders the launcher adds
//   node scripts/cuda-provider.mjs --debian-driver               print a folder holding Debian's libcuda.so.1 (tests, dry runs)
//
// The sets: `provider` (onnxruntime-gpu's two libraries), `load` (what the provider links: cudart,
// cuBLAS, cuBLASLt, cuRAND; enough to reach the driver), `run` (what it opens lazily once a graph
// runs: cuDNN, for the norms' reductions and softmax, cuFFT, NVRTC and nvJitLink). Where
// ASSAY_CUDA_LIBS names a folder that already holds the CUDA 13 libraries (a PyTorch cu130
// install's site-packages/nvidia/cu13/lib, a system toolkit's lib64), only `provider` is fetched.
//
// Node built-ins only: the bootstrap imports this before node_modules exists.
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { cacheRoot, touchUsed } from "./build-cache.mjs";

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "..");

/** onnxruntime-node's version: the provider library must be built from the same onnxruntime. */
export const ORT_VERSION = "1.30.0";

/**
 * The wheels, pinned with their sha256. onnxruntime-gpu's wheel is per Python version; any one
 * holds the same two libraries, so the cp311 one is named whatever Python fetches it.
 * The runtime versions are the set `cuda-toolkit==13.0.2` pins; cuDNN the 9.x onnxruntime-gpu asks for.
 */
export const WHEELS = [
  { name: "onnxruntime-gpu", version: ORT_VERSION, set: "provider", sha256: "4fbf0c5d7b5fb99266c2e8a802e3e64af68bdc383e0f3c7349b985f1087eedaa",
    target: ["--python-version", "3.11", "--platform", "manylinux_2_28_x86_64"], files: /onnxruntime\/capi\/(libonnxruntime_providers_(cuda|shared)\.so)$/ },
  { name: "nvidia-cuda-runtime", version: "13.0.96", set: "load", sha256: "7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548" },
  { name: "nvidia-cublas", version: "13.1.0.3", set: "load", sha256: "ee8722c1f0145ab246bccb9e452153b5e0515fd094c3678df50b2a0888b8b171" },
  { name: "nvidia-curand", version: "10.4.0.35", set: "load", sha256: "1aee33a5da6e1db083fe2b90082def8915f30f3248d5896bcec36a579d941bfc" },
  { name: "nvidia-cudnn-cu13", version: "9.28.1.4", set: "run", sha256: "a54f205b1db1f2895d99f398754db1369816f0569dd459731f925635cf7b65ec" },
  { name: "nvidia-cufft", version: "12.0.0.61", set: "run", sha256: "6c44f692dce8fd5ffd3e3df134b6cdb9c2f72d99cf40b62c32dde45eea9ddad3" },
  { name: "nvidia-cuda-nvrtc", version: "13.0.88", set: "run", sha256: "ad9b6d2ead2435f11cbb6868809d2adeeee302e9bb94bcf0539c7a40d80e8575" },
  { name: "nvidia-nvjitlink", version: "13.0.88", set: "run", sha256: "13a74f429e23b921c1109976abefacc69835f2f433ebd323d3946e11d804e47b" },
];
export const SETS = ["provider", "load", "run"];
export const PROVIDER_LIBRARIES = ["libonnxruntime_providers_cuda.so", "libonnxruntime_providers_shared.so"];

/** The folder the unpacked libraries live in, keyed by the pins (a new pin is a new folder). */
export function cudaDir(env = process.env) {
  return path.join(cacheRoot(env), "cuda", `onnxruntime-gpu-${ORT_VERSION}-cu13`);
}

/** The folders the launcher puts in front of LD_LIBRARY_PATH: the caller's CUDA 13 libraries, then ours. */
export function libraryPath(env = process.env) {
  return [env.ASSAY_CUDA_LIBS, path.join(cudaDir(env), "lib")].filter(Boolean);
}

/** `env` with `libraryPath()` in front of its LD_LIBRARY_PATH, which is kept. */
export function withLibraryPath(env = process.env) {
  const own = (env.LD_LIBRARY_PATH ?? "").split(":").filter(Boolean);
  const ours = libraryPath(env).filter((d) => !own.includes(d));
  return { ...env, LD_LIBRARY_PATH: [...ours, ...own].join(":") };
}

/** onnxruntime-node's folder of native libraries on this platform. */
export function ortLibDir(root = ROOT) {
  return path.join(root, "node_modules", "onnxruntime-node", "bin", "napi-v6", process.platform, process.arch);
}

function setsDone(dir) {
  try {
    return new Set(fs.readFileSync(path.join(dir, ".assay-sets"), "utf8").split("\n").filter(Boolean));
  } catch {
    return new Set();
  }
}

/** The sets a caller needs: `run` where it will run graphs; nothing of the runtime where ASSAY_CUDA_LIBS has it. */
export function setsFor({ run, env = process.env }) {
  if (env.ASSAY_CUDA_LIBS) return ["provider"];
  return run ? ["provider", "load", "run"] : ["provider", "load"];
}

/**
 * Fetches the wheels of `sets` not yet unpacked (pip, hash-checked), unpacks their libraries into
 * cudaDir()/lib and drops the wheels. Returns the lib folder.
 */
export function ensureCudaLibraries({ sets, say, python = "python3", env = process.env }) {
  const dir = cudaDir(env);
  const lib = path.join(dir, "lib");
  const done = setsDone(dir);
  const missing = sets.filter((s) => !done.has(s));
  if (missing.length === 0) {
    touchUsed(dir);
    return lib;
  }
  const wheels = WHEELS.filter((w) => missing.includes(w.set));
  fs.mkdirSync(path.dirname(dir), { recursive: true });
  const tmp = fs.mkdtempSync(path.join(path.dirname(dir), ".partial-"));
  try {
    fs.mkdirSync(lib, { recursive: true });
    for (const w of wheels) {
      say(`fetching ${w.name}==${w.version} (hash-checked, ${w.set}) ...`);
      const req = path.join(tmp, `${w.name}.txt`);
      fs.writeFileSync(req, `${w.name}==${w.version} --hash=sha256:${w.sha256}\n`);
      const into = path.join(tmp, w.name);
      // --no-deps: each wheel of the set is pinned here; their own dependencies would pull unpinned versions.
      pip(python, ["download", "--no-deps", "--require-hashes", "--only-binary=:all:", ...(w.target ?? []), "-r", req, "-d", into, "--progress-bar", "off"]);
      const [wheel] = fs.readdirSync(into).filter((f) => f.endsWith(".whl"));
      if (!wheel) throw new Error(`pip downloaded no wheel of ${w.name}==${w.version}`);
      unpack(python, path.join(into, wheel), w.files ?? /^nvidia\/[^/]+\/lib\/([^/]+\.so[.\d]*)$/, lib);
      fs.rmSync(into, { recursive: true, force: true });
    }
    fs.writeFileSync(path.join(dir, ".assay-sets"), [...done, ...missing].join("\n") + "\n");
    touchUsed(dir);
  } finally {
    fs.rmSync(tmp, { recursive: true, force: true });
  }
  return lib;
}

function pip(python, argv) {
  const r = spawnSync(python, ["-m", "pip", ...argv], { stdio: ["ignore", "inherit", "inherit"] });
  if (r.status !== 0) throw new Error(`${python} -m pip ${argv.join(" ")} exited with ${r.status ?? r.signal}`);
}

/**
 * The members of a wheel (a zip) whose path matches `pattern`, each written to `into` under the name
 * its first group gives, through a partial file. Python's zipfile: the Python the bootstrap needs
 * anyway, where an `unzip` may not be installed.
 */
const UNPACK = `
import os, re, shutil, sys, zipfile
wheel, pattern, into = sys.argv[1], re.compile(sys.argv[2]), sys.argv[3]
found = 0
with zipfile.ZipFile(wheel) as z:
    for m in z.namelist():
        hit = pattern.search(m)
        if not hit:
            continue
        part = os.path.join(into, "." + hit.group(1) + ".partial")
        with z.open(m) as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(part, os.path.join(into, hit.group(1)))
        found += 1
sys.exit(0 if found else 3)
`;

function unpack(python, wheel, pattern, into) {
  const r = spawnSync(python, ["-c", UNPACK, wheel, pattern.source, into], { stdio: ["ignore", "inherit", "inherit"] });
  if (r.status === 3) throw new Error(`${path.basename(wheel)} holds no library matching ${pattern}`);
  if (r.status !== 0) throw new Error(`unpacking ${path.basename(wheel)} exited with ${r.status ?? r.signal}`);
}

/**
 * Links the provider libraries beside onnxruntime-node's libonnxruntime. A real file there is
 * onnxruntime-node's own CUDA 12 provider (ONNXRUNTIME_NODE_INSTALL=cuda12, from NuGet): it is
 * left alone, and that route is the one in use. Returns which route it is.
 */
export function linkProvider({ lib, ortDir = ortLibDir(), say }) {
  const pkg = path.join(ortDir, "..", "..", "..", "..", "package.json");
  const version = fs.existsSync(pkg) ? JSON.parse(fs.readFileSync(pkg, "utf8")).version : undefined;
  if (version && version !== ORT_VERSION) {
    throw new Error(`onnxruntime-node is ${version} but scripts/cuda-provider.mjs pins onnxruntime-gpu ${ORT_VERSION}: update the pins with the dependency`);
  }
  let route = "pypi";
  for (const f of PROVIDER_LIBRARIES) {
    const at = path.join(ortDir, f);
    const st = fs.lstatSync(at, { throwIfNoEntry: false });
    if (st && !st.isSymbolicLink()) {
      route = "nuget";
      continue;
    }
    const want = path.join(lib, f);
    if (st && fs.readlinkSync(at) === want) continue;
    fs.rmSync(at, { force: true });
    fs.symlinkSync(want, at);
  }
  if (route === "nuget") say(`onnxruntime-node's own CUDA provider is installed in ${ortDir} (ONNXRUNTIME_NODE_INSTALL): using it, not PyPI's`);
  return route;
}

/**
 * Debian's libcuda1 (the NVIDIA driver's user-space library, from non-free), unpacked into the
 * cache and never installed: what lets a machine without a GPU take the CUDA chain as far as the
 * driver's own answer (the tests, the device check's dry run). Its mirror is the one the machine's
 * apt already uses (scripts/mesa-vulkan.sh --mirror); the package lists go to a private folder.
 * Returns the folder that holds libcuda.so.1.
 */
export function ensureDebianDriver({ say, env = process.env }) {
  const dir = path.join(cacheRoot(env), "cuda", "debian-libcuda1");
  const lib = path.join(dir, "usr", "lib", "x86_64-linux-gnu", "nvidia", "current");
  if (fs.existsSync(path.join(lib, "libcuda.so.1"))) return lib;
  const uri = spawnSync("bash", [path.join(ROOT, "scripts", "mesa-vulkan.sh"), "--mirror"], { encoding: "utf8" }).stdout?.trim();
  if (!uri) throw new Error("no Debian mirror in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list to fetch libcuda1 from");
  const apt = fs.mkdtempSync(path.join(os.tmpdir(), "assay-apt-"));
  try {
    fs.mkdirSync(path.join(apt, "lists", "partial"), { recursive: true });
    fs.mkdirSync(path.join(apt, "parts"));
    fs.writeFileSync(path.join(apt, "parts", "non-free.sources"),
      `Types: deb\nURIs: ${uri}\nSuites: bookworm\nComponents: non-free\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n`);
    const o = ["-oDir::Etc::SourceList=/dev/null", `-oDir::Etc::SourceParts=${path.join(apt, "parts")}`, `-oDir::State::Lists=${path.join(apt, "lists")}`,
      "-oAPT::Architecture=amd64", "-oAPT::Architectures=amd64", "-oAPT::Sandbox::User=root", "-q"];
    say("fetching Debian's libcuda1 (non-free; unpacked into the cache, not installed) ...");
    for (const argv of [[...o, "update"], [...o, "download", "libcuda1"]]) {
      const r = spawnSync("apt-get", argv, { cwd: apt, stdio: ["ignore", "ignore", "inherit"] });
      if (r.status !== 0) throw new Error(`apt-get ${argv.at(-1)} libcuda1 exited with ${r.status}`);
    }
    const [deb] = fs.readdirSync(apt).filter((f) => f.startsWith("libcuda1_") && f.endsWith(".deb"));
    const part = `${dir}.partial`;
    fs.rmSync(part, { recursive: true, force: true });
    fs.mkdirSync(path.dirname(part), { recursive: true });
    const r = spawnSync("dpkg-deb", ["-x", path.join(apt, deb), part], { stdio: "inherit" });
    if (r.status !== 0) throw new Error(`dpkg-deb -x ${deb} exited with ${r.status}`);
    // The package ships the versioned file; the driver's installer makes the soname link.
    const plib = path.join(part, "usr", "lib", "x86_64-linux-gnu", "nvidia", "current");
    const [real] = fs.readdirSync(plib).filter((f) => /^libcuda\.so\.\d+\.\d+/.test(f));
    if (!fs.existsSync(path.join(plib, "libcuda.so.1"))) fs.symlinkSync(real, path.join(plib, "libcuda.so.1"));
    fs.rmSync(dir, { recursive: true, force: true });
    fs.renameSync(part, dir);
  } finally {
    fs.rmSync(apt, { recursive: true, force: true });
  }
  return lib;
}

/** What the bootstrap calls: the sets fetched, the provider linked. */
export function ensureCudaProvider({ run, say, python, env = process.env }) {
  const lib = ensureCudaLibraries({ sets: setsFor({ run, env }), say, python, env });
  return { lib, route: linkProvider({ lib, say }) };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const argv = process.argv.slice(2);
  const say = (m) => console.error(`[cuda-provider] ${m}`);
  if (argv.includes("--path")) {
    console.log(libraryPath().join(":"));
  } else if (argv.includes("--debian-driver")) {
    console.log(ensureDebianDriver({ say }));
  } else {
    const i = argv.indexOf("--sets");
    const sets = i >= 0 ? argv[i + 1].split(",") : setsFor({ run: true });
    const unknown = sets.filter((s) => !SETS.includes(s));
    if (unknown.length) throw new Error(`--sets: unknown ${unknown.join(", ")} (${SETS.join(", ")})`);
    const lib = ensureCudaLibraries({ sets, say, python: process.env.ASSAY_PYTHON ?? "python3" });
    linkProvider({ lib, say });
    say(`ready: ${lib}`);
  }
}
